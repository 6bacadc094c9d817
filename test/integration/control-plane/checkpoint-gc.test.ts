// Checkpoint retention and chunk garbage collection (R-G7) with a real control plane, NATS, dockerd
// host and agent, and its exclusion from checkpoints in progress (control-plane/chunk-gc-locks.ts):
// - with keep = 1, older checkpoints go: their unshared chunks, manifest and index record; every
//   chunk the kept checkpoint references stays and it still verifies digest by digest; a full
//   sweep also removes chunks no manifest names (uploads of checkpoints that never finished);
// - a checkpoint in progress defers the whole pass (nothing deleted), and a sweep in progress makes
//   a checkpoint wait (`gc_in_progress`), never both at once — also under a storm of concurrent
//   attempts against the real KV bucket.
import { CHECKPOINT_STREAMS } from '../../../src/core/agent-subjects.ts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Unavailable } from '../../../src/core/index.ts';
import { verifyCheckpoint } from '../../../src/control-plane/checkpoints.ts';
import { ChunkGcLocks } from '../../../src/control-plane/chunk-gc-locks.ts';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { CheckpointRecordSchema } from '../../../src/control-plane/records.ts';
import { collectCheckpoints } from '../../../src/control-plane/retention.ts';
import { Keys } from '../../../src/control-plane/state.ts';
import { DockerRuntime } from '../../../src/docker/runtime.ts';
import { SUCCESS, startFleet, type Fleet } from './fleet-harness.ts';

let fleet: Fleet;
let plane: ControlPlane;
let n = 0;
const key = () => `gc-${++n}`;

beforeAll(async () => {
  fleet = await startFleet(1, { checkpointKeep: 1 });
  // No automatic passes: the test runs GC itself.
  plane = await fleet.startPlane({ autoReconcile: false });
  await fleet.startAgentOn('host-a', 0);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
}, 180_000);

afterAll(async () => {
  await fleet?.cleanup();
});

async function chunkCount(): Promise<number> {
  return (await fleet.store.jsm.streams.info(fleet.chunks.chunkStream)).state.messages;
}

async function metric(name: string, labels: Record<string, string>): Promise<number> {
  const values = (await plane.ctx.metrics.registry.getSingleMetric(name)?.get())?.values ?? [];
  return values.filter((v) => Object.entries(labels).every(([k, x]) => v.labels[k] === x)).reduce((a, v) => a + v.value, 0);
}

async function digestsOf(checkpointId: string, groupId: string): Promise<Set<string>> {
  const m = await fleet.chunks.getManifest('host-a', groupId, checkpointId);
  return new Set(m.members.flatMap((x) => x.layer.chunks.map((c) => c.digest)));
}

describe('checkpoint garbage collection', () => {
  let groupId: string;
  const checkpoints: string[] = [];

  it('keeps the newest checkpoint, deletes the older ones and only the chunks nothing else references', async () => {
    ({ groupId } = (await plane.runner.openGroup({ idempotencyKey: key(), conversationId: 'conv-gc', members: [{ memberId: 'm1', cli: 'claude_code' }] })).group);
    const rt = new DockerRuntime(fleet.hosts[0]!.docker);
    // Three generations of the layer: a file added each time, the first one removed before the last.
    for (const step of ['add-1', 'add-2', 'drop-1-add-3']) {
      const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
      await fleet.writeSession(begun.hostId, begun.containerId, 'sess-gc');
      await plane.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-gc', evidence: SUCCESS });
      const scripts: Record<string, string> = { 'add-1': 'head -c 600000 /dev/urandom > /tmp/f1', 'add-2': 'head -c 600000 /dev/urandom > /tmp/f2', 'drop-1-add-3': 'rm /tmp/f1 && head -c 600000 /dev/urandom > /tmp/f3' };
      const script = scripts[step]!;
      const r = await rt.exec(begun.containerId, ['/bin/sh', '-c', script]);
      expect(r.exitCode, r.stderr).toBe(0);
      const stopped = await plane.runner.stopGroup({ idempotencyKey: key(), groupId });
      expect(stopped.checkpointId, step).toBeDefined();
      checkpoints.push(stopped.checkpointId!);
    }
    const [c1, c2, c3] = checkpoints as [string, string, string];
    const [d1, d2, d3] = [await digestsOf(c1, groupId), await digestsOf(c2, groupId), await digestsOf(c3, groupId)];
    const unshared = new Set([...d1, ...d2].filter((d) => !d3.has(d)));
    expect(unshared.size, 'f1 was removed: its chunks are in no newer layer').toBeGreaterThan(0);
    const before = await chunkCount();

    const deletedChunks0 = await metric('sandboxfleet_checkpoint_gc_deleted_total', { kind: 'chunk' });
    const result = await collectCheckpoints(plane.ctx);
    expect(result).toMatchObject({ deferred: false, sweptChunks: unshared.size });
    expect((await metric('sandboxfleet_checkpoint_gc_deleted_total', { kind: 'chunk' })) - deletedChunks0).toBe(unshared.size);
    expect(result.deleted.sort()).toEqual([c1, c2].sort());
    expect(await chunkCount()).toBe(before - unshared.size);
    for (const d of unshared) expect(await fleet.chunks.has(d)).toBe(false);
    for (const d of d3) expect(await fleet.chunks.has(d)).toBe(true);
    // Manifest and index of the old ones are gone; the kept one is whole.
    await expect(fleet.chunks.getManifest('host-a', groupId, c1)).rejects.toMatchObject({ reason: 'manifest_missing' });
    const index = fleet.store.repository('checkpoints', CheckpointRecordSchema);
    expect(await index.get(Keys.checkpoint(groupId, c2))).toBeUndefined();
    const kept = (await index.get(Keys.checkpoint(groupId, c3)))!.value;
    const { summary } = await verifyCheckpoint(fleet.chunks, kept);
    expect(summary.members.every((m) => m.blobPresent && m.digestVerified)).toBe(true);
    // A second pass has nothing to do.
    expect(await collectCheckpoints(plane.ctx)).toEqual({ deleted: [], sweptChunks: 0, deferred: false });
    // The group still restores from what is kept: its next turn is RESTORED with the saved session.
    const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
    expect(begun.contextState).toBe('RESTORED');
    const r = await rt.exec(begun.containerId, ['/bin/sh', '-c', 'test ! -e /tmp/f1 && test -s /tmp/f2 && test -s /tmp/f3']);
    expect(r.exitCode, r.stderr).toBe(0);
    await fleet.writeSession(begun.hostId, begun.containerId, 'sess-gc');
    await plane.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-gc', evidence: SUCCESS });
  });

  it('defers the whole pass while a checkpoint is in progress, and makes checkpoints wait while it sweeps', async () => {
    // One more checkpoint makes the last one doomed.
    const stopped = await plane.runner.stopGroup({ idempotencyKey: key(), groupId });
    expect(stopped.checkpointId).toBeDefined();
    const locks = new ChunkGcLocks(plane.ctx);
    await locks.beginCheckpoint('c-in-progress', Date.now() + 60_000);
    const before = await chunkCount();
    const deferred0 = await metric('sandboxfleet_checkpoint_gc_passes_total', { result: 'deferred' });
    expect(await collectCheckpoints(plane.ctx)).toEqual({ deleted: [], sweptChunks: 0, deferred: true });
    expect(await metric('sandboxfleet_checkpoint_gc_passes_total', { result: 'deferred' })).toBe(deferred0 + 1);
    expect(await chunkCount()).toBe(before);
    expect(await fleet.chunks.getManifest('host-a', groupId, checkpoints[2]!)).toBeDefined();
    await locks.endCheckpoint('c-in-progress');
    expect((await collectCheckpoints(plane.ctx)).deleted).toEqual([checkpoints[2]]);

    // A sweep holding the lock: a checkpoint is refused with a retryable reason until it ends.
    let release!: () => void;
    const holding = new Promise<void>((r) => (release = r));
    let entered!: () => void;
    const inside = new Promise<void>((r) => (entered = r));
    const sweeping = locks.trySweep(60_000, async () => {
      entered();
      await holding;
      return 'swept';
    });
    await inside;
    const refused = await locks.beginCheckpoint('c-during-sweep', Date.now() + 60_000).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(Unavailable);
    expect((refused as Unavailable).reason).toBe('gc_in_progress');
    release();
    expect(await sweeping).toBe('swept');
    await locks.beginCheckpoint('c-during-sweep', Date.now() + 60_000);
    await locks.endCheckpoint('c-during-sweep');
  });

  it('a full sweep deletes the chunks of checkpoints that never wrote a manifest, and nothing else', async () => {
    // What a failed checkpoint leaves: uploaded chunks, no manifest.
    const orphans = await Promise.all([1, 2, 3].map(async (i) => (await fleet.chunks.put(new TextEncoder().encode(`orphan ${i} ${Date.now()}`))).ref.digest));
    const g = await fleet.group(groupId);
    const kept = await digestsOf(g.latestCheckpointId!, groupId);
    const before = await chunkCount();
    // The retention pass alone (nothing doomed) leaves them; the full sweep does not.
    expect(await collectCheckpoints(plane.ctx)).toEqual({ deleted: [], sweptChunks: 0, deferred: false });
    expect(await collectCheckpoints(plane.ctx, undefined, { fullSweep: true })).toEqual({ deleted: [], sweptChunks: 3, deferred: false });
    expect(await chunkCount()).toBe(before - 3);
    for (const d of orphans) expect(await fleet.chunks.has(d)).toBe(false);
    for (const d of kept) expect(await fleet.chunks.has(d)).toBe(true);
  });

  it('deletes no chunk while a stored manifest cannot be read (e.g. a host id an older version allowed), then resumes', async () => {
    const orphan = (await fleet.chunks.put(new TextEncoder().encode(`orphan-unreadable ${Date.now()}`))).ref.digest;
    // A manifest under a subject this version does not recognize, as an older version might have left.
    const subject = `${CHECKPOINT_STREAMS.manifestSubjectPrefix}Node_1.g-legacy.c-legacy`;
    await fleet.store.js.publish(subject, new TextEncoder().encode('{"not":"a manifest this version reads"}'));
    expect(await collectCheckpoints(plane.ctx, undefined, { fullSweep: true })).toEqual({ deleted: [], sweptChunks: 0, deferred: false });
    expect(await fleet.chunks.has(orphan)).toBe(true);
    await fleet.store.jsm.streams.purge(fleet.chunks.manifestStream, { filter: subject });
    expect(await collectCheckpoints(plane.ctx, undefined, { fullSweep: true })).toEqual({ deleted: [], sweptChunks: 1, deferred: false });
    expect(await fleet.chunks.has(orphan)).toBe(false);
  });

  it('never lets a sweep and a checkpoint proceed at once, under concurrent attempts', async () => {
    // Two "replicas" racing: every successful beginCheckpoint holds for a moment; every sweep that
    // runs checks that no checkpoint is inside meanwhile.
    const replicas = [new ChunkGcLocks(plane.ctx), new ChunkGcLocks(plane.ctx)];
    let checkpointsInside = 0;
    let sweepsRun = 0;
    let checkpointsRun = 0;
    const violations: string[] = [];
    const pause = (ms: number) => new Promise((r) => setTimeout(r, ms));
    const checkpointer = async (r: ChunkGcLocks, i: number): Promise<void> => {
      for (let k = 0; k < 15; k++) {
        const id = `c-race-${i}-${k}`;
        try {
          await r.beginCheckpoint(id, Date.now() + 60_000);
        } catch (err) {
          if (err instanceof Unavailable && err.reason === 'gc_in_progress') continue;
          throw err;
        }
        checkpointsInside += 1;
        checkpointsRun += 1;
        await pause(Math.random() * 15);
        checkpointsInside -= 1;
        await r.endCheckpoint(id);
        await pause(Math.random() * 10);
      }
    };
    const sweeper = async (r: ChunkGcLocks): Promise<void> => {
      for (let k = 0; k < 15; k++) {
        await r.trySweep(60_000, async () => {
          sweepsRun += 1;
          for (let t = 0; t < 3; t++) {
            if (checkpointsInside > 0) violations.push(`sweep ran with ${checkpointsInside} checkpoint(s) inside`);
            await pause(3);
          }
        });
        await pause(Math.random() * 10);
      }
    };
    await Promise.all([checkpointer(replicas[0]!, 0), checkpointer(replicas[1]!, 1), checkpointer(replicas[0]!, 2), sweeper(replicas[1]!), sweeper(replicas[0]!)]);
    expect(violations).toEqual([]);
    // Both sides made progress (the test would prove nothing if one side never ran).
    expect(sweepsRun).toBeGreaterThan(0);
    expect(checkpointsRun).toBeGreaterThan(0);
  });
});
