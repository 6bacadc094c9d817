// Host registry (R-H1..R-H6): answers agent registrations (new epoch every time, attestation by
// core policy, READY only on a full match), accepts heartbeats and notices fenced by epoch, and
// turns reclaim notices and "Docker data dir lost" reports into host events by one core rule
// (host-notice.ts: data loss is DEAD at once, a notice is a drain). Registrations and notices go
// to any one replica (NATS queue group); every write is compare-and-set.
// Heartbeats go to EVERY replica and live in memory (the read model, fleet-state.ts): a heartbeat
// costs a decode and a map update, and writes only what changes the host's state (a SUSPECT host
// heard again, a lease renewal due, a notice not yet applied). Replicas may race on such a write;
// each is a compare-and-set that re-checks the need inside, so the loser writes nothing. Nomad
// keeps heartbeat TTLs in memory for the same reason: 1,000 hosts beating every 2 s would otherwise
// be 500 fsynced writes a second that say nothing new. A beat of a host's live epoch (as the read
// model knows it) is recorded as it arrives; only the writes it calls for wait, one host's at a time,
// and beats arriving meanwhile coalesce into the newest one, so a slow write neither delays liveness
// nor builds a backlog. A beat the model cannot judge (an epoch it has not seen yet, an unknown or
// fenced host) takes the same per-host path, with its store check.
// A heartbeat carries the host's whole inventory (every member container, stopped ones too), which
// rarely changes between beats; decoding it was most of a heartbeat's cost (bench/scale: 100
// containers per host, 1,000 hosts every 2 s: ~0.15 ms per heartbeat, ~8% of a core, plus the garbage).
// The container entries' bytes are compared with the host's previous ones and, when identical,
// their earlier decoding is reused (identical bytes decode to identical values); everything else in
// the message is decoded every time, and any unusual message shape takes the plain full decode.
// Agents go further and leave unchanged entries out of most beats, naming them by their SHA-256
// (host-agent/inventory-elision.ts): the entries held under that digest (computed here, never
// taken from the agent) are reused, and a beat naming entries this replica does not hold records
// none — unknown, not "gone" — until the next beat that carries them (at least every 15th). Such a
// beat is told apart by one scan of its top-level fields (wire/heartbeat-bytes.ts) and decoded
// whole, being small. A beat that calls for no write (the usual one: a READY host, its lease not
// due, no notice) is done once it is in memory; it starts no per-host write task.
// A fenced report (an epoch that is not the host's live one: a zombie back from a freeze or a
// partition) is counted, recorded as an event and answered with a FencedNotice: the agent stops
// taking commands of that epoch and registers again (R-H6).
// A (re)registering host names the group copies it holds; each gets a verdict read from the
// group's own record (core host-copy.ts): deleted only on positive proof, never because a group is
// missing from a listing (R-R6).
// Leases (R-H4): registration decides the epoch's lease policy (fixed end reported by the host,
// renewable term from config; see hosts.ts) and an accepted heartbeat renews a renewable term.
import { createHash } from 'node:crypto';
import { jetstream } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import type { NatsConnection, Subscription } from '@nats-io/transport-node';
import { AgentSubjects, hostIdFromSubject } from '../core/agent-subjects.ts';
import {
  DOCKER_DATA_LOST_NOTICE,
  UNREGISTERED,
  checkFence,
  decideHostCopy,
  evaluateAttestation,
  hostEventForNotice,
  isHostId,
  nextEpoch,
  transitionHost,
  unwrap,
  type AttestationPolicy,
  type AttestationReason,
  type CopyVerdict,
  type FencedNoticeReason,
  type GroupRecordView,
  type HostLifecycle,
  type RemovalSource,
} from '../core/index.ts';
import { AgentCommand, ContainerState, CopyAction, Heartbeat, Inventory, Registration, RegistrationAck, ReclaimNotice, type ContainerInfo, type CopyVerdict as ProtoCopyVerdict, type AttestationReport as ProtoAttestation } from '../gen/sandboxfleet/v1/agent.ts';
import { HostState } from '../gen/sandboxfleet/v1/common.ts';
import { DEFAULT_BUCKETS } from '../store/connection.ts';
import { RecordInvalidError } from '../store/errors.ts';
import { KvRepository } from '../store/kv-repository.ts';
import { omitsContainers, splitInventory } from '../wire/heartbeat-bytes.ts';
import { HostLeasePolicySchema, applyHostEvent, leasePolicyFor, leaseTermEnd, recordLeasePolicy, renewLease, renewalFor, type HostLeasePolicy } from './hosts.ts';
import type { ContainerSnapshot, HeartbeatRecord, HostRecord } from './records.ts';
import { Keys, type ControlPlaneDeps } from './state.ts';

export type HostRegistryDeps = Pick<ControlPlaneDeps, 'config' | 'fleet' | 'hosts' | 'groups' | 'events' | 'metrics' | 'logger' | 'now' | 'apiSha'>;

/** Most group copies one registration may name (a host holds at most its member capacity). */
export const MAX_GROUP_COPIES = 4096;
/** A fenced host is told (and the fence recorded as an event) at most this often. */
const FENCED_NOTICE_INTERVAL_MS = 5_000;

const QUEUE = 'sf-control-plane';
/** Hosts whose last inventory is remembered for reuse (the oldest is forgotten first). */
const MAX_REMEMBERED_INVENTORIES = 10_000;
/** Most container entries a heartbeat's snapshot keeps (R-H3 bounds). */
const MAX_CONTAINERS = 2048;

/** A host's last decoded inventory: its container entries as they arrived, and what they decode to. */
interface RememberedInventory {
  readonly bytes: Uint8Array;
  /** SHA-256 of `bytes`: a beat that leaves its containers out names them by it. */
  readonly digest: Buffer;
  readonly containers: ContainerInfo[];
  /** The bounded snapshots of `containers`, made at the first heartbeat that used them. */
  snapshots?: ContainerSnapshot[];
}

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

export function policyFrom(ctx: Pick<ControlPlaneDeps, 'config' | 'apiSha'>, buildSha: string | undefined): AttestationPolicy {
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

/** The notice a heartbeat repeats (R-H5): lost Docker data, else its reclaim notice's source; '' for none. */
function noticeOf(hb: Heartbeat): string {
  return hb.dockerDataLost ? DOCKER_DATA_LOST_NOTICE : hb.reclaimNotice?.source ?? '';
}

/** A heartbeat waiting for its per-host writes; `recorded` when it is already in the read model. */
interface PendingBeat {
  readonly beat: Heartbeat;
  readonly recorded: boolean;
}

export class HostRegistry {
  readonly #subs: Subscription[] = [];
  /** Per host, the newest heartbeat whose writes have not started (older ones are superseded). */
  readonly #pendingBeats = new Map<string, PendingBeat>();
  /** Hosts whose heartbeat writes are being handled (one at a time per host). */
  readonly #writing = new Set<string>();
  readonly #writers = new Set<Promise<void>>();
  #leases: Promise<KvRepository<HostLeasePolicy>> | undefined;
  /** Lease policy per host, of the latest epoch seen: immutable per epoch, so a cache is exact. */
  readonly #leaseCache = new Map<string, HostLeasePolicy>();
  /** When each fenced host was last told (and its fence recorded). */
  readonly #fencedAt = new Map<string, number>();
  /** Per host (by subject), its last inventory: reused while the next ones repeat its bytes. */
  readonly #inventories = new Map<string, RememberedInventory>();
  /** Host ids of the heartbeat subjects seen (valid ones only), bounded like #inventories. */
  readonly #subjectHosts = new Map<string, string>();
  #nc: NatsConnection | undefined;

  /** `leases`: the sf_host_leases repository; when omitted, start() opens it on its connection. */
  constructor(
    private readonly ctx: HostRegistryDeps,
    private readonly policy: AttestationPolicy,
    leases?: KvRepository<HostLeasePolicy>,
  ) {
    if (leases !== undefined) this.#leases = Promise.resolve(leases);
  }

  #leaseRepo(): Promise<KvRepository<HostLeasePolicy>> {
    if (this.#leases === undefined) throw new Error('host registry has no lease repository: pass one or call start(nc) first');
    return this.#leases;
  }

  /**
   * Subscribe to registrations, heartbeats and notices (queue group: one replica handles each).
   * Heartbeats are taken in on `heartbeatNc` when given (its own connection, read in batches).
   */
  start(nc: NatsConnection, heartbeatNc: NatsConnection = nc): void {
    this.#leases ??= openLeasePolicies(nc);
    this.#nc = nc;
    const reg = nc.subscribe(AgentSubjects.register, { queue: QUEUE });
    // No queue group: every replica keeps every host's latest heartbeat in its read model. A callback,
    // not an async iterator: 500 beats a second each handled at once, without a promise per beat.
    // Nothing may throw out of it: the error would surface in the connection's own reading.
    const hb = heartbeatNc.subscribe(AgentSubjects.allHeartbeats, { callback: (err, m) => {
      if (err !== null) return;
      try {
        this.#onHeartbeat(m.subject, m.data);
      } catch (error) {
        this.ctx.logger.warn({ err: error }, 'heartbeat handling failed');
      }
    } });
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

  /** One heartbeat as it arrives: decoded, recorded in the read model when live, its writes queued. */
  #onHeartbeat(subject: string, data: Uint8Array): void {
    const hostId = this.#hostIdOf(subject);
    if (hostId === undefined) return;
    let beat: Heartbeat;
    try {
      beat = this.decodeHeartbeat(hostId, data);
    } catch (err) {
      this.ctx.metrics.fencedReports.inc({ kind: 'heartbeat' });
      this.ctx.logger.warn({ err, hostId }, 'undecodable heartbeat dropped');
      return;
    }
    // A beat of the live epoch is in memory now; what it calls for is written per host, coalesced.
    const recorded = this.#recordIfLive(hostId, beat);
    if (recorded === 'stale') return;
    // The usual beat calls for no write at all, and costs no per-host write task either.
    if (recorded !== undefined && !this.#writesDue(recorded.host, beat)) return;
    this.#queueWrites(hostId, { beat, recorded: recorded !== undefined });
  }

  async stop(): Promise<void> {
    for (const s of this.#subs) s.unsubscribe();
    this.#subs.length = 0;
    this.#pendingBeats.clear();
    await Promise.allSettled([...this.#writers]);
  }

  /**
   * Record `hb` in the read model now when the model shows its epoch as the host's live one;
   * undefined when the model cannot tell (the per-host path checks the store and fences).
   */
  #recordIfLive(subjectHostId: string, hb: Heartbeat): { host: HostRecord } | 'stale' | undefined {
    if (hb.hostId !== subjectHostId) return undefined;
    const host = this.ctx.fleet.host(Keys.host(subjectHostId))?.value;
    if (host === undefined || host.lifecycle.epoch !== hb.hostEpoch || host.lifecycle.state === 'DEAD' || host.lifecycle.state === 'REMOVED') return undefined;
    return this.#record(subjectHostId, hb) === 'stale' ? 'stale' : { host };
  }

  /**
   * Could the accepted beat `hb` of `host` (the model's record, of the beat's epoch) call for a
   * write (#writesFor)? Judged in memory, the same tests #writesFor makes: a SUSPECT host, a notice,
   * a READY host whose renewal is due. A lease policy not cached yet says yes (it is read there).
   */
  #writesDue(host: HostRecord, hb: Heartbeat): boolean {
    const { state, epoch } = host.lifecycle;
    if (state === 'SUSPECT' || noticeOf(hb) !== '') return true;
    if (state !== 'READY') return false;
    const lease = this.#leaseCache.get(host.hostId);
    return lease === undefined || lease.epoch !== epoch || renewalFor(lease, host.leaseExpiresAtMs, this.ctx.now()) !== undefined;
  }

  /** The host id of a per-host subject; parsed once per subject, as every beat of a host repeats it. */
  #hostIdOf(subject: string): string | undefined {
    const cached = this.#subjectHosts.get(subject);
    if (cached !== undefined) return cached;
    const hostId = hostIdFromSubject(subject);
    if (hostId === undefined) return undefined;
    this.#subjectHosts.set(subject, hostId);
    if (this.#subjectHosts.size > MAX_REMEMBERED_INVENTORIES) this.#subjectHosts.delete(this.#subjectHosts.keys().next().value as string);
    return hostId;
  }

  #record(subjectHostId: string, hb: Heartbeat): 'accepted' | 'stale' {
    // Containers left out and not held (decodeHeartbeat) are recorded as none listed, which proves
    // nothing: heartbeat evidence is only ever used to say "yes, still running" (liveEvidence).
    const record: HeartbeatRecord = {
      hostId: hb.hostId, epoch: hb.hostEpoch, sequence: hb.sequence, receivedAtMs: this.ctx.now(),
      usedMembers: hb.capacity?.usedMembers ?? 0, maxMembers: hb.capacity?.maxMembers ?? 0, containers: this.#snapshots(subjectHostId, hb),
    };
    return this.ctx.fleet.recordHeartbeat(record);
  }

  /** Hand `pending` to the host's writer: the newest pending beat replaces an older one not started yet. */
  #queueWrites(hostId: string, pending: PendingBeat): void {
    this.#pendingBeats.set(hostId, pending);
    if (this.#writing.has(hostId)) return;
    this.#writing.add(hostId);
    const writer = this.#writeBeats(hostId);
    this.#writers.add(writer);
    void writer.finally(() => this.#writers.delete(writer));
  }

  async #writeBeats(hostId: string): Promise<void> {
    try {
      for (let p = this.#pendingBeats.get(hostId); p !== undefined; p = this.#pendingBeats.get(hostId)) {
        this.#pendingBeats.delete(hostId);
        try {
          if (p.recorded) await this.#afterAccepted(hostId, p.beat);
          else await this.heartbeat(hostId, p.beat);
        } catch (err) {
          this.ctx.logger.warn({ err, hostId }, 'heartbeat handling failed');
        }
      }
    } finally {
      // No await between the last look at #pendingBeats and this: a beat queued later starts a writer.
      this.#writing.delete(hostId);
    }
  }

  /** R-H1, R-H2, R-H4, R-H6: a (re)registration always gets a new epoch. */
  async register(reg: Registration): Promise<RegistrationAck> {
    const { ctx } = this;
    const now = ctx.now();
    const refusedAck = (why: string): RegistrationAck => ({
      hostId: reg.hostId.slice(0, 253), admitted: false, state: HostState.UNATTESTED, hostEpoch: 0, leaseExpiresAtUnixMs: 0,
      refusalReasons: [why], mismatches: [why], heartbeatIntervalMs: ctx.config.heartbeatIntervalMs, copyVerdicts: [],
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
    const written = await ctx.hosts.transact(reg.hostId, (current) => {
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
      return { record };
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

    // R-H6, R-R6: a verdict per group copy the host holds, from that group's own record. Only an
    // admitted host cleans up (an unattested one never wipes native state).
    const admitted = host.lifecycle.state === 'READY' || host.lifecycle.state === 'DRAINING';
    const copyVerdicts = admitted ? await this.#copyVerdicts(reg.hostId, epoch, reg.groupCopies) : [];
    this.#fencedAt.delete(reg.hostId);
    return {
      hostId: reg.hostId,
      admitted: host.lifecycle.state === 'READY' || host.lifecycle.state === 'DRAINING',
      state: PROTO_STATE[host.lifecycle.state],
      hostEpoch: epoch,
      leaseExpiresAtUnixMs: host.leaseExpiresAtMs ?? 0,
      refusalReasons: [...reasons],
      mismatches,
      heartbeatIntervalMs: ctx.config.heartbeatIntervalMs,
      copyVerdicts,
    };
  }

  /**
   * The verdict on each group copy a registering host holds (core decideHostCopy): read by key from
   * the store — a record that is absent or unreadable keeps the copy. Verdicts other than a plain
   * "owned" are counted and recorded.
   */
  async #copyVerdicts(hostId: string, epoch: number, copies: readonly { groupId: string; maxGeneration: number }[]): Promise<ProtoCopyVerdict[]> {
    const { ctx } = this;
    const now = ctx.now();
    const out: ProtoCopyVerdict[] = [];
    for (const copy of copies.slice(0, MAX_GROUP_COPIES)) {
      const groupId = copy.groupId.slice(0, 256);
      let view: GroupRecordView;
      try {
        const g = await ctx.groups.get(groupId);
        view = g === undefined ? { kind: 'absent' } : { kind: 'present', lifecycle: g.value.lifecycle, lostAtMs: g.value.lostAtMs };
      } catch (err) {
        if (!(err instanceof RecordInvalidError)) {
          // A read that failed proves nothing either: keep, and say so.
          ctx.logger.warn({ err, hostId, groupId }, 'group record unreadable while judging a host copy: kept');
        }
        view = { kind: 'unreadable' };
      }
      const verdict: CopyVerdict = decideHostCopy(view, { hostId, generation: Math.max(0, copy.maxGeneration) }, now, ctx.config.lostRetentionMs);
      ctx.metrics.hostCopyVerdicts.inc({ action: verdict.action, reason: verdict.reason });
      if (verdict.reason !== 'owned') {
        await ctx.events.record({
          subjectKind: 'group', subjectId: groupId, type: 'host_copy_judged', reason: verdict.reason, version: `${hostId}:${epoch}:${verdict.action}`,
          detail: { hostId, epoch, action: verdict.action, copyGeneration: copy.maxGeneration },
        });
      }
      out.push({
        groupId,
        action: verdict.action === 'delete' ? CopyAction.DELETE : verdict.action === 'stop' ? CopyAction.STOP : CopyAction.KEEP,
        reason: verdict.reason,
        upToGeneration: verdict.action === 'delete' ? verdict.upToGeneration : 0,
      });
    }
    return out;
  }

  /**
   * `Heartbeat.decode(data)`, reusing the decoded containers of `hostId`'s previous heartbeat when
   * this one's container entries are byte for byte the same (the usual case: an inventory changes
   * when a container does), or when the agent left them out and named them by the digest of the
   * entries remembered (inventory-elision.ts). The rest of the message — and the inventory's other
   * fields — is decoded from its own bytes each time, so the result equals a full decode of the
   * beat as the agent would have sent it in full. A beat that left out entries this replica does not
   * hold keeps an empty container list, which `#record` reports as unknown. A message whose shape the
   * fast path does not handle (no inventory or several, groups, malformed data) is decoded in full,
   * which also decides whether it is undecodable.
   */
  decodeHeartbeat(hostId: string, data: Uint8Array): Heartbeat {
    const known = this.#inventories.get(hostId);
    // Most beats leave the entries out: nothing to split or compare, the whole message is small. The
    // scan only spares the split; the full decode decides (the two may read damaged bytes apart).
    if (omitsContainers(data)) {
      const beat = Heartbeat.decode(data);
      if (beat.containersOmitted) return this.#omitted(beat, known);
    }
    const split = splitInventory(data);
    if (split !== undefined && known !== undefined && split.containers.length > 0 && Buffer.compare(split.containers, known.bytes) === 0) {
      const beat = Heartbeat.decode(split.rest);
      beat.inventory = { ...Inventory.decode(split.inventoryRest), containers: known.containers };
      this.ctx.metrics.heartbeatContainers.inc({ how: 'repeated' });
      return beat;
    }
    const beat = Heartbeat.decode(data);
    // The scan above gives up on shapes it does not handle; the full decode still has the last word.
    if (beat.containersOmitted) return this.#omitted(beat, known);
    if (split !== undefined && beat.inventory !== undefined) {
      const digest = createHash('sha256').update(split.containers).digest();
      // The agent's digest of the same entries must be ours, or its later omissions could name
      // entries we do not hold: such a host is not remembered (its beats then cost a full decode).
      this.#inventories.delete(hostId);
      if (beat.containersDigest.length === 0 || digest.equals(beat.containersDigest)) {
        // A copy: the message's bytes may share a larger read buffer.
        this.#inventories.set(hostId, { bytes: split.containers.slice(), digest, containers: beat.inventory.containers });
        if (this.#inventories.size > MAX_REMEMBERED_INVENTORIES) this.#inventories.delete(this.#inventories.keys().next().value as string);
      } else {
        this.ctx.logger.warn({ hostId }, 'heartbeat containers digest differs from the control plane\'s own: not remembered');
      }
    }
    this.ctx.metrics.heartbeatContainers.inc({ how: 'decoded' });
    return beat;
  }

  /** A beat that left its container entries out: the ones held under its digest, or none (unknown). */
  #omitted(beat: Heartbeat, known: RememberedInventory | undefined): Heartbeat {
    const reused = beat.inventory !== undefined && beat.inventory.containers.length === 0 && known !== undefined && known.digest.equals(beat.containersDigest);
    // Entries sent along with the flag anyway are not trusted either way: unknown is unknown.
    if (beat.inventory !== undefined) beat.inventory = { ...beat.inventory, containers: reused ? known!.containers : [] };
    this.ctx.metrics.heartbeatContainers.inc({ how: reused ? 'reused' : 'unknown' });
    return beat;
  }

  /** The bounded snapshots of a heartbeat's containers; made once per remembered inventory. */
  #snapshots(hostId: string, hb: Heartbeat): ContainerSnapshot[] {
    const reported = hb.inventory?.containers ?? [];
    const known = this.#inventories.get(hostId);
    const same = known !== undefined && known.containers === reported;
    if (same && known.snapshots !== undefined) return known.snapshots;
    const snapshots = reported.slice(0, MAX_CONTAINERS).map((c) => ({
      containerId: c.containerId.slice(0, 128),
      groupId: c.groupId.slice(0, 256),
      memberId: c.memberId.slice(0, 128),
      generation: Math.max(0, c.placementGeneration),
      running: c.state === ContainerState.RUNNING,
      writableLayerPresent: c.writableLayerPresent,
      startedAtMs: Math.max(0, c.startedAtUnixMs),
    }));
    if (same) known.snapshots = snapshots;
    return snapshots;
  }

  /**
   * R-H3, R-H6: accept a heartbeat only from the current epoch of a live host. Accepted beats go to
   * the read model, then what they change is written (SUSPECT → READY, a lease renewal, a notice).
   * A fenced beat is counted, recorded and answered with a FencedNotice.
   */
  async heartbeat(subjectHostId: string, hb: Heartbeat): Promise<'accepted' | 'fenced' | 'stale'> {
    const { ctx } = this;
    if (hb.hostId !== subjectHostId) {
      ctx.metrics.fencedReports.inc({ kind: 'heartbeat' });
      return 'fenced';
    }
    const fence = await this.#fence(hb.hostId, hb.hostEpoch);
    if (!fence.ok) {
      ctx.metrics.fencedReports.inc({ kind: 'heartbeat' });
      await this.#fenced(hb.hostId, hb.hostEpoch, fence.host, 'heartbeat');
      return 'fenced';
    }
    if (this.#record(subjectHostId, hb) === 'stale') return 'stale';
    await this.#writesFor(fence.host, hb);
    return 'accepted';
  }

  /** The writes of a beat recorded on arrival, against the host's record as the model holds it now. */
  async #afterAccepted(hostId: string, hb: Heartbeat): Promise<void> {
    const fence = await this.#fence(hostId, hb.hostEpoch);
    // Re-registered or declared dead since: that beat's epoch calls for nothing any more.
    if (!fence.ok) return;
    await this.#writesFor(fence.host, hb);
  }

  /** What an accepted beat changes: SUSPECT → READY, a lease renewal when due, a notice not applied yet. */
  async #writesFor(host: HostRecord, hb: Heartbeat): Promise<void> {
    const { ctx } = this;
    const now = ctx.now();
    const epoch = hb.hostEpoch;
    if (host.lifecycle.state === 'SUSPECT') await applyHostEvent(ctx.hosts, hb.hostId, { type: 'heartbeat_resumed' }, 'heartbeat received', epoch);
    await this.#renew(host, epoch, now);
    // The heartbeat repeats what the notice subject announced once (R-H5), under the beat's epoch.
    const notice = noticeOf(hb);
    if (notice !== '') {
      const { event, why } = hostEventForNotice(notice);
      // Only a change is written: a drain already under way is not rewritten on every beat.
      const next = transitionHost(host.lifecycle, event);
      if (next.ok && JSON.stringify(next.value) !== JSON.stringify(host.lifecycle)) await applyHostEvent(ctx.hosts, hb.hostId, event, why, epoch);
    }
  }

  /**
   * Is `epoch` the live epoch of `hostId` (R-H6)? Judged on the read model, which never runs ahead of
   * the store: an epoch older than the model's is stale for sure. An epoch the model has not seen yet
   * (a registration that has only just landed) is checked against the store before anything is
   * fenced. An older or unknown epoch is fenced, and a DEAD/REMOVED epoch is revoked.
   */
  async #fence(hostId: string, epoch: number): Promise<{ ok: true; host: HostRecord } | { ok: false; host: HostRecord | undefined }> {
    let host = this.ctx.fleet.host(Keys.host(hostId))?.value;
    if (host === undefined || epoch > host.lifecycle.epoch) host = (await this.ctx.hosts.get(hostId))?.value;
    if (host === undefined || !checkFence({ epoch }, { epoch: host.lifecycle.epoch }).ok) return { ok: false, host };
    const { state } = host.lifecycle;
    return state === 'DEAD' || state === 'REMOVED' ? { ok: false, host } : { ok: true, host };
  }

  /**
   * A report of `hostId` at `epoch` was fenced: record it (an event, not only a metric; the event id
   * is the same from every replica within a minute, so the log keeps one) and tell the agent, at
   * most every few seconds per host, so a zombie registers again instead of beating into the void
   * while its stale containers run on.
   */
  async #fenced(hostId: string, epoch: number, host: HostRecord | undefined, kind: 'heartbeat' | 'notice'): Promise<void> {
    const now = this.ctx.now();
    const last = this.#fencedAt.get(hostId);
    if (last !== undefined && now - last < FENCED_NOTICE_INTERVAL_MS) return;
    this.#fencedAt.set(hostId, now);
    if (this.#fencedAt.size > 10_000) this.#fencedAt.delete(this.#fencedAt.keys().next().value as string);
    const state = host?.lifecycle.state;
    // A host that left on purpose (drained, removed, its node deleted or reclaimed) stays out until
    // its agent is restarted, like a cordoned node; a host declared DEAD (silence, lost data)
    // registers again at once. The host's state decides for an older epoch too: 'stale_epoch' means
    // a newer epoch is LIVE — the agent tells a lost race of its own from another process holding
    // the host (it then stands by), and learns from host_dead/host_removed when that one has ended.
    const retired = host !== undefined && state === 'REMOVED' && host.lifecycle.goingAway !== undefined && PLANNED_SOURCES.has(host.lifecycle.goingAway);
    const reason: FencedNoticeReason = host === undefined ? 'unknown_host' : retired ? 'host_retired' : state === 'DEAD' ? 'host_dead' : state === 'REMOVED' ? 'host_removed' : 'stale_epoch';
    await this.ctx.events.record({
      subjectKind: 'host', subjectId: hostId, type: 'host_report_fenced', toState: state, reason, version: `${epoch}:${host?.lifecycle.epoch ?? 0}:${Math.floor(now / 60_000)}`,
      detail: { kind, reportedEpoch: epoch, currentEpoch: host?.lifecycle.epoch ?? 0 },
    }).catch(() => undefined);
    if (this.#nc === undefined) return;
    try {
      AgentSubjects.commands(hostId);
    } catch {
      return; // not a host id a subject can carry: nobody to tell
    }
    const notice: AgentCommand = {
      commandId: `fenced-${hostId}-${epoch}-${now}`,
      hostId,
      hostEpoch: epoch,
      placementGeneration: 0,
      issuedAtUnixMs: now,
      deadlineUnixMs: now + FENCED_NOTICE_INTERVAL_MS,
      command: { $case: 'fenced', value: { currentEpoch: host?.lifecycle.epoch ?? 0, state: host !== undefined ? PROTO_STATE[host.lifecycle.state] : HostState.UNSPECIFIED, reason } },
    };
    this.#nc.publish(AgentSubjects.commands(hostId), AgentCommand.encode(notice).finish());
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
    await renewLease(this.ctx.hosts, host.hostId, lease, now);
  }

  /**
   * R-H5, R-H6: a notice from the current epoch of a live host is applied by its source (core
   * host-notice.ts): lost Docker data makes the host DEAD at once (unplanned: nothing there can be
   * stopped or checkpointed any more), spot/preemption and other notices start a planned drain. A
   * notice from a revoked or unknown epoch is rejected and counted; the epoch is checked again
   * inside the CAS, so a re-registration landing in between wins.
   */
  async notice(hostId: string, notice: ReclaimNotice): Promise<'applied' | 'unchanged' | 'fenced'> {
    const fence = await this.#fence(hostId, notice.hostEpoch);
    if (!fence.ok) {
      this.ctx.metrics.fencedReports.inc({ kind: 'notice' });
      await this.#fenced(hostId, notice.hostEpoch, fence.host, 'notice');
      return 'fenced';
    }
    const { event, why } = hostEventForNotice(notice.source);
    return (await applyHostEvent(this.ctx.hosts, hostId, event, why, notice.hostEpoch)) !== undefined ? 'applied' : 'unchanged';
  }

  /** Operator drain / remove (R-H5). `remove` also ends the epoch once the host holds nothing. */
  async drain(hostId: string, source: RemovalSource = 'operator_drain'): Promise<boolean> {
    return (await applyHostEvent(this.ctx.hosts, hostId, { type: 'drain_requested', source }, source)) !== undefined;
  }
}
