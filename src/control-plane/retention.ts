// Checkpoint retention and garbage collection (R-G7): keep the newest N valid checkpoints per live
// group (core selectCheckpointsToDelete), never one pinned by a migration or named as a group's
// latest; delete the rest and those of destroyed/lost groups: the chunks no other manifest
// references (chunks are shared across checkpoints and groups by digest), then the manifest, then
// the index record. All of it runs under the sweep lock of chunk-gc-locks.ts, so no checkpoint in
// progress can come to rely on a chunk while it is deleted; when a checkpoint is in progress the
// pass does nothing and the next one tries again.
//
// Order per checkpoint: chunks, manifest, index. Interrupted anywhere (crash, sweep budget spent),
// the checkpoint is still doomed on the next pass and the rest is finished then; a doomed checkpoint
// is never pinned again (a group's latest only moves to newer ones), so its missing chunks harm no
// restore. "Referenced" counts every manifest in the store, indexed or not: a checkpoint whose
// indexing was interrupted is indexed on retry and needs its chunks.
//
// Which checkpoints and groups exist is read from the read model (fleet-state.ts), brought up to date
// with the store first; a checkpoint is deleted by the revision read from the store. A group whose
// record is absent from the model keeps its checkpoints (absence proves nothing, R-R6); a LOST group
// keeps them for the LOST retention period (an operator may want to recover it by hand).
// The same pass reports R-G4 exposure (checkpointExposure). And it keeps that exposure bounded: a group that stays cleanly STOPPED never
// gets a new checkpoint by itself, so the one it has would age past the maximum and a host loss
// would make the group LOST `stale_checkpoint` (idle conversations are the common case). Such
// checkpoints are retaken once they are older than a fraction of the maximum (refreshCheckpoints);
// the retake is incremental (chunks dedup by digest) and the old one falls to retention.
//
// The pass reads the read model's retention indexes (fleet-state.ts): the checkpoints of the groups
// that may have some to delete, and per clean-STOPPED group when its usable checkpoint was taken, so
// at 100,000 groups it copies, maps and sorts no fleet-wide list (bench/scale).
import { restorableFromCheckpoint, selectCheckpointsToDelete, usableCheckpointTakenAt } from '../core/index.ts';
import type { ChunkStore } from '../store/chunk-store.ts';
import type { CheckpointRecord, GroupRecord } from './records.ts';
import { readManifest } from './checkpoints.ts';
import { ChunkGcLocks } from './chunk-gc-locks.ts';
import { describeError } from './fleet.ts';
import { Keys } from './keys.ts';
import type { GroupOps } from './group-ops.ts';
import type { ControlPlaneDeps } from './state.ts';

export type RetentionDeps = Pick<ControlPlaneDeps, 'config' | 'fleet' | 'checkpoints' | 'chunks' | 'gcLocks' | 'events' | 'metrics' | 'logger' | 'now' | 'replicaId'>;

/** A group whose checkpoints may all go: destroyed, or LOST past its retention (never: absent). */
export function groupGone(g: Pick<GroupRecord, 'lifecycle' | 'lostAtMs'>, nowMs: number, lostRetentionMs: number): boolean {
  if (g.lifecycle.state === 'DESTROYED') return true;
  if (g.lifecycle.state !== 'LOST') return false;
  return lostRetentionMs > 0 && g.lostAtMs !== undefined && nowMs >= g.lostAtMs + lostRetentionMs;
}

/** How long one sweep may hold the lock (checkpoints wait meanwhile); the rest waits for the next pass. */
export const SWEEP_BUDGET_MS = 30_000;

export interface CollectResult {
  /** Checkpoints deleted (index record gone). */
  readonly deleted: string[];
  /** Chunks deleted. */
  readonly sweptChunks: number;
  /** True when the pass did nothing because a checkpoint was in progress (or another sweep ran). */
  readonly deferred: boolean;
}

/**
 * Chunk digests of stored manifests, by manifest subject. Manifests are write-once, so a parsed
 * one stays valid until deleted; each pass reads only manifests it has not seen.
 */
export class ManifestDigestCache {
  readonly #digests = new Map<string, readonly string[]>();

  /**
   * `unreadable` counts stored manifests whose chunks cannot be known (a subject or a body this
   * version cannot parse, e.g. written by an older one): while any exists, no chunk may be deleted,
   * since one of them might need it.
   */
  async all(chunks: ChunkStore): Promise<{ byId: Map<string, { readonly checkpointId: string; readonly digests: readonly string[] }>; unreadable: number }> {
    const out = new Map<string, { checkpointId: string; digests: readonly string[] }>();
    const listed = await chunks.listManifests();
    let unreadable = listed.unrecognized;
    for (const m of listed) {
      const id = `${m.hostId}/${m.groupId}/${m.checkpointId}`;
      let digests = this.#digests.get(id);
      if (digests === undefined) {
        const manifest = await readManifest(chunks, m.hostId, m.groupId, m.checkpointId);
        if (manifest === undefined) {
          // Not parsed (never restored from either), but its chunks are unknown: not cached, counted.
          unreadable += 1;
          out.set(id, { checkpointId: m.checkpointId, digests: [] });
          continue;
        }
        digests = manifest.members.flatMap((member) => member.layer.chunks.map((c) => c.digest));
        this.#digests.set(id, digests);
      }
      out.set(id, { checkpointId: m.checkpointId, digests });
    }
    for (const id of this.#digests.keys()) if (!out.has(id)) this.#digests.delete(id);
    return { byId: out, unreadable };
  }
}

export interface CollectOptions {
  /**
   * Also delete every chunk no stored manifest references: the uploads of checkpoints that never
   * wrote a manifest (failed, deadline passed, agent crashed). Lists every chunk, so the leader
   * does it less often than the retention pass.
   */
  readonly fullSweep?: boolean;
}

/** What an unplanned host loss would find, checkpoint-wise, for the groups a checkpoint can save. */
export interface CheckpointExposure {
  /**
   * Over the clean-STOPPED groups that have one, the age (ms) of the checkpoint a host loss would
   * restore from; the oldest of them, i.e. the group closest to (or past) the maximum age, after
   * which it would be LOST `stale_checkpoint`. 0 when no such group has one.
   */
  readonly oldestAgeMs: number;
  /**
   * Clean-STOPPED groups without such a checkpoint (none taken, taken before the group's last
   * activity, or its index record is gone): a host loss would make them LOST `no_checkpoint` /
   * `stale_checkpoint` whatever their age, so they are counted here instead of given an age.
   */
  readonly withoutCheckpoint: number;
}

/**
 * R-G4 exposure of the fleet at `nowMs`. Only groups that are STOPPED after a clean stop count:
 * those are the groups R-G6 restores from a checkpoint. RUNNING/STOPPING groups would be LOST
 * `host_lost_running` and unclean ones `unclean_stop` whatever their checkpoints; MIGRATING groups
 * are being restored (a failure is reported as LOST). The checkpoint considered is the group's
 * latest, as in the migration controller, and only if it covers the group's current state (its
 * activity version, taken after the last activity); digests are verified at restore time, not here.
 */
export function checkpointExposure(
  groups: readonly Pick<GroupRecord, 'groupId' | 'lifecycle' | 'latestCheckpointId'>[],
  checkpoints: readonly Pick<CheckpointRecord, 'groupId' | 'checkpointId' | 'activityVersion' | 'createdAtMs'>[],
  nowMs: number,
): CheckpointExposure {
  return exposureOf(restorableIndex(groups, checkpoints), nowMs);
}

/**
 * Per clean-STOPPED group id: when its usable latest checkpoint was taken, or null (the form the read
 * model keeps incrementally, FleetState.restorableCheckpoints, here built from lists).
 */
function restorableIndex(
  groups: readonly Pick<GroupRecord, 'groupId' | 'lifecycle' | 'latestCheckpointId'>[],
  checkpoints: readonly Pick<CheckpointRecord, 'groupId' | 'checkpointId' | 'activityVersion' | 'createdAtMs'>[],
): Map<string, number | null> {
  const byKey = new Map(checkpoints.map((c) => [`${c.groupId}/${c.checkpointId}`, c]));
  const out = new Map<string, number | null>();
  for (const g of groups) {
    if (!restorableFromCheckpoint(g.lifecycle)) continue;
    const c = g.latestCheckpointId === undefined ? undefined : byKey.get(`${g.groupId}/${g.latestCheckpointId}`);
    out.set(g.groupId, usableCheckpointTakenAt(g.lifecycle, c) ?? null);
  }
  return out;
}

/** Exposure from the per-group index: one walk over its values, no allocation per group. */
export function exposureOf(restorable: ReadonlyMap<string, number | null>, nowMs: number): CheckpointExposure {
  let oldestAgeMs = 0;
  let withoutCheckpoint = 0;
  for (const takenAtMs of restorable.values()) {
    if (takenAtMs === null) withoutCheckpoint += 1;
    else oldestAgeMs = Math.max(oldestAgeMs, nowMs - takenAtMs);
  }
  return { oldestAgeMs, withoutCheckpoint };
}

/** A group whose checkpoint is due for a refresh, and the refresh period (part of the new id). */
export interface RefreshDue {
  readonly groupId: string;
  readonly ageMs: number;
  readonly period: number;
}

/**
 * The clean-STOPPED groups (not moving) whose usable checkpoint is older than `refreshAfterMs`,
 * oldest first, at most `limit`. Groups with no usable checkpoint are not refreshed: their state
 * was never captured cleanly, and checkpointExposure counts them for the alert instead.
 */
export function checkpointsDueForRefresh(
  groups: readonly Pick<GroupRecord, 'groupId' | 'lifecycle' | 'latestCheckpointId' | 'evacuation'>[],
  readyHostIds: ReadonlySet<string>,
  checkpoints: readonly Pick<CheckpointRecord, 'groupId' | 'checkpointId' | 'activityVersion' | 'createdAtMs'>[],
  nowMs: number,
  refreshAfterMs: number,
  limit: number,
): RefreshDue[] {
  if (!(refreshAfterMs > 0)) return [];
  const byId = new Map(groups.map((g) => [g.groupId, g]));
  return dueForRefresh(restorableIndex(groups, checkpoints), (id) => byId.get(id), (h) => readyHostIds.has(h), nowMs, refreshAfterMs, limit);
}

/**
 * checkpointsDueForRefresh over the per-group index (keyed as `groupOf` looks groups up): only the
 * groups whose usable checkpoint is past the refresh age are looked at and sorted.
 */
export function dueForRefresh(
  restorable: ReadonlyMap<string, number | null>,
  groupOf: (key: string) => Pick<GroupRecord, 'groupId' | 'lifecycle' | 'evacuation'> | undefined,
  hostReady: (hostId: string) => boolean,
  nowMs: number,
  refreshAfterMs: number,
  limit: number,
): RefreshDue[] {
  if (!(refreshAfterMs > 0)) return [];
  const due: RefreshDue[] = [];
  for (const [key, takenAtMs] of restorable) {
    if (takenAtMs === null || !(nowMs - takenAtMs > refreshAfterMs)) continue;
    const g = groupOf(key);
    if (g === undefined) continue;
    const lc = g.lifecycle;
    if (!restorableFromCheckpoint(lc) || lc.migration !== undefined || g.evacuation !== undefined) continue;
    // Only a READY host is asked: a silent one would hold the refresh for a whole command timeout.
    if (!hostReady(lc.hostId)) continue;
    due.push({ groupId: g.groupId, ageMs: nowMs - takenAtMs, period: Math.floor(nowMs / refreshAfterMs) });
  }
  return due.sort((a, b) => b.ageMs - a.ageMs).slice(0, limit);
}

/**
 * Retake the due checkpoints (checkpointsDueForRefresh), one at a time, while `stillLeader()`. A
 * failure (host busy or unreachable, layers changed) is logged and counted; the group is due again
 * next pass, and if its checkpoint does age out, the exposure gauge and its alert say so.
 */
export async function refreshCheckpoints(ctx: RetentionDeps, ops: GroupOps, stillLeader: () => boolean = () => true): Promise<number> {
  const refreshAfterMs = ctx.config.checkpointMaxAgeMs * ctx.config.checkpointRefreshFraction;
  if (refreshAfterMs <= 0) return 0;
  await ctx.fleet.sync();
  const fleet = ctx.fleet;
  const hostReady = (hostId: string): boolean => fleet.host(Keys.host(hostId))?.value.lifecycle.state === 'READY';
  const dueNow = dueForRefresh(fleet.restorableCheckpoints(), (key) => fleet.group(key)?.value, hostReady, ctx.now(), refreshAfterMs, ctx.config.checkpointRefreshPerPass);
  let refreshed = 0;
  for (const due of dueNow) {
    if (!stillLeader()) break;
    try {
      await ops.checkpoint(due.groupId, due.period);
      ctx.metrics.checkpointRefreshes.inc({ result: 'ok' });
      refreshed += 1;
    } catch (err) {
      ctx.metrics.checkpointRefreshes.inc({ result: 'failed' });
      ctx.logger.warn({ groupId: due.groupId, ageMs: due.ageMs, ...describeError(err) }, 'checkpoint refresh failed; retried next pass');
    }
  }
  return refreshed;
}

export async function collectCheckpoints(ctx: RetentionDeps, cache = new ManifestDigestCache(), options: CollectOptions = {}): Promise<CollectResult> {
  await ctx.fleet.sync();
  const fleet = ctx.fleet;
  const now = ctx.now();
  const exposure = exposureOf(fleet.restorableCheckpoints(), now);
  ctx.metrics.checkpointAge.set(Math.max(0, exposure.oldestAgeMs) / 1000);
  ctx.metrics.groupsWithoutCheckpoint.set(exposure.withoutCheckpoint);
  ctx.metrics.checkpointMaxAge.set(ctx.config.checkpointMaxAgeMs / 1000);
  // Only the candidate groups' checkpoints (every checkpoint of each): the others have none to delete.
  const entries: { key: string; value: CheckpointRecord }[] = [];
  const gone = new Set<string>();
  const pinned = new Set<string>();
  for (const groupKey of fleet.cleanupCandidateGroupKeys()) {
    for (const e of fleet.checkpointEntriesOf(groupKey)) {
      entries.push({ key: e.key, value: e.record });
      if (fleet.checkpointPinned(e.record.checkpointId)) pinned.add(e.record.checkpointId);
      const g = fleet.group(Keys.group(e.record.groupId))?.value;
      // A checkpoint whose group record the model does not hold is kept: that proves nothing (R-R6).
      if (g !== undefined && groupGone(g, now, ctx.config.lostRetentionMs)) gone.add(e.record.groupId);
    }
  }
  const doomed = new Set(selectCheckpointsToDelete(entries.map((e) => ({ checkpointId: e.value.checkpointId, groupId: e.value.groupId, createdAtMs: e.value.createdAtMs, valid: true })), ctx.config.checkpointKeep, gone, pinned));
  if (doomed.size === 0 && options.fullSweep !== true) {
    ctx.metrics.gcPasses.inc({ result: 'idle' });
    return { deleted: [], sweptChunks: 0, deferred: false };
  }

  const result = await new ChunkGcLocks(ctx).trySweep(SWEEP_BUDGET_MS, async (inTime) => {
    // Under the lock: no checkpoint can start relying on a chunk until we are done.
    const { byId: manifests, unreadable } = await cache.all(ctx.chunks);
    // A manifest whose chunks cannot be known might need any chunk: delete none (the doomed
    // checkpoints' manifests and records still go; their chunks wait for a later pass).
    const chunksSafe = unreadable === 0;
    if (!chunksSafe) ctx.logger.warn({ unreadable }, 'stored manifests this version cannot read: no chunk is deleted until they are gone or readable');
    const referenced = new Set<string>();
    for (const m of manifests.values()) if (!doomed.has(m.checkpointId)) for (const d of m.digests) referenced.add(d);
    const deleted: string[] = [];
    let sweptChunks = 0;
    for (const e of entries) {
      if (!doomed.has(e.value.checkpointId)) continue;
      const { sourceHostId, groupId, checkpointId } = e.value;
      try {
        for (const d of chunksSafe ? manifests.get(`${sourceHostId}/${groupId}/${checkpointId}`)?.digests ?? [] : []) {
          if (referenced.has(d)) continue;
          if (!inTime()) return { deleted, sweptChunks };
          await ctx.chunks.delete(d);
          referenced.add(d); // shared with another doomed checkpoint: deleted once
          sweptChunks += 1;
        }
        if (!inTime()) return { deleted, sweptChunks };
        await ctx.chunks.deleteManifest(sourceHostId, groupId, checkpointId);
        const stored = await ctx.checkpoints.getVersioned(e.key);
        if (stored !== undefined) await ctx.checkpoints.delete(e.key, stored.revision);
        deleted.push(checkpointId);
        await ctx.events.record({ subjectKind: 'group', subjectId: groupId, type: 'checkpoint_deleted', reason: gone.has(groupId) ? 'group_gone' : 'retention', version: checkpointId, detail: { checkpointId } });
      } catch (err) {
        ctx.logger.warn({ checkpointId, ...describeError(err) }, 'checkpoint deletion failed; retried next pass');
      }
    }
    if (options.fullSweep === true && chunksSafe) {
      // Still under the lock, every chunk a manifest does not name is garbage: no checkpoint that
      // could come to rely on it is in progress. `referenced` holds every kept manifest's chunks.
      for (const d of await ctx.chunks.listChunkDigests()) {
        if (referenced.has(d)) continue;
        if (!inTime()) break;
        await ctx.chunks.delete(d);
        sweptChunks += 1;
      }
    }
    return { deleted, sweptChunks };
  });
  if (result === undefined) {
    ctx.metrics.gcPasses.inc({ result: 'deferred' });
    ctx.logger.info({ doomed: doomed.size, fullSweep: options.fullSweep === true }, 'checkpoint GC deferred: a checkpoint is in progress');
    return { deleted: [], sweptChunks: 0, deferred: true };
  }
  ctx.metrics.gcPasses.inc({ result: 'swept' });
  ctx.metrics.gcDeleted.inc({ kind: 'checkpoint' }, result.deleted.length);
  ctx.metrics.gcDeleted.inc({ kind: 'chunk' }, result.sweptChunks);
  if (result.deleted.length > 0 || result.sweptChunks > 0) ctx.logger.info(result, 'checkpoint GC');
  return { ...result, deferred: false };
}
