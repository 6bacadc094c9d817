// The operator façade of the control plane (R-I1 admin service, R-I7 `sandboxctl`): read views of
// hosts, groups and checkpoints; drain/remove (R-H5); an operator-requested migration of a clean
// STOPPED group (R-G3..R-G5); explicit destroy (R-G1); deployment verification with a reverse probe
// (R-H7); the event log (R-R1). Writes go through the same CAS paths as the reconcile loops
// (hosts.ts, GroupOps, MigrationController.step), so an operator action and a leader pass can
// overlap safely: deterministic command ids and guarded compare-and-set make repeats harmless.
import { randomBytes } from 'node:crypto';
import type { CheckpointManifest as CoreManifest } from '../core/checkpoint-manifest.ts';
import { AgentSubjects } from '../core/agent-subjects.ts';
import { Conflict, NotFound, PreconditionFailed, REQUIRED_BRIDGE_VERSION, assessCheckpoint, type AttestationPolicy, type RemovalSource } from '../core/index.ts';
import type { GroupView } from '../core/runner-port.ts';
import type { HostVerification, ReverseProbe, VerifyResponse } from '../gen/sandboxfleet/v1/admin.ts';
import { HostState } from '../gen/sandboxfleet/v1/common.ts';
import { MAX_READ_LIMIT, type SequencedEvent } from '../store/event-log.ts';
import type { StateStore } from '../store/connection.ts';
import { CommandIds } from '../wire/agent-protocol.ts';
import { AgentCommandFailed } from './agent-client.ts';
import { eventSubjectToken } from './events.ts';
import type { ControlPlaneBuckets } from './buckets.ts';
import { readManifest, verifyCheckpoint } from './checkpoints.ts';
import { candidates, describeError, isTerminal } from './fleet.ts';
import { GroupOps, startUnderWay } from './group-ops.ts';
import { applyHostEvent } from './hosts.ts';
import type { MigrationController } from './migration-controller.ts';
import { chooseHost, eligibleHosts, type HostCandidate } from './placement.ts';
import type { CheckpointRecord, Evacuation, GroupRecord, HeartbeatRecord, HostRecord, TurnEvidenceRecord } from './records.ts';
import type { ProbeResponder } from './reverse-probe.ts';
import { Keys, type ControlPlaneDeps } from './state.ts';

export type AdminDeps = Pick<ControlPlaneDeps, 'config' | 'fleet' | 'groups' | 'hosts' | 'checkpoints' | 'chunks' | 'agents' | 'gcLocks' | 'events' | 'metrics' | 'logger' | 'now' | 'replicaId'>;
import { groupView } from './views.ts';

/** One event of the audit log with its stream sequence. */
export type AdminEvent = SequencedEvent;
export type HostStateName = HostRecord['lifecycle']['state'];
export type GroupStateName = GroupRecord['lifecycle']['state'];

/** A host with what an operator needs next to it (R-H2..R-H4). */
export interface HostDetail {
  readonly record: HostRecord;
  readonly revision: number;
  readonly heartbeat: HeartbeatRecord | undefined;
  /** Non-terminal groups placed on the host. */
  readonly groupCount: number;
}

export interface CheckpointDetail {
  readonly record: CheckpointRecord;
  readonly manifest: CoreManifest | undefined;
  readonly latest: boolean;
  /** Why it could not be used for a migration now, judged without reading blobs; '' if usable. */
  readonly unusableReason: string;
}

/** A group with each member's last turn ends as stored (oldest first), for `sandboxctl turns`. */
export interface GroupTurnsDetail {
  readonly group: GroupView;
  readonly members: readonly { readonly memberId: string; readonly turns: readonly TurnEvidenceRecord[] }[];
}

export interface MigrateOutcome {
  readonly group: GroupView;
  readonly checkpointId: string;
  readonly targetHostId: string;
  readonly durationMs: number;
}

export interface EventQuery {
  /** First sequence (inclusive); 0 or 1 = the oldest retained. */
  readonly fromSeq: number;
  readonly follow: boolean;
  readonly subjectKind?: string | undefined;
  readonly subjectId?: string | undefined;
  /** 0 = no limit when following, 1000 otherwise. */
  readonly limit: number;
  readonly signal?: AbortSignal | undefined;
}

const PROTO_HOST_STATE: Record<HostStateName, HostState> = {
  REGISTERING: HostState.REGISTERING,
  UNATTESTED: HostState.UNATTESTED,
  READY: HostState.READY,
  DRAINING: HostState.DRAINING,
  SUSPECT: HostState.SUSPECT,
  DEAD: HostState.DEAD,
  REMOVED: HostState.REMOVED,
};
export const hostStateToProto = (s: HostStateName): HostState => PROTO_HOST_STATE[s];

/** Verification of many hosts runs with this much parallelism (each is one NATS round trip). */
const VERIFY_PARALLELISM = 8;
const MAX_VERIFY_HOSTS = 1000;

/**
 * Event subject ids as EventRecorder files them: one function (events.ts), so a host id with dots,
 * or one longer than a token may be, is found under the same token it was recorded with.
 */
export { eventSubjectToken } from './events.ts';

/** Longest operator reason kept (the API refuses longer ones; this bounds other callers too). */
export const MAX_OPERATOR_REASON = 256;

/**
 * The event detail carrying an operator's free-text reason (`sandboxctl drain|remove --reason`),
 * or none when it is empty. Control characters become spaces so `sandboxctl events` prints one
 * line per event whatever was typed.
 */
function operatorDetail(reason: string): Record<string, string> | undefined {
  // eslint-disable-next-line no-control-regex
  const text = reason.replace(/[\u0000-\u001f\u007f]/g, ' ').trim().slice(0, MAX_OPERATOR_REASON);
  return text === '' ? undefined : { operator_reason: text };
}

export class AdminOps {
  readonly #ops: GroupOps;

  constructor(
    private readonly ctx: AdminDeps,
    private readonly store: StateStore<ControlPlaneBuckets>,
    private readonly policy: AttestationPolicy,
    private readonly controller: MigrationController,
    private readonly probes: ProbeResponder,
    private readonly buildSha: string | undefined,
  ) {
    this.#ops = new GroupOps(ctx);
  }

  // ---- hosts ------------------------------------------------------------------------------------

  /** Hosts from the read model (this replica's view, brought up to date with the store first). */
  async listHosts(state?: HostStateName): Promise<HostDetail[]> {
    await this.ctx.fleet.sync();
    return [...this.ctx.fleet.hosts()]
      .filter((h) => state === undefined || h.value.lifecycle.state === state)
      .map((h) => this.#hostDetail(h.value, h.revision))
      .sort((a, b) => (a.record.hostId < b.record.hostId ? -1 : a.record.hostId > b.record.hostId ? 1 : 0));
  }

  async getHost(hostId: string): Promise<HostDetail> {
    const h = await this.ctx.hosts.get(hostId);
    if (h === undefined) throw new NotFound('host_not_found', `host ${hostId} is not registered`, { details: { hostId } });
    return this.#hostDetail(h.value, h.revision);
  }

  #hostDetail(record: HostRecord, revision: number): HostDetail {
    let groupCount = 0;
    for (const key of this.ctx.fleet.groupKeysOnHost(record.hostId)) {
      const g = this.ctx.fleet.group(key)?.value;
      if (g !== undefined && !isTerminal(g) && g.lifecycle.hostId === record.hostId) groupCount += 1;
    }
    return { record, revision, heartbeat: this.ctx.fleet.heartbeat(record.hostId), groupCount };
  }

  /**
   * R-H5 operator drain: idempotent (draining an already draining host answers its state). The
   * operator's `--reason` goes into the audit event's detail (`operator_reason`); the event's
   * reason stays the machine-readable source. A repeated drain changes nothing and records nothing.
   */
  async drainHost(hostId: string, source: RemovalSource = 'operator_drain', operatorReason = ''): Promise<HostDetail> {
    const before = await this.getHost(hostId);
    const state = before.record.lifecycle.state;
    if (state !== 'READY' && state !== 'DRAINING' && state !== 'SUSPECT') {
      throw new PreconditionFailed('invalid_transition', `host ${hostId} is ${state}: only READY, DRAINING or SUSPECT hosts can be drained`, { details: { hostId, state } });
    }
    await applyHostEvent(this.ctx.hosts, hostId, { type: 'drain_requested', source }, source, undefined, undefined, operatorDetail(operatorReason));
    return this.getHost(hostId);
  }

  /**
   * R-H5 operator remove. A live host is drained first and becomes REMOVED (epoch ended) once it
   * holds nothing (the migration controller does that). `force`, or a host that cannot be drained
   * (UNATTESTED, DEAD, ...), is removed at once: its groups are handled as unplanned loss (R-G6).
   * The operator's reason is recorded like a drain's, on each event this call writes.
   */
  async removeHost(hostId: string, force: boolean, operatorReason = ''): Promise<HostDetail> {
    const before = await this.getHost(hostId);
    const state = before.record.lifecycle.state;
    const drainable = state === 'READY' || state === 'DRAINING' || state === 'SUSPECT';
    const detail = operatorDetail(operatorReason);
    if (drainable) await applyHostEvent(this.ctx.hosts, hostId, { type: 'drain_requested', source: 'operator_remove' }, 'operator_remove', undefined, undefined, detail);
    if (force || !drainable) await applyHostEvent(this.ctx.hosts, hostId, { type: 'removed' }, force ? 'operator_remove (force)' : `operator_remove of a ${state} host`, undefined, undefined, detail);
    return this.getHost(hostId);
  }

  // ---- groups -----------------------------------------------------------------------------------

  /** Groups from the read model (brought up to date with the store first), oldest first. */
  async listGroups(filter: { hostId?: string | undefined; state?: GroupStateName | undefined }): Promise<GroupView[]> {
    await this.ctx.fleet.sync();
    const epoch = (hostId: string): number => this.ctx.fleet.host(Keys.host(hostId))?.value.lifecycle.epoch ?? 0;
    const out: GroupView[] = [];
    for (const g of this.ctx.fleet.groups()) {
      if (filter.hostId !== undefined && g.value.lifecycle.hostId !== filter.hostId) continue;
      if (filter.state !== undefined && g.value.lifecycle.state !== filter.state) continue;
      out.push(groupView(g.value, g.revision, epoch(g.value.lifecycle.hostId)));
    }
    return out.sort((a, b) => a.createdAtMs - b.createdAtMs || (a.groupId < b.groupId ? -1 : 1));
  }

  async getGroup(groupId: string): Promise<GroupView> {
    return (await this.getGroupTurns(groupId)).group;
  }

  /**
   * The group and its members' stored turn evidence, from one fresh read of the record (the read
   * model keeps no turn evidence: fleet-state.ts projectGroup).
   */
  async getGroupTurns(groupId: string): Promise<GroupTurnsDetail> {
    const g = await this.#ops.get(groupId);
    const host = await this.ctx.hosts.get(g.value.lifecycle.hostId);
    return {
      group: groupView(g.value, g.revision, host?.value.lifecycle.epoch ?? 0),
      members: g.value.members.map((m) => ({ memberId: m.session.memberId, turns: m.turns ?? [] })),
    };
  }

  /**
   * Operator-requested move of a clean STOPPED group (R-G3..R-G5): checkpoint (or reuse the one of
   * this exact state), verify every blob, check the target, write the migration intent together
   * with a planned-evacuation mark (so a crash mid-way is finished or rolled back by the next
   * leader exactly like a drain, R-R3), then drive the controller's steps to the end. Anything that
   * makes the move unsafe is refused with FAILED_PRECONDITION and a reason; the group stays put.
   */
  async migrateGroup(groupId: string, targetHostId: string | undefined, signal?: AbortSignal): Promise<MigrateOutcome> {
    const started = this.ctx.now();
    const g = (await this.#ops.get(groupId)).value;
    const lc = g.lifecycle;
    if (lc.state !== 'STOPPED') {
      throw new PreconditionFailed('invalid_transition', `group ${groupId} is ${lc.state}: only a cleanly STOPPED group can be migrated (stop it first)`, { details: { groupId, state: lc.state } });
    }
    if (lc.stop?.clean !== true) {
      throw new PreconditionFailed('unclean_stop', `group ${groupId} was stopped uncleanly: it can resume only on its host ${lc.hostId}, never be migrated`, { details: { groupId, hostId: lc.hostId } });
    }
    if (g.evacuation !== undefined) {
      throw new PreconditionFailed('invalid_transition', `group ${groupId} is already being evacuated (${g.evacuation.source})`, { details: { groupId, source: g.evacuation.source } });
    }
    if (targetHostId !== undefined && targetHostId === lc.hostId) {
      throw new PreconditionFailed('invalid_transition', `group ${groupId} is already on ${targetHostId}`, { details: { groupId, hostId: targetHostId } });
    }
    if (targetHostId !== undefined && (await this.ctx.hosts.get(targetHostId)) === undefined) {
      throw new NotFound('host_not_found', `host ${targetHostId} is not registered`, { details: { hostId: targetHostId } });
    }

    const record = await this.#ops.checkpoint(groupId);
    await this.ctx.fleet.sync();
    const pool = candidates(this.ctx.fleet);
    const need = { members: g.members.length, exclude: new Set([lc.hostId]), imageDigest: record.baseImageDigest, bridgeVersion: record.bridgeVersion };
    let target: HostCandidate | undefined;
    if (targetHostId !== undefined) {
      target = eligibleHosts(pool, need).find((h) => h.hostId === targetHostId);
      if (target === undefined) {
        const why = ineligibility(pool.find((h) => h.hostId === targetHostId), need);
        throw new PreconditionFailed('host_not_ready', `host ${targetHostId} cannot take group ${groupId}: ${why}`, { details: { groupId, hostId: targetHostId, why } });
      }
    } else {
      target = chooseHost(pool, need);
      if (target === undefined) {
        throw new PreconditionFailed('host_not_ready', `no READY host other than ${lc.hostId} has room, image ${record.baseImageDigest} and bridge ${record.bridgeVersion}`, { details: { groupId, why: 'no_eligible_host' } });
      }
    }

    // R-G4: every blob re-read and digest-verified, freshness and target compatibility judged.
    const { summary } = await verifyCheckpoint(this.ctx.chunks, record);
    const now = this.ctx.now();
    const assessment = assessCheckpoint(
      { groupId, activityVersion: lc.activityVersion, lastActivityAtMs: lc.lastActivityAtMs, memberIds: g.members.map((m) => m.session.memberId) },
      summary,
      { imageDigests: new Set([target.imageDigest]), bridgeVersion: target.bridgeVersion ?? -1 },
      now,
      this.ctx.config.checkpointMaxAgeMs,
    );
    if (!assessment.usable) {
      throw new PreconditionFailed('checkpoint_not_usable', `checkpoint ${record.checkpointId} cannot be used: ${assessment.reasons.join(',')}`, {
        details: { groupId, checkpointId: record.checkpointId, reasons: assessment.reasons.join(',') },
      });
    }
    const evacuation: Evacuation = {
      kind: 'planned',
      // The stored vocabulary has no "operator migrate": an operator drain of this one group is the
      // closest meaning (planned, source still alive, delete the source copy after the switch).
      source: 'operator_drain',
      sourceHostId: lc.hostId,
      startedAtMs: now,
      deadlineMs: now + this.ctx.config.evacuationDeadlineMs,
      attempts: 0,
      triedHostIds: [],
    };
    const intent = await this.#ops.transition(groupId, { type: 'migration_started', targetHostId: target.hostId, assessment }, `operator migrate to ${target.hostId}`,
      (c) => c.lifecycle.state === 'STOPPED' && c.lifecycle.generation === lc.generation && c.lifecycle.activityVersion === lc.activityVersion && c.evacuation === undefined && !startUnderWay(c, this.ctx.now()),
      () => ({ evacuation }));
    if (intent === undefined) throw new Conflict('cas_conflict', `group ${groupId} changed while its migration was prepared; retry`, { details: { groupId } });

    // Restore, prove, switch (R-G5) — the same steps a leader would run; a failed restore is
    // retried elsewhere within the budget, then LOST, exactly as for a drain.
    for (let i = 0; i < 16 && !(signal?.aborted ?? false); i++) {
      if ((await this.controller.step(groupId)) !== 'progress') break;
    }
    const after = await this.getGroup(groupId);
    if (after.state === 'LOST') {
      // The move ended the group (its checkpoint refused by the target, every restore failed): say
      // why, with the agent's own words, rather than answer as if it had moved.
      const stored = (await this.#ops.get(groupId)).value;
      throw new PreconditionFailed(after.lostReason ?? 'restore_failed', `group ${groupId} is LOST (${after.lostReason ?? 'unknown'}): ${stored.lostDetail ?? 'see its events'}`.slice(0, 1024), {
        details: { groupId, lostReason: after.lostReason ?? '', checkpointId: record.checkpointId },
      });
    }
    return { group: after, checkpointId: record.checkpointId, targetHostId: after.state === 'MIGRATING' ? target.hostId : after.hostId, durationMs: this.ctx.now() - started };
  }

  /**
   * Explicit destroy (R-G1): DESTROYED first by CAS (terminal: the runner can no longer use the
   * group), then its containers are removed on the host. If the host cannot be reached now, the
   * agent deletes them when it re-registers, since it no longer owns the group (R-H6). Checkpoints
   * of destroyed groups are garbage-collected by retention (R-G7).
   */
  async destroyGroup(groupId: string): Promise<GroupView> {
    const g = (await this.#ops.get(groupId)).value;
    if (g.lifecycle.state === 'DESTROYED') return this.getGroup(groupId);
    if (g.lifecycle.state === 'MIGRATING') {
      throw new PreconditionFailed('invalid_transition', `group ${groupId} is MIGRATING: destroy it once the migration has finished`, { details: { groupId, state: 'MIGRATING' } });
    }
    const after = await this.#ops.transition(groupId, { type: 'destroyed' }, 'operator destroy',
      (c) => c.lifecycle.state !== 'MIGRATING' && c.lifecycle.state !== 'DESTROYED' && c.lifecycle.generation === g.lifecycle.generation && c.lifecycle.hostId === g.lifecycle.hostId,
      () => ({ evacuation: undefined }));
    if (after === undefined) {
      const now = (await this.#ops.get(groupId)).value;
      if (now.lifecycle.state !== 'DESTROYED') throw new Conflict('cas_conflict', `group ${groupId} changed while it was destroyed; retry`, { details: { groupId } });
    }
    await this.#ops.deleteOn(g.lifecycle.hostId, groupId, g.lifecycle.generation, 'destroyed');
    return this.getGroup(groupId);
  }

  // ---- checkpoints ------------------------------------------------------------------------------

  async listCheckpoints(groupId: string | undefined): Promise<CheckpointDetail[]> {
    await this.ctx.fleet.sync();
    const records = groupId === undefined ? [...this.ctx.fleet.checkpoints()].map((c) => c.record) : this.ctx.fleet.checkpointsOf(Keys.group(groupId));
    const group = (id: string): GroupRecord | undefined => this.ctx.fleet.group(Keys.group(id))?.value;
    const now = this.ctx.now();
    records.sort((a, b) => (a.groupId < b.groupId ? -1 : a.groupId > b.groupId ? 1 : b.createdAtMs - a.createdAtMs));
    const out: CheckpointDetail[] = [];
    for (const r of records) {
      const g = group(r.groupId);
      const unusable =
        g === undefined || isTerminal(g) ? 'group_gone'
          : r.activityVersion !== g.lifecycle.activityVersion || r.createdAtMs < g.lifecycle.lastActivityAtMs || now - r.createdAtMs > this.ctx.config.checkpointMaxAgeMs ? 'stale_checkpoint'
            : '';
      out.push({ record: r, manifest: await readManifest(this.ctx.chunks, r.sourceHostId, r.groupId, r.checkpointId), latest: g?.latestCheckpointId === r.checkpointId, unusableReason: unusable });
    }
    return out;
  }

  // ---- verification (R-H7) ----------------------------------------------------------------------

  async verify(hostIds: readonly string[], probeTimeoutMs: number): Promise<VerifyResponse> {
    const timeout = probeTimeoutMs > 0 ? Math.min(probeTimeoutMs, 60_000) : this.ctx.config.verifyProbeTimeoutMs;
    let hosts: HostRecord[];
    if (hostIds.length > 0) {
      hosts = [];
      for (const id of hostIds.slice(0, MAX_VERIFY_HOSTS)) {
        const h = await this.ctx.hosts.get(id);
        if (h === undefined) throw new NotFound('host_not_found', `host ${id} is not registered`, { details: { hostId: id } });
        hosts.push(h.value);
      }
    } else {
      await this.ctx.fleet.sync();
      hosts = [...this.ctx.fleet.hosts()].map((h) => h.value).filter((h) => h.lifecycle.state !== 'REMOVED').slice(0, MAX_VERIFY_HOSTS);
      hosts.sort((a, b) => (a.hostId < b.hostId ? -1 : 1));
    }
    const results: HostVerification[] = new Array<HostVerification>(hosts.length);
    let next = 0;
    const worker = async () => {
      for (let i = next++; i < hosts.length; i = next++) results[i] = await this.#verifyHost(hosts[i]!, timeout);
    };
    await Promise.all(Array.from({ length: Math.min(VERIFY_PARALLELISM, hosts.length) }, worker));
    return {
      allowedAgentBuildShas: [...this.policy.allowedAgentShas],
      expectedApiSha: this.policy.apiSha,
      allowedImageDigests: [...this.policy.allowedImageDigests],
      expectedBridgeVersion: REQUIRED_BRIDGE_VERSION,
      controlPlaneBuildSha: this.buildSha ?? '',
      controlPlaneReplica: this.ctx.replicaId,
      hosts: results,
      ok: results.every((r) => r.ok),
    };
  }

  async #verifyHost(host: HostRecord, timeoutMs: number): Promise<HostVerification> {
    const a = host.attestation;
    const mismatches: string[] = [];
    const state = host.lifecycle.state;
    if (state !== 'READY' && state !== 'DRAINING') mismatches.push(`state: ${state}${host.lifecycle.refusals?.length ? ` (${host.lifecycle.refusals.join(',')})` : ''}`);
    const agentShaOk = this.policy.allowedAgentShas.has(a.agentSha);
    if (!agentShaOk) mismatches.push(`agent_sha: ${a.agentSha || '(empty)'} not in the allowed set`);
    const apiShaOk = a.apiSha === this.policy.apiSha;
    if (!apiShaOk) mismatches.push(`api_sha: ${a.apiSha || '(empty)'}, expected ${this.policy.apiSha}`);
    const imageOk = this.policy.allowedImageDigests.has(a.imageDigest);
    if (!imageOk) mismatches.push(`image_digest: ${a.imageDigest || '(empty)'} not allowed`);
    const bridgeOk = a.bridgeVersion === REQUIRED_BRIDGE_VERSION;
    if (!bridgeOk) mismatches.push(`bridge_version: ${a.bridgeVersion ?? 'unproven'}, expected ${REQUIRED_BRIDGE_VERSION}`);

    const beat = this.ctx.fleet.heartbeat(host.hostId);
    const current = beat !== undefined && beat.epoch === host.lifecycle.epoch;
    const heartbeatAgeMs = current ? Math.max(0, this.ctx.now() - beat.receivedAtMs) : -1;
    const heartbeatOk = heartbeatAgeMs >= 0 && heartbeatAgeMs <= this.ctx.config.heartbeatTtlMs;
    if (!heartbeatOk) mismatches.push(heartbeatAgeMs < 0 ? `heartbeat: none for epoch ${host.lifecycle.epoch}` : `heartbeat: ${heartbeatAgeMs} ms old (TTL ${this.ctx.config.heartbeatTtlMs} ms)`);

    const probe = await this.#probe(host, timeoutMs);
    if (!probe.result.ok) mismatches.push(`reverse probe: ${probe.result.error || 'failed'}`);
    // The echo carries the SHAs of the build that is running now, not the one that registered.
    if (probe.echo !== undefined) {
      if (probe.echo.agentBuildSha !== a.agentSha) mismatches.push(`agent_sha: running ${probe.echo.agentBuildSha || '(empty)'} differs from registered ${a.agentSha}`);
      if (probe.echo.apiSha !== a.apiSha) mismatches.push(`api_sha: running ${probe.echo.apiSha || '(empty)'} differs from registered ${a.apiSha}`);
    }
    const runningShaOk = probe.echo === undefined || (probe.echo.agentBuildSha === a.agentSha && probe.echo.apiSha === a.apiSha);
    return {
      hostId: host.hostId,
      state: hostStateToProto(state),
      agentBuildSha: probe.echo?.agentBuildSha || a.agentSha,
      agentBuildShaOk: agentShaOk && (probe.echo === undefined || probe.echo.agentBuildSha === a.agentSha),
      apiSha: probe.echo?.apiSha || a.apiSha,
      apiShaOk: apiShaOk && (probe.echo === undefined || probe.echo.apiSha === a.apiSha),
      imageDigest: a.imageDigest,
      imageDigestOk: imageOk,
      bridgeVersion: a.bridgeVersion ?? 0,
      bridgeVersionOk: bridgeOk,
      probe: probe.result,
      heartbeatAgeMs,
      heartbeatOk,
      ok: mismatches.length === 0 && runningShaOk,
      mismatches,
    };
  }

  /** Reverse probe: command → agent → echo on the host's probe subject → ack → command result. */
  async #probe(host: HostRecord, timeoutMs: number): Promise<{ result: ReverseProbe; echo: { agentBuildSha: string; apiSha: string } | undefined }> {
    const failed = (error: string, roundTripMs = 0): { result: ReverseProbe; echo: undefined } => ({
      result: { ok: false, roundTripMs, callbackRoundTripMs: 0, answeredBy: '', error: error.slice(0, 512) },
      echo: undefined,
    });
    let subject: string;
    try {
      subject = AgentSubjects.probeCallback(host.hostId);
    } catch {
      return failed('host id is not a valid subject token');
    }
    if (host.lifecycle.state === 'REMOVED') return failed('host is REMOVED');
    const nonce = randomBytes(16).toString('hex');
    const pending = this.probes.expect(host.hostId, nonce);
    const t0 = performance.now();
    try {
      const res = await this.ctx.agents.send({ hostId: host.hostId, epoch: host.lifecycle.epoch, generation: 0 }, CommandIds.probe(nonce), { $case: 'probe', value: { nonce, callbackSubject: subject } }, 'probe', timeoutMs);
      const rtt = Math.round(performance.now() - t0);
      const echo = await Promise.race([pending.echo, new Promise<undefined>((r) => setTimeout(() => r(undefined), 0))]);
      if (res.nonce !== nonce) return failed('probe result carries another nonce', rtt);
      if (!res.callbackOk || echo === undefined) return failed(res.error || 'the echo did not reach this replica', rtt);
      return {
        result: { ok: true, roundTripMs: rtt, callbackRoundTripMs: res.callbackRoundTripMs, answeredBy: res.answeredBy, error: '' },
        echo: { agentBuildSha: echo.agentBuildSha, apiSha: echo.apiSha },
      };
    } catch (err) {
      const rtt = Math.round(performance.now() - t0);
      if (err instanceof AgentCommandFailed) return failed(`${err.outcome}: ${err.reason}`, rtt);
      return failed(String(describeError(err).message ?? 'probe failed'), rtt);
    } finally {
      pending.cancel();
    }
  }

  // ---- events (R-R1) ----------------------------------------------------------------------------

  /** The audit log from a sequence, optionally following new appends until the signal aborts. */
  async *events(q: EventQuery): AsyncGenerator<SequencedEvent> {
    const filter = {
      ...(q.subjectKind !== undefined ? { subjectKind: q.subjectKind } : {}),
      ...(q.subjectId !== undefined ? { subjectId: eventSubjectToken(q.subjectId) } : {}),
    };
    const from = Math.max(1, q.fromSeq);
    const limit = q.limit > 0 ? q.limit : q.follow ? Number.POSITIVE_INFINITY : MAX_READ_LIMIT;
    let sent = 0;
    if (q.follow) {
      for await (const e of this.store.events.follow({ ...filter, fromSeq: from, ...(q.signal ? { signal: q.signal } : {}) })) {
        yield e;
        if (++sent >= limit) return;
      }
      return;
    }
    let seq = from;
    while (sent < limit) {
      const page = await this.store.events.read({ ...filter, fromSeq: seq, limit: Math.min(MAX_READ_LIMIT, limit - sent) });
      for (const e of page.events) {
        yield e;
        sent++;
      }
      if (page.events.length + page.invalid.length === 0 || page.nextSeq === seq) return;
      seq = page.nextSeq;
    }
  }
}

/** Why `host` is not an eligible migration target for `need` (placement.ts's rules, spelled out). */
function ineligibility(host: HostCandidate | undefined, need: { members: number; imageDigest: string; bridgeVersion: number }): string {
  if (host === undefined) return 'not registered';
  if (host.lifecycle.state !== 'READY') return `host is ${host.lifecycle.state}`;
  if (host.bridgeVersion === undefined) return 'live-bridge version unproven';
  if (host.imageDigest !== need.imageDigest) return `image ${host.imageDigest} differs from the checkpoint's ${need.imageDigest}`;
  if (host.bridgeVersion !== need.bridgeVersion) return `bridge version ${host.bridgeVersion} differs from the checkpoint's ${need.bridgeVersion}`;
  if (host.maxMembers - Math.max(host.usedMembers, host.reportedMembers ?? 0) < need.members) return `no room for ${need.members} member(s)`;
  return 'not eligible';
}

