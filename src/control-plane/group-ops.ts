// Group operations shared by the runner backend and the migration controller: start, clean stop
// (R-G2), checkpoint right after a clean stop (R-G3), LOST with a reason (R-G6, R-R1). Each step is
// one agent command with a deterministic id (a repeat by a new leader gets the agent's first
// answer) followed by one compare-and-set write that re-checks the group is still where the step
// began; the lifecycle changes only through core's transitionGroup.
import { createHash } from 'node:crypto';
import {
  Unavailable,
  decideStopCleanliness,
  markMemberLost,
  onContainerStopped,
  transitionGroup,
  unwrap,
  type GroupEvent,
  type LossReason,
  type MemberStopEvidence,
} from '../core/index.ts';
import type { CleanStopEvidence } from '../gen/sandboxfleet/v1/agent.ts';
import { CasConflictError } from '../store/errors.ts';
import type { Versioned } from '../store/kv-repository.ts';
import { CommandIds } from '../wire/agent-protocol.ts';
import { cliKindFromName as cliKindToProto } from '../wire/cli-kind.ts';
import { AgentCommandFailed, type AgentTarget } from './agent-client.ts';
import { readManifest, recordFromManifest } from './checkpoints.ts';
import { markEvacuation } from './evacuations.ts';
import { describeError } from './fleet.ts';
import { ChunkGcLocks, CLOCK_SKEW_MS } from './chunk-gc-locks.ts';
import { lifecycleEvent } from './group-store.ts';
import type { CheckpointRecord, GroupRecord } from './records.ts';
import { Keys, type ControlPlaneDeps } from './state.ts';

/** What group operations use. */
export type GroupOpsDeps = Pick<ControlPlaneDeps, 'config' | 'fleet' | 'groups' | 'hosts' | 'checkpoints' | 'chunks' | 'agents' | 'gcLocks' | 'events' | 'metrics' | 'logger' | 'now' | 'replicaId'>;

/**
 * Deterministic checkpoint id for a group's state (one checkpoint per clean-stopped version), and
 * for each refresh of it (`refresh`: the refresh period it was taken in, so leaders racing in one
 * period take the same checkpoint).
 */
export function checkpointIdFor(groupId: string, generation: number, activityVersion: number, refresh?: number): string {
  const period = refresh === undefined ? '' : `|refresh-${refresh}`;
  return `c-${createHash('sha256').update(`${groupId}|${generation}|${activityVersion}${period}`).digest('hex').slice(0, 32)}`;
}

/** A start of the group is under way (its intent has not run out): no move of the group may begin. */
export function startUnderWay(g: GroupRecord, nowMs: number): boolean {
  return g.startingUntilMs !== undefined && nowMs <= g.startingUntilMs;
}

export class GroupOps {
  constructor(private readonly ctx: GroupOpsDeps) {}

  /** The stored record, read fresh (NOT_FOUND when absent). */
  get(groupId: string): Promise<Versioned<GroupRecord>> {
    return this.ctx.groups.require(groupId);
  }

  /**
   * The fencing tokens for a command to `hostId` about a group at `generation` (R-H6). The epoch is
   * read from the store, never from the read model: a command must carry the host's current epoch.
   */
  async target(hostId: string, generation: number): Promise<AgentTarget> {
    const host = await this.ctx.hosts.get(hostId);
    const state = host?.value.lifecycle.state;
    if (host === undefined || state === 'DEAD' || state === 'REMOVED' || state === 'UNATTESTED' || state === 'REGISTERING') {
      throw new Unavailable('host_unreachable', `host ${hostId} cannot take commands (${state ?? 'unknown'})`, { details: { hostId, state: state ?? 'unknown' } });
    }
    return { hostId, epoch: host.value.lifecycle.epoch, generation };
  }

  /**
   * Apply one lifecycle event with CAS. `guard` re-checks the current record (e.g. same generation);
   * `patch` adjusts the rest of the record. Returns the new record or undefined when not applied.
   */
  async transition(groupId: string, event: GroupEvent, why: string, guard: (g: GroupRecord) => boolean, patch: (g: GroupRecord) => Partial<GroupRecord> = () => ({})): Promise<GroupRecord | undefined> {
    const now = this.ctx.now();
    const { after } = await this.ctx.groups.transact(groupId, (current) => {
      if (current === undefined || !guard(current)) return undefined;
      const next = transitionGroup(current.lifecycle, event, now);
      if (!next.ok) return undefined;
      const record: GroupRecord = { ...current, ...patch(current), lifecycle: next.value, updatedAtMs: now };
      // R-R1: a LOST is never silent — the event carries the reason (the store counts the metric).
      return { record, events: [lifecycleEvent(event.type, current, record, why, record.lostDetail !== undefined && record.lifecycle.state === 'LOST' ? { detail: record.lostDetail } : {})] };
    });
    return after?.value;
  }

  /**
   * A MIGRATING group whose restore was refused for the checkpoint's own data: the abort and the
   * loss in one compare-and-set, both events recorded. Written as two, another writer (the leader's
   * keyed queue while an operator's MigrateGroup steps the same group) could see the STOPPED group
   * in between, still under evacuation, and start a restore of the same refused checkpoint elsewhere.
   */
  async abortAsLost(groupId: string, guard: (g: GroupRecord) => boolean, abortWhy: string, reason: LossReason, lostWhy: string): Promise<GroupRecord | undefined> {
    const now = this.ctx.now();
    const { after } = await this.ctx.groups.transact(groupId, (current) => {
      if (current === undefined || !guard(current)) return undefined;
      const aborted = transitionGroup(current.lifecycle, { type: 'migration_aborted' }, now);
      if (!aborted.ok) return undefined;
      const between: GroupRecord = { ...current, lifecycle: aborted.value, updatedAtMs: now };
      const lost = transitionGroup(aborted.value, { type: 'lost', reason }, now);
      if (!lost.ok) return undefined;
      const record: GroupRecord = {
        ...between,
        lifecycle: lost.value,
        members: current.members.map((m) => ({ ...m, session: markMemberLost(m.session, 'group_lost') })),
        evacuation: undefined,
        lostDetail: lostWhy.slice(0, 1024),
      };
      return {
        record,
        events: [lifecycleEvent('migration_aborted', current, between, abortWhy), lifecycleEvent('lost', between, record, lostWhy, { detail: record.lostDetail })],
      };
    });
    return after?.value;
  }

  /** Declare the group LOST with `reason` (R-G6); its members' sessions become LOST too. */
  async declareLost(groupId: string, reason: LossReason, why: string): Promise<GroupRecord | undefined> {
    return this.transition(groupId, { type: 'lost', reason }, why, (g) => g.lifecycle.state !== 'LOST' && g.lifecycle.state !== 'DESTROYED', (g) => ({
      members: g.members.map((m) => ({ ...m, session: markMemberLost(m.session, 'group_lost') })),
      evacuation: undefined,
      lostDetail: why.slice(0, 1024),
    }));
  }

  /** Start the group's containers (PENDING first start, or resume on the same host from STOPPED). */
  async start(groupId: string): Promise<GroupRecord> {
    const g = (await this.get(groupId)).value;
    if (g.lifecycle.state === 'RUNNING') return g;
    if (g.lifecycle.state !== 'PENDING' && g.lifecycle.state !== 'STOPPED') {
      throw unwrapRefusal(transitionGroup(g.lifecycle, { type: 'started' }, this.ctx.now()));
    }
    const target = await this.target(g.lifecycle.hostId, g.lifecycle.generation);
    const samePlacement = (c: GroupRecord): boolean => c.lifecycle.generation === g.lifecycle.generation && c.starts === g.starts && c.lifecycle.hostId === g.lifecycle.hostId;
    // The start intent first (records.ts startingUntilMs), on a group no evacuation holds: until the
    // command's deadline has surely passed on the host, no migration of the group begins; a move
    // that began first wins and nothing is sent. Without it a drain could move the group while our
    // command started it on the old host: a running copy on two hosts until the undo below.
    const timeoutMs = this.ctx.config.agentCommandTimeoutMs;
    const untilMs = this.ctx.now() + timeoutMs + CLOCK_SKEW_MS;
    const intent = await this.ctx.groups.transact(groupId, (c) => (c !== undefined && c.lifecycle.state === g.lifecycle.state && samePlacement(c) && c.evacuation === undefined
      ? { record: { ...c, startingUntilMs: Math.max(c.startingUntilMs ?? 0, untilMs), updatedAtMs: this.ctx.now() } }
      : undefined));
    if (intent.after === undefined) {
      const now = intent.before?.value;
      // Another start of this very placement got there first (the same command id, the same containers).
      if (now !== undefined && now.lifecycle.state === 'RUNNING' && now.lifecycle.hostId === g.lifecycle.hostId && now.lifecycle.generation === g.lifecycle.generation) return now;
      throw new Unavailable('host_unreachable', `group ${groupId} is moving or stopping; retry shortly`, { details: { groupId, state: now?.lifecycle.state ?? 'unknown' } });
    }
    let res: { containerIds: Record<string, string> };
    try {
      res = await this.ctx.agents.send(target, CommandIds.start(groupId, g.lifecycle.generation, g.starts), { $case: 'startGroup', value: { groupId, memberIds: [] } }, 'startGroup', timeoutMs);
    } catch (err) {
      // The host answered: this command will do nothing more, so the intent ends now (a timeout
      // proves nothing: the intent then runs out by itself).
      if (err instanceof AgentCommandFailed) await this.#endStartIntent(groupId, g, untilMs);
      // The host's own listing has no container for the group, or for one of its members, at this
      // placement: a stopped group is then restored from its checkpoint (or LOST container_missing),
      // never retried here forever.
      if (g.lifecycle.state === 'STOPPED' && err instanceof AgentCommandFailed && (err.reason === 'group_not_found' || err.reason === 'member_not_found')) await this.containersGone(g);
      throw err;
    }
    const started = await this.transition(groupId, { type: 'started' }, 'containers started', samePlacement,
      (c) => ({
        starts: c.starts + 1,
        startingUntilMs: undefined,
        members: c.members.map((m) => ({ ...m, containerId: res.containerIds[m.session.memberId] ?? m.containerId })),
      }));
    if (started !== undefined) return started;
    const now = (await this.get(groupId)).value;
    // Another start of this very placement won (the same command id, so the same containers).
    if (now.lifecycle.state === 'RUNNING' && now.lifecycle.hostId === g.lifecycle.hostId && now.lifecycle.generation === g.lifecycle.generation) return now;
    // Our start lost to a move of the group (a drain or migration began between our read and our
    // command): what we started runs on a placement that is not the group's. Stop it now rather than
    // leave it running until its host registers again; never delete it here — the host-copy verdicts
    // do that on positive proof (R-R6).
    await this.#undoStart(target, g);
    if (now.lifecycle.state === 'RUNNING') return now;
    throw new CasConflictError(this.ctx.groups.bucket, Keys.group(groupId), 0);
  }

  /** Clears this start's intent (best effort: one that is left runs out at its time). */
  async #endStartIntent(groupId: string, g: GroupRecord, untilMs: number): Promise<void> {
    await this.ctx.groups.transact(groupId, (c) => (c !== undefined && c.starts === g.starts && c.startingUntilMs === untilMs
      ? { record: { ...c, startingUntilMs: undefined, updatedAtMs: this.ctx.now() } }
      : undefined)).catch((err: unknown) => this.ctx.logger.warn({ groupId, ...describeError(err) }, 'clearing a failed start\'s intent failed; it runs out by itself'));
  }

  async #undoStart(target: AgentTarget, g: GroupRecord): Promise<void> {
    try {
      await this.ctx.agents.send(target, CommandIds.undoStart(g.groupId, g.lifecycle.generation, g.starts), { $case: 'stopGroup', value: { groupId: g.groupId, graceMs: this.ctx.config.stopGraceMs } }, 'stopGroup');
      this.ctx.logger.warn({ groupId: g.groupId, hostId: g.lifecycle.hostId, generation: g.lifecycle.generation }, 'a start lost to a move of the group: what it started was stopped');
    } catch (err) {
      this.ctx.logger.error({ groupId: g.groupId, hostId: g.lifecycle.hostId, generation: g.lifecycle.generation, ...describeError(err) }, 'a start lost to a move of the group, and stopping what it started failed: the host keeps a running copy until its copies are judged');
    }
  }

  /** Stop cleanly if possible (R-G2). Returns the record after the stop (STOPPED clean or unclean). */
  async stop(groupId: string, graceMs: number, why: string): Promise<GroupRecord> {
    let g = (await this.get(groupId)).value;
    if (g.lifecycle.state === 'RUNNING') {
      g = (await this.transition(groupId, { type: 'stop_requested' }, why, (c) => c.lifecycle.state === 'RUNNING', (c) => ({ stops: c.stops + 1 }))) ?? (await this.get(groupId)).value;
    }
    if (g.lifecycle.state !== 'STOPPING') return g;
    const target = await this.target(g.lifecycle.hostId, g.lifecycle.generation);
    let res: { evidence?: CleanStopEvidence | undefined };
    try {
      res = await this.ctx.agents.send(target, CommandIds.stop(groupId, g.lifecycle.generation, g.stops), { $case: 'stopGroup', value: { groupId, graceMs } }, 'stopGroup');
    } catch (err) {
      if (err instanceof AgentCommandFailed && err.reason === 'group_not_found') await this.containersGone(g);
      throw err;
    }
    return this.#applyVerdict(groupId, g, res.evidence, graceMs);
  }

  /** Judge the stop (R-G2) against the record as it is at write time, and store it in one CAS. */
  async #applyVerdict(groupId: string, started: GroupRecord, evidence: CleanStopEvidence | undefined, graceMs: number): Promise<GroupRecord> {
    const now = this.ctx.now();
    const stoppedAt = evidence?.stoppedAtUnixMs || now;
    const { after } = await this.ctx.groups.transact(groupId, (current) => {
      if (current === undefined || current.lifecycle.state !== 'STOPPING' || current.stops !== started.stops || current.lifecycle.generation !== started.lifecycle.generation) return undefined;
      const members: MemberStopEvidence[] = (evidence?.members ?? []).map((e) => ({
        memberId: e.memberId,
        // A turn begun and not completed is in flight whatever the agent saw (R-S8 bookkeeping).
        turnInFlight: e.turnInFlight || current.members.find((m) => m.session.memberId === e.memberId)?.session.phase === 'IN_TURN',
        sigtermAtMs: e.sigtermAtUnixMs > 0 ? e.sigtermAtUnixMs : undefined,
        exitedAtMs: e.exitedAtUnixMs > 0 ? e.exitedAtUnixMs : undefined,
        exitCode: e.exitCode,
        killed: e.killed,
        containerExists: e.containerPresent,
        writableLayerExists: e.writableLayerPresent,
      }));
      const verdict = decideStopCleanliness({ graceMs, memberIds: current.members.map((m) => m.session.memberId), members });
      const next = transitionGroup(current.lifecycle, { type: 'stopped', verdict }, now);
      if (!next.ok) return undefined;
      const record: GroupRecord = {
        ...current,
        lifecycle: next.value,
        members: current.members.map((m) => ({ ...m, session: onContainerStopped(m.session), turnProcess: undefined })),
        lastCleanStop: verdict.clean ? {
          stoppedAtMs: stoppedAt,
          graceMs,
          members: (evidence?.members ?? []).map((e) => ({ memberId: e.memberId, exitCode: e.exitCode ?? 0, sigtermAtMs: e.sigtermAtUnixMs, exitedAtMs: e.exitedAtUnixMs, stopDurationMs: Math.max(0, e.stopDurationMs) })),
        } : undefined,
        updatedAtMs: now,
      };
      return {
        record,
        events: [{
          type: 'group_stopped', fromState: current.lifecycle.state, toState: record.lifecycle.state,
          reason: verdict.clean ? 'clean' : 'unclean', version: `${record.lifecycle.generation}:${record.stops}:stopped`,
          detail: { hostId: record.lifecycle.hostId, findings: !verdict.clean ? verdict.findings.slice(0, 32).map((f) => `${f.memberId}:${f.reason}`) : [] },
        }],
      };
    });
    if (after === undefined) {
      const cur = (await this.get(groupId)).value;
      if (cur.lifecycle.state === 'STOPPING') throw new CasConflictError(this.ctx.groups.bucket, Keys.group(groupId), 0);
      return cur;
    }
    return after.value;
  }

  /**
   * R-G3: checkpoint a clean-stopped group on its host. Idempotent per (generation, activity
   * version): the id is deterministic and an existing index record is returned as is. `refresh`
   * retakes it for a group that stayed stopped (R-G4 age): see checkpointIdFor.
   */
  async checkpoint(groupId: string, refresh?: number): Promise<CheckpointRecord> {
    const g = (await this.get(groupId)).value;
    const lc = g.lifecycle;
    if (lc.state !== 'STOPPED' || !lc.stop?.clean) {
      throw unwrapRefusal(transitionGroup(lc, { type: 'migration_started', targetHostId: '', assessment: { usable: false, reason: 'no_checkpoint', reasons: ['no_checkpoint'] } }, this.ctx.now()));
    }
    const checkpointId = checkpointIdFor(groupId, lc.generation, lc.activityVersion, refresh);
    if (refresh === undefined && g.latestCheckpointId !== undefined && g.latestCheckpointId !== checkpointId) {
      // A refresh (or the previous placement's checkpoint) of this very state is the latest: it is at
      // least as new as this state's first checkpoint, so latest never moves back to an older one.
      const latest = await this.ctx.checkpoints.get(groupId, g.latestCheckpointId);
      if (latest !== undefined && latest.activityVersion === lc.activityVersion && latest.createdAtMs >= lc.lastActivityAtMs) return latest;
    }
    let record = await this.ctx.checkpoints.get(groupId, checkpointId);
    if (record === undefined) {
      const t0 = this.ctx.now();
      const target = await this.target(lc.hostId, lc.generation);
      // Chunk sweeps wait while this checkpoint may rely on stored chunks no manifest names yet.
      const locks = new ChunkGcLocks(this.ctx);
      await locks.beginCheckpoint(checkpointId, t0 + this.ctx.config.agentCommandTimeoutMs);
      try {
        record = await this.#takeCheckpoint(g, target, checkpointId, t0, refresh === undefined ? 'clean stop' : 'refresh');
      } finally {
        await locks.endCheckpoint(checkpointId).catch((err: unknown) => this.ctx.logger.warn({ checkpointId, err }, 'releasing the checkpoint GC lock failed; it expires at its deadline'));
      }
    }
    await this.ctx.groups.transact(groupId, (current) => {
      if (current === undefined || current.latestCheckpointId === checkpointId) return undefined;
      if (current.lifecycle.generation !== lc.generation || current.lifecycle.activityVersion !== lc.activityVersion) return undefined;
      return { record: { ...current, latestCheckpointId: checkpointId, updatedAtMs: this.ctx.now() } };
    });
    return record;
  }

  /** Command the agent to capture the group's layers, then index the manifest it wrote (R-G3). */
  async #takeCheckpoint(g: GroupRecord, target: AgentTarget, checkpointId: string, t0: number, why: 'clean stop' | 'refresh'): Promise<CheckpointRecord> {
    const groupId = g.groupId;
    const lc = g.lifecycle;
    const stop = g.lastCleanStop;
    try {
      await this.ctx.agents.send(target, CommandIds.checkpoint(checkpointId), {
        $case: 'checkpoint',
        value: {
          groupId,
          checkpointId,
          members: g.members.map((m) => ({ memberId: m.session.memberId, kind: cliKindToProto(m.session.cli), savedLocator: m.session.savedLocator ?? '', nativeSessionPaths: [] })),
          cleanStop: {
            clean: true,
            noTurnInFlight: true,
            graceMs: stop?.graceMs ?? 0,
            stoppedAtUnixMs: stop?.stoppedAtMs ?? lc.lastActivityAtMs,
            members: (stop?.members ?? []).map((s) => ({
              memberId: s.memberId, exitCode: s.exitCode, exitedByItself: true, signal: 'SIGTERM', withinGrace: true, containerPresent: true,
              writableLayerPresent: true, stopDurationMs: s.stopDurationMs, sigtermAtUnixMs: s.sigtermAtMs, exitedAtUnixMs: s.exitedAtMs, killed: false, turnInFlight: false,
            })),
          },
          activityVersion: lc.activityVersion,
          lastCompletedTurnId: '',
          maxManifestSchemaVersion: this.ctx.config.checkpointManifestVersion,
        },
      }, 'checkpoint');
    } catch (err) {
      // The host has none of the group's containers any more (e.g. found by a refresh): recover it.
      if (err instanceof AgentCommandFailed && err.reason === 'group_not_found') await this.containersGone(g);
      // A repeat after the manifest was written (e.g. the agent restarted) finds it already there.
      if (!(err instanceof AgentCommandFailed && err.reason === 'manifest_exists')) throw err;
    }
    const manifest = await readManifest(this.ctx.chunks, lc.hostId, groupId, checkpointId);
    if (manifest === undefined) throw new Unavailable('host_unreachable', `checkpoint ${checkpointId} has no manifest after the agent reported it`, { details: { groupId, checkpointId } });
    const record = recordFromManifest(manifest, lc.activityVersion);
    await this.ctx.checkpoints.create(record);
    this.ctx.metrics.checkpointBytes.inc({ kind: 'layer' }, record.totalBytes);
    this.ctx.metrics.checkpointDuration.observe({ phase: 'capture' }, (this.ctx.now() - t0) / 1000);
    await this.ctx.events.record({
      subjectKind: 'group', subjectId: groupId, type: 'checkpoint_created', reason: why, version: checkpointId,
      detail: { checkpointId, bytes: record.totalBytes, generation: lc.generation, activityVersion: lc.activityVersion, hostId: lc.hostId },
    });
    return record;
  }

  /**
   * The host answered that it has no container of this group at its generation (a command's
   * `group_not_found`, or a begin's fresh inventory listing none of them): the group's
   * writable layers are gone from it (its Docker data dir was replaced, the containers were removed
   * by hand), while the host itself is fine. That is R-G6's lost Docker data for one group: it is
   * marked for an unplanned evacuation, which restores a cleanly STOPPED group from its checkpoint
   * when that is usable (on any READY host) and declares it LOST with the reason otherwise (a
   * running or stopping group: `host_lost_running`). The caller is told to retry, and its retry
   * finds the group moving, then restored (or LOST).
   */
  async containersGone(g: GroupRecord): Promise<never> {
    const lc = g.lifecycle;
    const marked = await markEvacuation(this.ctx, g.groupId, 'unplanned', 'docker_data_lost', { hostId: lc.hostId, generation: lc.generation });
    this.ctx.logger.warn({ groupId: g.groupId, hostId: lc.hostId, generation: lc.generation, state: lc.state, marked }, 'host has none of the group\'s containers: evacuating it as lost Docker data');
    throw new Unavailable('container_missing', `the containers of group ${g.groupId} are gone from ${lc.hostId}; it is being recovered from its checkpoint if it has a usable one, retry shortly`, { details: { groupId: g.groupId, hostId: lc.hostId } });
  }

  /** Best effort: remove the group's containers on a host that no longer owns it (R-H6). */
  async deleteOn(hostId: string, groupId: string, generation: number, reason: string): Promise<void> {
    try {
      const target = await this.target(hostId, generation);
      await this.ctx.agents.send(target, CommandIds.delete(groupId, generation, hostId, reason), { $case: 'deleteGroup', value: { groupId, reason } }, 'deleteGroup', 30_000);
    } catch (err) {
      this.ctx.logger.warn({ err, hostId, groupId, reason }, 'delete on host failed; the host deletes this copy when it re-registers (the record proves it is not needed)');
    }
  }
}

function unwrapRefusal(result: ReturnType<typeof transitionGroup>): Error {
  try {
    unwrap(result);
  } catch (err) {
    return err as Error;
  }
  return new Error('unexpected: transition allowed');
}
