// The migration controller (R-G3..R-G7, R-H4, R-H5, R-R1, R-R3): a keyed reconciler over persisted
// state. A host going away marks each of its groups with an evacuation (the intent, written BEFORE
// anything is done); each reconcile of a marked group then advances it by idempotent steps:
//   planned  : wait (bounded) for no turn in flight → clean stop → checkpoint → choose target →
//              migration_started (CAS) → restore on the target (agent proves it) → migration_completed
//              (CAS, new placement generation) → delete on the source;
//   unplanned: decideOnHostLoss — restore if STOPPED clean with a recent, recoverable checkpoint
//              (every blob re-read and digest-verified), LOST with the reason otherwise.
// A restore the target refuses for the checkpoint's own data (a hostile or corrupt layer, a digest
// mismatch, a bomb) makes the group LOST at once with the agent's reason and message: every host
// would refuse the same bytes. A restore that failed for the host's sake is retried on another
// host a bounded number of times, then LOST restore_failed.
// Which groups to look at comes from the read model (fleet-state.ts) and its change notifications;
// every step decides on the group record as read from the store (or as this replica just wrote it,
// with its revision) and writes by compare-and-set. An unplanned evacuation whose next step is a LOST
// needing no I/O writes the mark and the LOST in one compare-and-set (evacuations.ts). Steps that talk
// to agents or read chunks (stop, checkpoint, verify, restore) take one of `migrationParallelism`
// slots, so the groups queue may run more workers for the cheap decisions. Agent command
// ids are derived from the step (wire/agent-protocol.ts), so a new leader repeating a step gets the
// first answer.
import {
  assessCheckpoint,
  decideAfterRestoreFailure,
  decideOnHostLoss,
  onRestored,
  type CheckpointAssessment,
  type LossReason,
  type RemovalSource,
} from '../core/index.ts';
import { CommandIds, restoreFaultScope } from '../wire/agent-protocol.ts';
import { AgentCommandFailed } from './agent-client.ts';
import { manifestToProto, verifyCheckpoint } from './checkpoints.ts';
import { candidates, describeError, isTerminal } from './fleet.ts';
import { GroupOps, startUnderWay, type GroupOpsDeps } from './group-ops.ts';
import { applyHostEvent } from './hosts.ts';
import { decideEvacuationStep, turnWaitFor } from './evacuation-policy.ts';
import { markEvacuation, markEvacuationRecord, type ImmediateLoss } from './evacuations.ts';
import type { Versioned } from '../store/kv-repository.ts';
import type { ReconcileResult } from './keyed-queue.ts';
import { chooseHost } from './placement.ts';
import type { CheckpointRecord, Evacuation, GroupRecord, HostRecord } from './records.ts';
import { Keys } from './state.ts';

/** What the controller uses: group operations' ports (it runs their steps). */
export type MigrationDeps = GroupOpsDeps;

/** What one step did: `progress` means call again, `waiting` means nothing to do until later. */
export type StepResult = 'progress' | 'waiting' | 'done';

/** A crash point for tests (R-R3): thrown at step boundaries to kill a leader mid-migration. */
export type StepHook = (step: string, groupId: string) => void | Promise<void>;

/** A counting semaphore: at most `limit` holders at once, the others wait in arrival order. */
class Slots {
  #free: number;
  readonly #waiting: (() => void)[] = [];

  constructor(limit: number) {
    this.#free = Math.max(1, limit);
  }

  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.#free > 0) this.#free -= 1;
    else await new Promise<void>((resolve) => this.#waiting.push(resolve));
    try {
      return await fn();
    } finally {
      const next = this.#waiting.shift();
      if (next !== undefined) next(); // the slot passes on directly
      else this.#free += 1;
    }
  }
}

export class MigrationController {
  readonly #ops: GroupOps;
  readonly #inProgress = new Set<string>();
  /** Bounds the steps that talk to agents or read chunks (migrationParallelism). */
  readonly #heavy: Slots;

  constructor(
    private readonly ctx: MigrationDeps,
    private readonly hook: StepHook = () => undefined,
  ) {
    this.#ops = new GroupOps(ctx);
    this.#heavy = new Slots(ctx.config.migrationParallelism);
  }

  /**
   * Reconcile one group: mark it for evacuation when its host is going away, then advance a marked
   * or migrating group as far as it goes now. `requeueAfterMs` when it is waiting (a turn in flight,
   * no eligible host yet, a failed step): look again then. Safe to run repeatedly and from a fresh
   * leader. A group another pass of this replica is advancing (the spot evacuator's save) is looked
   * at again shortly rather than dropped: that pass's last write may already have been heard, so no
   * later change would bring the key back before the slow resync (a spot-noticed group once waited
   * minutes at "planned, 0 attempts" so). The hold is taken before the first await, so two passes
   * never advance one group at once.
   */
  async reconcileGroup(groupId: string): Promise<ReconcileResult> {
    const cached = this.ctx.fleet.group(Keys.group(groupId))?.value;
    if (cached === undefined) return {};
    if (this.#inProgress.has(groupId)) return { requeueAfterMs: this.ctx.config.reconcileIntervalMs };
    this.#inProgress.add(groupId);
    try {
      return await this.#reconcileHeld(groupId, cached);
    } finally {
      this.#inProgress.delete(groupId);
    }
  }

  async #reconcileHeld(groupId: string, cached: GroupRecord): Promise<ReconcileResult> {
    let g: GroupRecord = cached;
    /** The record as just read from or written to the store: the first step decides on it. */
    let known: Versioned<GroupRecord> | undefined;
    if (!isTerminal(g)) {
      const host = this.ctx.fleet.host(Keys.host(g.lifecycle.hostId))?.value;
      const wanted = evacuationFor(host);
      if (wanted !== undefined && g.evacuation?.kind !== wanted.kind && g.evacuation?.kind !== 'unplanned') {
        const marked = await markEvacuationRecord(this.ctx, groupId, wanted.kind, wanted.source, { hostId: g.lifecycle.hostId },
          wanted.kind === 'unplanned' ? (m) => this.#immediateLoss(m) : undefined);
        if (marked !== undefined && marked.value.lifecycle.state === 'LOST') {
          // Marked and declared LOST in one write (#immediateLoss): what #lose counts.
          this.ctx.metrics.migrations.inc({ result: 'lost' });
          return {};
        }
        known = marked ?? await this.ctx.groups.get(groupId);
        if (known === undefined) return {};
        g = known.value;
      }
    }
    if (g.evacuation === undefined && g.lifecycle.state !== 'MIGRATING') return {};
    try {
      for (let i = 0; i < 16; i++) {
        const r = await this.step(groupId, i === 0 ? known : undefined);
        if (r === 'waiting') return { requeueAfterMs: this.ctx.config.reconcileIntervalMs };
        if (r !== 'progress') return {};
      }
      return { requeueAfterMs: 0 };
    } catch (err) {
      this.ctx.logger.warn({ groupId, ...describeError(err) }, 'migration step failed; retried');
      return { requeueAfterMs: this.ctx.config.reconcileIntervalMs };
    }
  }

  /**
   * A draining host that holds nothing any more is removed for this epoch (R-H5). A group whose
   * record fails validation counts as held by the hosts its last valid version named, and one never
   * seen valid by every draining host (nothing proves it is not there): never REMOVED on absence.
   */
  async reconcileDrainingHost(hostId: string): Promise<void> {
    const h = this.ctx.fleet.host(Keys.host(hostId))?.value;
    if (h === undefined || h.lifecycle.state !== 'DRAINING') return;
    if (this.#holdsAny(hostId)) return;
    // The read model may lag a group that has just been placed here: confirm from the store.
    await this.ctx.fleet.sync();
    if (this.#holdsAny(hostId)) return;
    await applyHostEvent(this.ctx.hosts, hostId, { type: 'removed' }, `drained (${h.lifecycle.goingAway ?? 'drain'})`, h.lifecycle.epoch,
      (current) => current.lifecycle.state === 'DRAINING');
  }

  #holdsAny(hostId: string): boolean {
    const { fleet } = this.ctx;
    if (fleet.groupKeysOnHost(hostId).size > 0) return true;
    const invalid = [...fleet.invalidGroupKeysOnHost(hostId), ...fleet.unattributedInvalidGroupKeys()];
    if (invalid.length === 0) return false;
    this.ctx.logger.warn({ hostId, invalidGroupKeys: invalid.slice(0, 8), count: invalid.length }, 'drained host kept: group records that fail validation may be on it (fix or destroy them)');
    return true;
  }

  /**
   * The LOST the next step of the just-marked (unplanned) group `g` would declare without any I/O:
   * decideEvacuationStep says LOST (running, unclean…), or it says plan a restore but the group names
   * no checkpoint, so decideOnHostLoss has nothing to assess. Undefined otherwise (the steps run).
   */
  #immediateLoss(g: GroupRecord): ImmediateLoss | undefined {
    const ev = g.evacuation;
    if (ev === undefined) return undefined;
    const decision = decideEvacuationStep({ lifecycle: g.lifecycle, memberPhases: g.members.map((m) => m.session.phase), evacuation: ev }, this.ctx.now(), turnWaitFor(ev, this.ctx.config));
    if (decision.action === 'lost') return { reason: decision.reason, why: decision.why };
    if (decision.action !== 'plan_restore' || ev.kind !== 'unplanned' || g.latestCheckpointId !== undefined) return undefined;
    const loss = decideOnHostLoss(g.lifecycle, undefined, { attempts: ev.attempts, maxAttempts: this.ctx.config.restoreMaxAttempts });
    // The words #planRestore writes for the same decision.
    return loss.action === 'lost' ? { reason: loss.reason, why: `checkpoint assessment: ${loss.reason}` } : undefined;
  }

  /**
   * Advance one group by one step, deciding on `known` when given (the record this replica just read
   * or wrote, with its revision; every write below is still compare-and-set), else on a fresh read.
   */
  async step(groupId: string, known?: Versioned<GroupRecord>): Promise<StepResult> {
    const current = known ?? await this.ctx.groups.get(groupId);
    if (current === undefined) return 'done';
    const g = current.value;
    const ev = g.evacuation;
    const lc = g.lifecycle;
    const decision = decideEvacuationStep({ lifecycle: lc, memberPhases: g.members.map((m) => m.session.phase), evacuation: ev }, this.ctx.now(), turnWaitFor(ev, this.ctx.config));
    switch (decision.action) {
      case 'none':
        return 'done';
      case 'clear':
        await this.#clearEvacuation(groupId);
        return 'done';
      case 'wait':
        return 'waiting';
      case 'lost':
        return this.#lose(g, decision.reason, decision.why);
      case 'restore':
        return this.#heavy.run(() => this.#restore(g));
      case 'plan_restore':
        return this.#heavy.run(() => this.#planRestore(g, ev!));
      case 'stop':
        await this.#heavy.run(async () => {
          await this.hook('before_stop', groupId);
          await this.#ops.stop(groupId, this.ctx.config.stopGraceMs, `evacuation: ${ev!.source}`);
          await this.hook('after_stop', groupId);
        });
        return 'progress';
    }
  }

  /** STOPPED clean on a departing host: find (or take) a checkpoint, pick a target, write the intent. */
  async #planRestore(g: GroupRecord, ev: Evacuation): Promise<StepResult> {
    const lc = g.lifecycle;
    const now = this.ctx.now();
    // A start of the group got in first (a turn's begin): it runs, then the group is stopped for the
    // move like any running one. Never a restore elsewhere while it may still start here.
    if (startUnderWay(g, now)) return 'waiting';
    const ensured = await this.#ensureCheckpoint(g, ev);
    if (typeof ensured === 'string') return ensured;
    const record = ensured.record;
    // Spot notice: every group of the host is stopped and checkpointed off it first; the restores
    // (which need no source) follow, so they take nothing from the notice's time.
    if (ev.kind === 'planned' && ev.source === 'spot_preemption' && now < this.#spotDeadline(ev) && this.#siblingsUnsaved(ev.sourceHostId, g.groupId)) return 'waiting';

    // Never the source, even one that only lost this group's containers: a migration to the same
    // host is refused by core, and the source's cleanup removes every generation of the group there.
    const exclude = new Set([ev.sourceHostId, lc.hostId, ...ev.triedHostIds]);
    const target = record === undefined ? undefined : chooseHost(candidates(this.ctx.fleet), { members: g.members.length, exclude, imageDigest: record.baseImageDigest, bridgeVersion: record.bridgeVersion });

    let assessment: CheckpointAssessment | undefined;
    if (record !== undefined) {
      // Every blob re-read and digest-verified right before use (R-G4, R-R2).
      const { summary } = await verifyCheckpoint(this.ctx.chunks, record);
      const targetView = target === undefined
        ? { imageDigests: new Set([record.baseImageDigest]), bridgeVersion: record.bridgeVersion }
        : { imageDigests: new Set([target.imageDigest]), bridgeVersion: target.bridgeVersion ?? -1 };
      assessment = assessCheckpoint(
        { groupId: g.groupId, activityVersion: lc.activityVersion, lastActivityAtMs: lc.lastActivityAtMs, memberIds: g.members.map((m) => m.session.memberId) },
        summary, targetView, now, this.ctx.config.checkpointMaxAgeMs,
      );
    }
    const decision = decideOnHostLoss(lc, assessment, { attempts: ev.attempts, maxAttempts: this.ctx.config.restoreMaxAttempts });
    if (decision.action === 'none') return 'done';
    if (decision.action === 'lost') return this.#lose(g, decision.reason, `checkpoint assessment: ${assessment && !assessment.usable ? assessment.reasons.join(',') : decision.reason}`);
    if (target === undefined) {
      return now > ev.deadlineMs ? this.#lose(g, 'no_eligible_host', 'no READY host with the same image and bridge version before the deadline') : 'waiting';
    }
    await this.hook('before_intent', g.groupId);
    const usable = assessment as CheckpointAssessment & { usable: true };
    await this.#ops.transition(g.groupId, { type: 'migration_started', targetHostId: target.hostId, assessment: usable }, `evacuation: ${ev.source}`,
      (c) => c.lifecycle.state === 'STOPPED' && c.lifecycle.generation === lc.generation && c.lifecycle.activityVersion === lc.activityVersion && !startUnderWay(c, this.ctx.now()));
    await this.hook('after_intent', g.groupId);
    return 'progress';
  }

  /**
   * A planned departure's checkpoint (R-G3 "before migration"): the latest when it covers the
   * group's state, else taken now on the still-running source. A StepResult when the step ends here.
   */
  async #ensureCheckpoint(g: GroupRecord, ev: Evacuation): Promise<{ record: CheckpointRecord | undefined } | StepResult> {
    const lc = g.lifecycle;
    let record = g.latestCheckpointId === undefined ? undefined : await this.ctx.checkpoints.get(g.groupId, g.latestCheckpointId);
    if (ev.kind === 'planned' && (record === undefined || record.activityVersion !== lc.activityVersion)) {
      await this.hook('before_checkpoint', g.groupId);
      try {
        record = await this.#ops.checkpoint(g.groupId);
      } catch (err) {
        this.ctx.logger.warn({ groupId: g.groupId, ...describeError(err) }, 'checkpoint on departing host failed');
        // The agent found a member's native session missing from its layer: no retry can bring it back.
        if (err instanceof AgentCommandFailed && err.reason === 'session_files_missing') return this.#lose(g, 'session_files_missing', err.message);
        return this.ctx.now() > ev.deadlineMs ? this.#lose(g, 'no_checkpoint', 'no checkpoint could be taken before the deadline') : 'waiting';
      }
      await this.hook('after_checkpoint', g.groupId);
    }
    return { record };
  }

  /**
   * Spot evacuation, first phase (R-H5, R-G2, R-G3): bring one group of a noticed host to "stopped
   * cleanly and checkpointed off the host" — wait (bounded) for a turn in flight, stop, checkpoint —
   * and no further: restores are the groups queue's, after every group of the host got here.
   * `saved` also for a group already MIGRATING or moved off the host; `lost` when it became LOST.
   */
  async saveBeforeDeparture(groupId: string): Promise<'saved' | 'lost' | 'waiting' | 'busy' | 'none'> {
    if (this.#inProgress.has(groupId)) return 'busy';
    const cached = this.ctx.fleet.group(Keys.group(groupId))?.value;
    if (cached === undefined) return 'none';
    // Held from before the first await (see reconcileGroup): the groups queue looks again later.
    this.#inProgress.add(groupId);
    try {
      const host = this.ctx.fleet.host(Keys.host(cached.lifecycle.hostId))?.value;
      const wanted = evacuationFor(host);
      if (wanted !== undefined && !isTerminal(cached) && cached.evacuation?.kind !== wanted.kind && cached.evacuation?.kind !== 'unplanned') {
        await markEvacuation(this.ctx, groupId, wanted.kind, wanted.source, { hostId: cached.lifecycle.hostId });
      }
      for (let i = 0; i < 8; i++) {
        const g = (await this.ctx.groups.get(groupId))?.value;
        if (g === undefined) return 'none';
        if (g.lifecycle.state === 'LOST') return 'lost';
        if (g.lifecycle.state === 'DESTROYED') return 'none';
        if (g.lifecycle.state === 'MIGRATING') return 'saved';
        const ev = g.evacuation;
        if (ev === undefined) return g.lifecycle.state === 'STOPPED' && g.lifecycle.stop?.clean === true ? 'saved' : 'none';
        const decision = decideEvacuationStep({ lifecycle: g.lifecycle, memberPhases: g.members.map((m) => m.session.phase), evacuation: ev }, this.ctx.now(), turnWaitFor(ev, this.ctx.config));
        switch (decision.action) {
          case 'wait':
            return 'waiting';
          case 'stop':
            await this.hook('before_stop', groupId);
            await this.#ops.stop(groupId, this.ctx.config.stopGraceMs, `evacuation: ${ev.source}`);
            await this.hook('after_stop', groupId);
            continue;
          case 'lost':
            await this.#lose(g, decision.reason, decision.why);
            return 'lost';
          case 'plan_restore': {
            if (ev.kind !== 'planned') return 'none';
            const ensured = await this.#ensureCheckpoint(g, ev);
            if (ensured === 'waiting') return 'waiting';
            if (typeof ensured === 'string') return 'lost';
            return ensured.record !== undefined ? 'saved' : 'waiting';
          }
          default:
            return 'none';
        }
      }
      return 'waiting';
    } finally {
      this.#inProgress.delete(groupId);
    }
  }

  /** When a spot evacuation's notice runs out (the notice's own deadline when known, else the configured notice). */
  #spotDeadline(ev: Evacuation): number {
    return this.spotDeadlineOf(ev.sourceHostId) ?? ev.startedAtMs + this.ctx.config.spotNoticeMs;
  }

  /** Set by the spot evacuator: the deadline of a host's notice, when it knows it. */
  spotDeadlineOf: (hostId: string) => number | undefined = () => undefined;

  /** Whether another live group on `hostId` is not yet stopped cleanly with a checkpoint of its state. */
  #siblingsUnsaved(hostId: string, except: string): boolean {
    for (const key of this.ctx.fleet.groupKeysOnHost(hostId)) {
      const g = this.ctx.fleet.group(key)?.value;
      if (g === undefined || g.groupId === except || isTerminal(g) || g.lifecycle.hostId !== hostId) continue;
      if (g.lifecycle.state === 'MIGRATING') continue;
      if (g.lifecycle.state !== 'STOPPED' || g.lifecycle.stop?.clean !== true) return true;
      const latest = g.latestCheckpointId === undefined ? undefined : this.ctx.fleet.checkpoint(Keys.checkpoint(g.groupId, g.latestCheckpointId));
      if (latest?.activityVersion !== g.lifecycle.activityVersion) return true;
    }
    return false;
  }

  /** MIGRATING: restore on the target; prove it; switch placement by CAS (R-G5). */
  async #restore(g: GroupRecord): Promise<StepResult> {
    const lc = g.lifecycle;
    const mig = lc.migration!;
    const ev = g.evacuation;
    const started = this.ctx.now();
    const target = (await this.ctx.hosts.get(mig.targetHostId))?.value;
    const record = await this.ctx.checkpoints.get(g.groupId, mig.checkpointId);
    const newGeneration = lc.generation + 1;
    let failure: string | undefined;
    /** Set when the target refused the checkpoint's own data: no other host can do better. */
    let refusal: AgentCommandFailed | undefined;
    let restored: { memberId: string; containerId: string }[] = [];
    if (target === undefined || target.lifecycle.state !== 'READY') failure = `target ${mig.targetHostId} is ${target?.lifecycle.state ?? 'gone'}`;
    else if (record === undefined) failure = 'checkpoint index record missing';
    else {
      const { summary, manifest } = await verifyCheckpoint(this.ctx.chunks, record);
      if (manifest === undefined || summary.members.some((m) => !m.blobPresent || !m.digestVerified)) {
        // Corrupted since it was assessed: never restore from it (R-R2).
        return this.#lose(g, 'checkpoint_corrupt', 'a checkpoint blob failed verification before restore');
      }
      await this.hook('before_restore', g.groupId);
      try {
        const res = await this.ctx.agents.send(
          { hostId: target.hostId, epoch: target.lifecycle.epoch, generation: newGeneration },
          CommandIds.restore(mig.checkpointId, target.hostId, newGeneration),
          { $case: 'restore', value: { groupId: g.groupId, manifest: manifestToProto(manifest, record) } },
          'restore',
        );
        if (!res.verified || res.members.some((m) => !m.sessionFilesPresent)) failure = `restore not verified (missing: ${res.members.flatMap((m) => m.missingPaths).slice(0, 4).join(',')})`;
        restored = res.members.map((m) => ({ memberId: m.memberId, containerId: m.containerId }));
      } catch (err) {
        failure = err instanceof AgentCommandFailed ? `${err.outcome}: ${err.reason}: ${err.detail}` : describeError(err).message as string;
        if (err instanceof AgentCommandFailed && restoreFaultScope(err.reason) === 'checkpoint') refusal = err;
      }
      await this.hook('after_restore', g.groupId);
    }

    if (failure === undefined) {
      const done = await this.#ops.transition(g.groupId, { type: 'migration_completed', targetHostId: mig.targetHostId }, `restored from ${mig.checkpointId}`,
        (c) => c.lifecycle.state === 'MIGRATING' && c.lifecycle.generation === lc.generation && c.lifecycle.migration?.targetHostId === mig.targetHostId,
        (c) => ({
          evacuation: undefined,
          members: c.members.map((m) => ({ ...m, session: onRestored(m.session), turnProcess: undefined, containerId: restored.find((r) => r.memberId === m.session.memberId)?.containerId ?? m.containerId })),
        }));
      if (done !== undefined) {
        const seconds = (this.ctx.now() - (ev?.startedAtMs ?? started)) / 1000;
        this.ctx.metrics.migrations.inc({ result: 'succeeded' });
        this.ctx.metrics.migrationDuration.observe({ result: 'succeeded' }, seconds);
        this.ctx.metrics.checkpointDuration.observe({ phase: 'restore' }, (this.ctx.now() - started) / 1000);
        await this.hook('after_switch', g.groupId);
        // The source no longer owns the group (R-R6: the record now proves it). A planned source is
        // alive; an unplanned one may be back: it registered again while the group was moving, and
        // that registration kept its copy (the group was not placed elsewhere yet) — which may even
        // run, if a start command reached it late. So the copy is deleted now wherever the source
        // takes commands; a source that does not deletes it when it registers again (R-H6).
        if (ev?.kind === 'planned' || await this.#takesCommands(lc.hostId)) await this.#ops.deleteOn(lc.hostId, g.groupId, lc.generation, 'migrated');
      }
      return 'done';
    }

    // Roll back to STOPPED on the source and try elsewhere, within the budget (R-G5) — unless the
    // checkpoint's own data was refused, which every host would refuse too.
    this.ctx.logger.warn({ groupId: g.groupId, target: mig.targetHostId, failure }, 'restore failed');
    this.ctx.metrics.migrations.inc({ result: refusal !== undefined ? 'checkpoint_refused' : 'restore_failed' });
    const attempts = (ev?.attempts ?? 0) + 1;
    const next = decideAfterRestoreFailure({ attempts, maxAttempts: this.ctx.config.restoreMaxAttempts });
    const now = this.ctx.now();
    const abortWhy = `restore on ${mig.targetHostId} failed: ${failure}`;
    const isThisMigration = (c: GroupRecord): boolean => c.lifecycle.state === 'MIGRATING' && c.lifecycle.generation === lc.generation;
    if (refusal !== undefined) {
      await this.hook('before_lost', g.groupId);
      const lost = await this.#ops.abortAsLost(g.groupId, isThisMigration, abortWhy, 'checkpoint_corrupt',
        `the restore on ${mig.targetHostId} refused checkpoint ${mig.checkpointId}: ${refusal.reason}: ${refusal.detail}`);
      if (lost === undefined) return 'progress';
      this.ctx.metrics.migrations.inc({ result: 'lost' });
      // LOST on the source's placement: the record proves the target's copy is not the group's (R-R6).
      if (target !== undefined && target.lifecycle.state === 'READY') await this.#ops.deleteOn(target.hostId, g.groupId, newGeneration, 'restore_failed');
      return 'done';
    }
    const aborted = await this.#ops.transition(g.groupId, { type: 'migration_aborted' }, abortWhy, isThisMigration,
      (c) => ({
        evacuation: {
          kind: c.evacuation?.kind ?? 'planned',
          source: c.evacuation?.source ?? 'operator_drain',
          sourceHostId: c.evacuation?.sourceHostId ?? lc.hostId,
          startedAtMs: c.evacuation?.startedAtMs ?? now,
          deadlineMs: c.evacuation?.deadlineMs ?? now + this.ctx.config.evacuationDeadlineMs,
          attempts,
          triedHostIds: [...(c.evacuation?.triedHostIds ?? []), mig.targetHostId].slice(-32),
        },
      }));
    // The target's copy is deleted only once the abort is recorded: from then on the record proves it
    // is not the group's placement (R-R6).
    if (aborted !== undefined && target !== undefined && target.lifecycle.state === 'READY') await this.#ops.deleteOn(target.hostId, g.groupId, newGeneration, 'restore_failed');
    if (aborted !== undefined && next.action === 'lost') return this.#lose(aborted, 'restore_failed', `restore failed on ${attempts} host(s); last: ${failure}`);
    return 'progress';
  }

  async #takesCommands(hostId: string): Promise<boolean> {
    const state = (await this.ctx.hosts.get(hostId))?.value.lifecycle.state;
    return state === 'READY' || state === 'SUSPECT' || state === 'DRAINING';
  }

  async #lose(g: GroupRecord, reason: LossReason, why: string): Promise<StepResult> {
    await this.hook('before_lost', g.groupId);
    await this.#ops.declareLost(g.groupId, reason, why);
    this.ctx.metrics.migrations.inc({ result: 'lost' });
    return 'done';
  }

  async #clearEvacuation(groupId: string): Promise<void> {
    await this.ctx.groups.transact(groupId, (g) => (g === undefined || g.evacuation === undefined ? undefined : { record: { ...g, evacuation: undefined, updatedAtMs: this.ctx.now() } }));
  }
}

/** Which evacuation a host's state calls for (R-H4, R-H5, R-G6). */
export function evacuationFor(host: HostRecord | undefined): { kind: Evacuation['kind']; source: RemovalSource } | undefined {
  // No record (yet): nothing proves the host is gone — the read model may simply not have it yet (R-R6).
  if (host === undefined) return undefined;
  const lc = host.lifecycle;
  switch (lc.state) {
    case 'DEAD': return { kind: 'unplanned', source: lc.goingAway ?? 'heartbeat_lost' };
    case 'DRAINING': return { kind: 'planned', source: lc.goingAway ?? 'operator_drain' };
    case 'REMOVED': return { kind: 'unplanned', source: lc.goingAway ?? 'operator_remove' };
    default: return undefined;
  }
}
