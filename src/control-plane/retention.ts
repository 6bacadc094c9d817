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
import { selectCheckpointsToDelete } from '../core/index.ts';
import type { ChunkStore } from '../store/chunk-store.ts';
import { readManifest } from './checkpoints.ts';
import { ChunkGcLocks } from './chunk-gc-locks.ts';
import { describeError, listGroups } from './fleet.ts';
import { Keys, type ControlPlaneContext } from './state.ts';

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

  async all(chunks: ChunkStore): Promise<Map<string, { readonly checkpointId: string; readonly digests: readonly string[] }>> {
    const out = new Map<string, { checkpointId: string; digests: readonly string[] }>();
    for (const m of await chunks.listManifests()) {
      const id = `${m.hostId}/${m.groupId}/${m.checkpointId}`;
      let digests = this.#digests.get(id);
      if (digests === undefined) {
        const manifest = await readManifest(chunks, m.hostId, m.groupId, m.checkpointId);
        // A manifest that does not parse references nothing (and is never restored from).
        digests = (manifest?.members ?? []).flatMap((member) => member.layer.chunks.map((c) => c.digest));
        this.#digests.set(id, digests);
      }
      out.set(id, { checkpointId: m.checkpointId, digests });
    }
    for (const id of this.#digests.keys()) if (!out.has(id)) this.#digests.delete(id);
    return out;
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

export async function collectCheckpoints(ctx: ControlPlaneContext, cache = new ManifestDigestCache(), options: CollectOptions = {}): Promise<CollectResult> {
  const groups = (await listGroups(ctx)).map((e) => e.value);
  const { entries } = await ctx.repos.checkpoints.list();
  const byGroup = new Map(groups.map((g) => [g.groupId, g]));
  const gone = new Set<string>();
  for (const e of entries) {
    const g = byGroup.get(e.value.groupId);
    if (g === undefined || g.lifecycle.state === 'DESTROYED' || g.lifecycle.state === 'LOST') gone.add(e.value.groupId);
  }
  const pinned = new Set<string>();
  for (const g of groups) {
    if (g.latestCheckpointId !== undefined) pinned.add(g.latestCheckpointId);
    if (g.lifecycle.migration !== undefined) pinned.add(g.lifecycle.migration.checkpointId);
  }
  const doomed = new Set(selectCheckpointsToDelete(entries.map((e) => ({ checkpointId: e.value.checkpointId, groupId: e.value.groupId, createdAtMs: e.value.createdAtMs, valid: true })), ctx.config.checkpointKeep, gone, pinned));
  if (doomed.size === 0 && options.fullSweep !== true) {
    ctx.metrics.gcPasses.inc({ result: 'idle' });
    return { deleted: [], sweptChunks: 0, deferred: false };
  }

  const result = await new ChunkGcLocks(ctx).trySweep(SWEEP_BUDGET_MS, async (inTime) => {
    // Under the lock: no checkpoint can start relying on a chunk until we are done.
    const manifests = await cache.all(ctx.chunks);
    const referenced = new Set<string>();
    for (const m of manifests.values()) if (!doomed.has(m.checkpointId)) for (const d of m.digests) referenced.add(d);
    const deleted: string[] = [];
    let sweptChunks = 0;
    for (const e of entries) {
      if (!doomed.has(e.value.checkpointId)) continue;
      const { sourceHostId, groupId, checkpointId } = e.value;
      try {
        for (const d of manifests.get(`${sourceHostId}/${groupId}/${checkpointId}`)?.digests ?? []) {
          if (referenced.has(d)) continue;
          if (!inTime()) return { deleted, sweptChunks };
          await ctx.chunks.delete(d);
          referenced.add(d); // shared with another doomed checkpoint: deleted once
          sweptChunks += 1;
        }
        if (!inTime()) return { deleted, sweptChunks };
        await ctx.chunks.deleteManifest(sourceHostId, groupId, checkpointId);
        await ctx.repos.checkpoints.delete(Keys.checkpoint(groupId, checkpointId), e.revision);
        deleted.push(checkpointId);
        await ctx.events.record({ subjectKind: 'group', subjectId: groupId, type: 'checkpoint_deleted', reason: gone.has(groupId) ? 'group_gone' : 'retention', version: checkpointId, detail: { checkpointId } });
      } catch (err) {
        ctx.logger.warn({ checkpointId, ...describeError(err) }, 'checkpoint deletion failed; retried next pass');
      }
    }
    if (options.fullSweep === true) {
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
