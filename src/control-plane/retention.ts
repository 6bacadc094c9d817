// Checkpoint retention and garbage collection (R-G7): keep the newest N valid checkpoints per live
// group (core selectCheckpointsToDelete), never one pinned by a migration or named as a group's
// latest; delete the rest and those of destroyed/lost groups: index record, manifest, and the
// chunks no remaining manifest references (chunks are shared across checkpoints by digest).
import { selectCheckpointsToDelete } from '../core/index.ts';
import { readManifest } from './checkpoints.ts';
import { describeError, listGroups } from './fleet.ts';
import { Keys, type ControlPlaneContext } from './state.ts';

export async function collectCheckpoints(ctx: ControlPlaneContext): Promise<{ deleted: string[] }> {
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
  if (doomed.size === 0) return { deleted: [] };

  // Digests still referenced by the checkpoints we keep.
  const keep = new Set<string>();
  const doomedDigests = new Set<string>();
  for (const e of entries) {
    const m = await readManifest(ctx.chunks, e.value.sourceHostId, e.value.groupId, e.value.checkpointId);
    for (const member of m?.members ?? []) for (const c of member.layer.chunks) (doomed.has(e.value.checkpointId) ? doomedDigests : keep).add(c.digest);
  }
  const deleted: string[] = [];
  for (const e of entries) {
    if (!doomed.has(e.value.checkpointId)) continue;
    try {
      await ctx.chunks.deleteManifest(e.value.sourceHostId, e.value.groupId, e.value.checkpointId);
      await ctx.repos.checkpoints.delete(Keys.checkpoint(e.value.groupId, e.value.checkpointId), e.revision);
      deleted.push(e.value.checkpointId);
      await ctx.events.record({ subjectKind: 'group', subjectId: e.value.groupId, type: 'checkpoint_deleted', reason: gone.has(e.value.groupId) ? 'group_gone' : 'retention', version: e.value.checkpointId, detail: { checkpointId: e.value.checkpointId } });
    } catch (err) {
      ctx.logger.warn({ checkpointId: e.value.checkpointId, ...describeError(err) }, 'checkpoint deletion failed; retried next pass');
    }
  }
  for (const d of doomedDigests) {
    if (keep.has(d)) continue;
    try {
      await ctx.chunks.delete(d);
    } catch (err) {
      ctx.logger.warn({ digest: d, ...describeError(err) }, 'chunk deletion failed');
    }
  }
  return { deleted };
}
