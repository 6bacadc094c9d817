// Host registry (R-H1..R-H6): answers agent registrations (new epoch every time, attestation by
// core policy, READY only on a full match), accepts heartbeats and notices fenced by epoch (stale
// ones are counted and dropped), and turns reclaim notices and "Docker data dir lost" reports into
// host events by one core rule (host-notice.ts: data loss is DEAD at once, a notice is a drain).
// Any replica may serve these (NATS queue group): every write is compare-and-set.
// Leases (R-H4): registration decides the epoch's lease policy (fixed end reported by the host,
// renewable term from config; see hosts.ts) and an accepted heartbeat renews a renewable term.
import { jetstream } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import type { NatsConnection, Subscription } from '@nats-io/transport-node';
import { AgentSubjects, hostIdFromSubject } from '../core/agent-subjects.ts';
import {
  DOCKER_DATA_LOST_NOTICE,
  UNREGISTERED,
  checkFence,
  evaluateAttestation,
  hostEventForNotice,
  isHostId,
  nextEpoch,
  transitionHost,
  unwrap,
  type AttestationPolicy,
  type AttestationReason,
  type HostLifecycle,
  type RemovalSource,
} from '../core/index.ts';
import { ContainerState, Heartbeat, Registration, RegistrationAck, ReclaimNotice, type AttestationReport as ProtoAttestation } from '../gen/sandboxfleet/v1/agent.ts';
import { HostState } from '../gen/sandboxfleet/v1/common.ts';
import { isTerminal, listGroups } from './fleet.ts';
import { DEFAULT_BUCKETS } from '../store/connection.ts';
import { KvRepository } from '../store/kv-repository.ts';
import { HostLeasePolicySchema, applyHostEvent, leasePolicyFor, leaseTermEnd, recordLeasePolicy, renewLease, renewalFor, type HostLeasePolicy } from './hosts.ts';
import type { ContainerSnapshot, HostRecord } from './records.ts';
import { Keys, type ControlPlaneContext } from './state.ts';

const QUEUE = 'sf-control-plane';

/** Drain sources a re-registration must not forget (the host is still going away). */
const PLANNED_SOURCES: ReadonlySet<RemovalSource> = new Set(['operator_drain', 'operator_remove', 'node_deleted', 'node_cordoned', 'disruption_taint', 'spot_preemption', 'reclaim_notice', 'lease_ending']);

const PROTO_STATE: Record<HostLifecycle['state'], HostState> = {
  REGISTERING: HostState.REGISTERING,
  UNATTESTED: HostState.UNATTESTED,
  READY: HostState.READY,
  DRAINING: HostState.DRAINING,
  SUSPECT: HostState.SUSPECT,
  DEAD: HostState.DEAD,
  REMOVED: HostState.REMOVED,
};

export function policyFrom(ctx: ControlPlaneContext, buildSha: string | undefined): AttestationPolicy {
  const shas = ctx.config.allowedAgentShas.length > 0 ? ctx.config.allowedAgentShas : buildSha ? [buildSha] : [];
  return {
    allowedAgentShas: new Set(shas),
    apiSha: ctx.apiSha,
    allowedImageDigests: new Set(ctx.config.allowedImageDigests),
    allowedStorageDrivers: new Set(ctx.config.allowedStorageDrivers),
  };
}

function mismatchText(reason: AttestationReason, a: ProtoAttestation, policy: AttestationPolicy): string {
  switch (reason) {
    case 'agent_sha_unknown': return `agent_sha: ${a.agentBuildSha || '(empty)'} not in the allowed set`;
    case 'api_sha_mismatch': return `api_sha: expected ${policy.apiSha}, got ${a.apiSha || '(empty)'}`;
    case 'image_digest_not_allowed': return `image_digest: ${a.imageDigest || '(empty)'} not allowed`;
    case 'storage_driver_unsupported': return `storage_driver: ${a.storageDriver || '(empty)'} unsupported`;
    case 'bridge_version': return `bridge: proven version ${a.bridge?.helperOutput ?? ''} is not 4`;
    case 'bridge_unproven': return `bridge: helper output '${(a.bridge?.helperOutput ?? '').slice(0, 64)}' and label '${(a.bridge?.labelVersion ?? '').slice(0, 64)}' do not prove a version`;
  }
}

/** The sf_host_leases bucket (created by StateStore.open with the other buckets) as lease policies. */
export async function openLeasePolicies(nc: NatsConnection): Promise<KvRepository<HostLeasePolicy>> {
  const spec = DEFAULT_BUCKETS.hostLeases;
  const kv = await new Kvm(jetstream(nc)).open(spec.bucket, { allow_direct: false });
  return new KvRepository({ kv, bucket: spec.bucket, schema: HostLeasePolicySchema, maxRecordBytes: spec.maxRecordBytes });
}

export class HostRegistry {
  readonly #subs: Subscription[] = [];
  /** Per-host serialisation of heartbeat handling (ordering by sequence is checked anyway). */
  readonly #chains = new Map<string, Promise<void>>();
  #leases: Promise<KvRepository<HostLeasePolicy>> | undefined;
  /** Lease policy per host, of the latest epoch seen: immutable per epoch, so a cache is exact. */
  readonly #leaseCache = new Map<string, HostLeasePolicy>();

  /** `leases`: the sf_host_leases repository; when omitted, start() opens it on its connection. */
  constructor(
    private readonly ctx: ControlPlaneContext,
    private readonly policy: AttestationPolicy,
    leases?: KvRepository<HostLeasePolicy>,
  ) {
    if (leases !== undefined) this.#leases = Promise.resolve(leases);
  }

  #leaseRepo(): Promise<KvRepository<HostLeasePolicy>> {
    if (this.#leases === undefined) throw new Error('host registry has no lease repository: pass one or call start(nc) first');
    return this.#leases;
  }

  /** Subscribe to registrations, heartbeats and notices (queue group: one replica handles each). */
  start(nc: NatsConnection): void {
    this.#leases ??= openLeasePolicies(nc);
    const reg = nc.subscribe(AgentSubjects.register, { queue: QUEUE });
    const hb = nc.subscribe(AgentSubjects.allHeartbeats, { queue: QUEUE });
    const notices = nc.subscribe(AgentSubjects.allNotices, { queue: QUEUE });
    this.#subs.push(reg, hb, notices);
    void (async () => {
      for await (const m of reg) {
        try {
          const ack = await this.register(Registration.decode(m.data));
          m.respond(RegistrationAck.encode(ack).finish());
        } catch (err) {
          this.ctx.logger.warn({ err }, 'registration failed');
        }
      }
    })();
    void (async () => {
      for await (const m of hb) {
        const hostId = hostIdFromSubject(m.subject);
        if (hostId === undefined) continue;
        const prev = this.#chains.get(hostId) ?? Promise.resolve();
        const next = prev.then(async () => {
          try {
            await this.heartbeat(hostId, Heartbeat.decode(m.data));
          } catch (err) {
            this.ctx.logger.warn({ err, hostId }, 'heartbeat handling failed');
          }
        });
        this.#chains.set(hostId, next);
        void next.finally(() => { if (this.#chains.get(hostId) === next) this.#chains.delete(hostId); });
      }
    })();
    void (async () => {
      for await (const m of notices) {
        const hostId = hostIdFromSubject(m.subject);
        if (hostId === undefined) continue;
        try {
          await this.notice(hostId, ReclaimNotice.decode(m.data));
        } catch (err) {
          this.ctx.logger.warn({ err, hostId }, 'notice handling failed');
        }
      }
    })();
  }

  async stop(): Promise<void> {
    for (const s of this.#subs) s.unsubscribe();
    this.#subs.length = 0;
    await Promise.allSettled([...this.#chains.values()]);
  }

  /** R-H1, R-H2, R-H4, R-H6: a (re)registration always gets a new epoch. */
  async register(reg: Registration): Promise<RegistrationAck> {
    const { ctx } = this;
    const now = ctx.now();
    const refusedAck = (why: string): RegistrationAck => ({
      hostId: reg.hostId.slice(0, 253), admitted: false, state: HostState.UNATTESTED, hostEpoch: 0, leaseExpiresAtUnixMs: 0,
      refusalReasons: [why], mismatches: [why], heartbeatIntervalMs: ctx.config.heartbeatIntervalMs, ownedGroupIds: [],
    });
    // The one host-id rule (core ids.ts: a Kubernetes node name), the same the agent's subjects,
    // NATS permissions, KV keys and manifests are built by.
    if (!isHostId(reg.hostId)) return refusedAck('host_id_invalid');
    const a = reg.attestation;
    if (a === undefined) return refusedAck('attestation_missing');
    const verdict = evaluateAttestation({
      agentSha: a.agentBuildSha,
      apiSha: a.apiSha,
      dockerVersion: a.engineVersion,
      storageDriver: a.storageDriver,
      imageRef: a.imageRef,
      imageDigest: a.imageDigest,
      claimedBridgeVersion: a.bridge?.claimedVersion || undefined,
      helperVersionOutput: a.bridge?.helperOutput || undefined,
      imageLabelVersion: a.bridge?.labelVersion || undefined,
    }, this.policy);
    const reasons = verdict.verdict === 'refused' ? verdict.reasons : [];
    const mismatches = reasons.map((r) => mismatchText(r, a, this.policy));
    // R-H4: the term is the earlier of the host's fixed end (if any) and the renewable term.
    const leaseRepo = await this.#leaseRepo();
    const leaseDraft = leasePolicyFor(reg.hostId, 1, reg.requestedLeaseEndUnixMs, ctx.config.leaseTermMs, now);
    const leaseEnd = leaseTermEnd(leaseDraft, now);

    let before: HostLifecycle = UNREGISTERED;
    const written = await ctx.repos.hosts.mutate(Keys.host(reg.hostId), (current) => {
      before = current?.lifecycle ?? UNREGISTERED;
      const epoch = nextEpoch(before.epoch);
      let lc = unwrap(transitionHost(before, { type: 'registered', epoch }));
      lc = unwrap(transitionHost(lc, verdict.verdict === 'ready' ? { type: 'attestation_passed' } : { type: 'attestation_refused', reasons }));
      // An agent restart does not cancel a planned departure (R-H4, R-H5).
      if (lc.state === 'READY' && before.goingAway !== undefined && PLANNED_SOURCES.has(before.goingAway) && (before.state === 'DRAINING' || before.state === 'SUSPECT' || before.state === 'REGISTERING')) {
        lc = unwrap(transitionHost(lc, { type: 'drain_requested', source: before.goingAway }));
      }
      const record: HostRecord = {
        hostId: reg.hostId,
        lifecycle: lc,
        attestation: {
          agentSha: a.agentBuildSha.slice(0, 128),
          apiSha: a.apiSha.slice(0, 128),
          dockerVersion: a.engineVersion.slice(0, 64),
          storageDriver: a.storageDriver.slice(0, 64),
          imageRef: a.imageRef.slice(0, 512),
          imageDigest: a.imageDigest.slice(0, 128),
          ...(verdict.bridgeVersion !== undefined ? { bridgeVersion: verdict.bridgeVersion } : {}),
          mismatches: mismatches.map((m) => m.slice(0, 512)),
        },
        agentInstanceId: reg.agentInstanceId.slice(0, 128),
        registeredAtMs: now,
        ...(leaseEnd !== undefined ? { leaseExpiresAtMs: leaseEnd } : {}),
        maxMembers: Math.min(reg.capacity?.maxMembers ?? 0, 100_000),
        updatedAtMs: now,
      };
      return record;
    });
    const host = written?.value as HostRecord;
    const epoch = host.lifecycle.epoch;
    for (const r of reasons) ctx.metrics.attestationRefusals.inc({ reason: r });
    // The policy is stored before the ack: the agent only heartbeats with an epoch it was acked,
    // so every heartbeat that can renew finds its epoch's policy.
    const lease: HostLeasePolicy = { ...leaseDraft, epoch };
    await recordLeasePolicy(leaseRepo, lease);
    this.#leaseCache.set(reg.hostId, lease);
    await ctx.events.record({
      subjectKind: 'host', subjectId: reg.hostId, type: 'host_registered', fromState: before.state, toState: host.lifecycle.state,
      reason: reasons.length > 0 ? reasons.join(',') : 'attested', version: epoch,
      detail: { epoch, agentSha: host.attestation.agentSha, apiSha: host.attestation.apiSha, imageDigest: host.attestation.imageDigest, bridgeVersion: host.attestation.bridgeVersion ?? null, mismatches },
    });
    await ctx.events.record({
      subjectKind: 'host', subjectId: reg.hostId, type: 'host_lease_set', toState: host.lifecycle.state,
      reason: lease.fixedEndMs !== undefined ? (lease.renewTermMs > 0 ? 'fixed_and_renewable' : 'fixed') : lease.renewTermMs > 0 ? 'renewable' : 'no_term',
      version: epoch,
      detail: { epoch, termEndMs: host.leaseExpiresAtMs ?? null, fixedEndMs: lease.fixedEndMs ?? null, renewTermMs: lease.renewTermMs },
    });

    // R-H6: the host keeps only groups it still owns; it deletes containers of every other group.
    const owned = (await listGroups(ctx))
      .map((e) => e.value)
      .filter((g) => !isTerminal(g) && g.lifecycle.hostId === reg.hostId && g.evacuation?.kind !== 'unplanned')
      .map((g) => g.groupId);
    return {
      hostId: reg.hostId,
      admitted: host.lifecycle.state === 'READY' || host.lifecycle.state === 'DRAINING',
      state: PROTO_STATE[host.lifecycle.state],
      hostEpoch: epoch,
      leaseExpiresAtUnixMs: host.leaseExpiresAtMs ?? 0,
      refusalReasons: [...reasons],
      mismatches,
      heartbeatIntervalMs: ctx.config.heartbeatIntervalMs,
      ownedGroupIds: owned,
    };
  }

  /** R-H3, R-H6: accept a heartbeat only from the current epoch of a live host. */
  async heartbeat(subjectHostId: string, hb: Heartbeat): Promise<'accepted' | 'fenced' | 'stale'> {
    const { ctx } = this;
    if (hb.hostId !== subjectHostId) {
      ctx.metrics.fencedReports.inc({ kind: 'heartbeat' });
      return 'fenced';
    }
    const host = await this.#currentEpochHost(hb.hostId, hb.hostEpoch);
    if (host === undefined) {
      ctx.metrics.fencedReports.inc({ kind: 'heartbeat' });
      return 'fenced';
    }
    const now = ctx.now();
    const containers: ContainerSnapshot[] = (hb.inventory?.containers ?? []).slice(0, 2048).map((c) => ({
      containerId: c.containerId.slice(0, 128),
      groupId: c.groupId.slice(0, 256),
      memberId: c.memberId.slice(0, 128),
      generation: Math.max(0, c.placementGeneration),
      running: c.state === ContainerState.RUNNING,
      writableLayerPresent: c.writableLayerPresent,
      startedAtMs: Math.max(0, c.startedAtUnixMs),
    }));
    let stale = false;
    await ctx.repos.heartbeats.mutate(Keys.host(hb.hostId), (current) => {
      stale = current !== undefined && current.epoch === hb.hostEpoch && current.sequence >= hb.sequence;
      if (stale) return undefined;
      return {
        hostId: hb.hostId, epoch: hb.hostEpoch, sequence: hb.sequence, receivedAtMs: now,
        usedMembers: hb.capacity?.usedMembers ?? 0, maxMembers: hb.capacity?.maxMembers ?? 0, containers,
      };
    });
    if (stale) return 'stale';
    const epoch = hb.hostEpoch;
    if (host.lifecycle.state === 'SUSPECT') await applyHostEvent(ctx, hb.hostId, { type: 'heartbeat_resumed' }, 'heartbeat received', epoch);
    await this.#renew(host, epoch, now);
    // The heartbeat repeats what the notice subject announced once (R-H5), under the beat's epoch.
    const notice = hb.dockerDataLost ? DOCKER_DATA_LOST_NOTICE : hb.reclaimNotice?.source ?? '';
    if (notice !== '') {
      const { event, why } = hostEventForNotice(notice);
      await applyHostEvent(ctx, hb.hostId, event, why, epoch);
    }
    return 'accepted';
  }

  /**
   * The host record if `epoch` is its current epoch and that epoch is live, else undefined (R-H6):
   * an older or unknown epoch is fenced, and a DEAD/REMOVED epoch is revoked (the agent must
   * re-register). Every report from an agent — heartbeat or notice — passes this check.
   */
  async #currentEpochHost(hostId: string, epoch: number): Promise<HostRecord | undefined> {
    const host = await this.ctx.repos.hosts.get(Keys.host(hostId));
    if (host === undefined || !checkFence({ epoch }, { epoch: host.value.lifecycle.epoch }).ok) return undefined;
    const { state } = host.value.lifecycle;
    return state === 'DEAD' || state === 'REMOVED' ? undefined : host.value;
  }

  /** R-H4: an accepted heartbeat renews a renewable term (CAS; only when due, see renewalFor). */
  async #renew(host: HostRecord, epoch: number, now: number): Promise<void> {
    if (host.lifecycle.state !== 'READY' && host.lifecycle.state !== 'SUSPECT') return;
    let lease = this.#leaseCache.get(host.hostId);
    if (lease === undefined || lease.epoch !== epoch) {
      lease = (await (await this.#leaseRepo()).get(Keys.host(host.hostId)))?.value;
      // No policy for this epoch: keep the term set at registration (it lapses into a drain).
      if (lease === undefined || lease.epoch !== epoch) return;
      this.#leaseCache.set(host.hostId, lease);
    }
    // Cheap pre-check on the record already read; renewLease re-checks inside the CAS.
    if (renewalFor(lease, host.leaseExpiresAtMs, now) === undefined) return;
    await renewLease(this.ctx, host.hostId, lease, now);
  }

  /**
   * R-H5, R-H6: a notice from the current epoch of a live host is applied by its source (core
   * host-notice.ts): lost Docker data makes the host DEAD at once (unplanned: nothing there can be
   * stopped or checkpointed any more), spot/preemption and other notices start a planned drain. A
   * notice from a revoked or unknown epoch is rejected and counted; the epoch is checked again
   * inside the CAS, so a re-registration landing in between wins.
   */
  async notice(hostId: string, notice: ReclaimNotice): Promise<'applied' | 'unchanged' | 'fenced'> {
    const host = await this.#currentEpochHost(hostId, notice.hostEpoch);
    if (host === undefined) {
      this.ctx.metrics.fencedReports.inc({ kind: 'notice' });
      return 'fenced';
    }
    const { event, why } = hostEventForNotice(notice.source);
    return (await applyHostEvent(this.ctx, hostId, event, why, notice.hostEpoch)) !== undefined ? 'applied' : 'unchanged';
  }

  /** Operator drain / remove (R-H5). `remove` also ends the epoch once the host holds nothing. */
  async drain(hostId: string, source: RemovalSource = 'operator_drain'): Promise<boolean> {
    return (await applyHostEvent(this.ctx, hostId, { type: 'drain_requested', source }, source)) !== undefined;
  }
}
