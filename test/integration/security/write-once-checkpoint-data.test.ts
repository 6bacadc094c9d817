// Write-once checkpoint data (issue #11 item 1) against a real nats-server whose static authorization
// admits only nkey users, each host on its own credentials (core/agent-subjects.ts hostPermissions),
// set up like nats-host-credentials.test.ts. A host may publish on every `sf.chunk.*` subject, so the
// server itself must refuse a second message on a chunk or manifest subject:
// - another host cannot replace a stored chunk (JetStream publish or plain publish), and its owner
//   still reads the original bytes;
// - a chunk planted under a digest before its owner writes it is never taken for that chunk: the
//   owner's write fails (chunk_digest_mismatch) instead of recording an unusable checkpoint, on the
//   main thread and in the publish worker; an identical stored chunk counts as stored;
// - a manifest cannot be replaced, not even by the host that wrote it;
// - garbage collection (the control plane's purge) still removes a chunk, and a later checkpoint
//   stores it again.
import { randomBytes } from 'node:crypto';
import { jetstream, jetstreamManager, type JetStreamManager } from '@nats-io/jetstream';
import { headers, type NatsConnection } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CHECKPOINT_STREAMS, manifestSubject } from '../../../src/core/agent-subjects.ts';
import { serializeCheckpointManifest, type CheckpointManifest, type ChunkRef } from '../../../src/core/checkpoint-manifest.ts';
import { ChunkStore, ChunkStoreError, sha256Digest } from '../../../src/store/chunk-store.ts';
import { WorkerChunkWriter } from '../../../src/store/chunk-publish-worker.ts';
import { fetchChunksInWorker } from '../../../src/store/chunk-fetch-worker.ts';
import { workerAuth } from '../../../src/store/nats-auth.ts';
import { startNkeyNats, type NkeyNats } from '../../support/nkey-nats.ts';
import type { TestNats } from '../../support/nats.ts';

let nats: TestNats;
let cp: NatsConnection;
let cpStore: ChunkStore;
let cpm: JetStreamManager;
let auth: NkeyNats['auth'];
let fixture: NkeyNats | undefined;

beforeAll(async () => {
  fixture = await startNkeyNats('sf-write-once-');
  ({ nats, auth } = fixture);
  cp = await nats.connect('control-plane', auth.cp);
  cpStore = await ChunkStore.open(cp); // the control plane creates the streams; agents may not
  cpm = await jetstreamManager(cp);
}, 60_000);

afterAll(async () => {
  await fixture?.cleanup();
});

/** A host's store, on its own credentials only (no stream administration). */
async function hostStore(host: 'a' | 'b', name: string): Promise<{ nc: NatsConnection; store: ChunkStore }> {
  const nc = await nats.connect(`${name}-${host}`, auth[host]);
  return { nc, store: await ChunkStore.open(nc, { manage: false }) };
}

function chunkSubjectOf(digest: string): string {
  return CHECKPOINT_STREAMS.chunkSubjectPrefix + digest.slice('sha256:'.length);
}

/** What the server holds under `subject` (sequence and bytes), read with the control plane's rights. */
async function stored(stream: string, subject: string): Promise<{ seq: number; data: Buffer } | null> {
  const msg = await cpm.direct.getMessage(stream, { last_by_subj: subject });
  return msg === null ? null : { seq: msg.seq, data: Buffer.from(msg.data) };
}

async function reasonOf(p: Promise<unknown>): Promise<string> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  if (!(err instanceof ChunkStoreError)) throw new Error(`expected a ChunkStoreError, got ${String(err)}`);
  return err.reason;
}

function manifestFor(checkpointId: string, layer: { digest: string; size: number; chunks: ChunkRef[] }, locator = 'sess'): CheckpointManifest {
  return {
    schemaVersion: 1,
    checkpointId,
    groupId: 'g-write-once',
    placementGeneration: 1,
    source: { hostId: 'host-a', epoch: 1 },
    createdAtMs: 2,
    cleanStop: { stoppedAtMs: 1, lastTurnCompletedAtMs: 1, stateRevision: 1, members: [{ memberId: 'm1', exitCode: 0, exitedWithinGrace: true }] },
    members: [{ memberId: 'm1', cliKind: 'claude-code', savedLocator: locator, nativeSessionPaths: ['/root/.claude/projects/-/s.jsonl'], layer }],
    baseImageDigest: `sha256:${'1'.repeat(64)}`,
    bridgeVersion: '0.1.0',
  };
}

describe('write-once chunks under per-host credentials', () => {
  it("another host cannot replace a stored chunk, by JetStream or plain publish; the owner still reads it", async () => {
    const { store: b } = await hostStore('b', 'owner');
    const data = randomBytes(200_000);
    const { ref, stored: wrote } = await b.put(data);
    expect(wrote).toBe(true);
    const subject = chunkSubjectOf(ref.digest);
    const before = await stored(b.chunkStream, subject);

    const { nc: a } = await hostStore('a', 'spoiler');
    const junk = randomBytes(data.length);
    // A JetStream publish without any expectation header: the server refuses a second message.
    await expect(jetstream(a).publish(subject, junk)).rejects.toThrow(/maximum messages per subject exceeded/);
    // A rollup would purge the subject first: the chunk stream does not allow rollups.
    const rollup = headers();
    rollup.set('Nats-Rollup', 'sub');
    await expect(jetstream(a).publish(subject, junk, { headers: rollup })).rejects.toThrow();
    // A plain publish (no reply, nothing to refuse to): dropped by the stream all the same.
    a.publish(subject, junk);
    await a.flush();
    await cp.flush();

    const after = await stored(b.chunkStream, subject);
    expect(after?.seq).toBe(before?.seq);
    expect(after?.data.equals(data)).toBe(true);
    // Reads verify, and they get the original, on the main thread and in the fetch worker.
    expect((await b.get(ref)).equals(data)).toBe(true);
    const fetched: Buffer[] = [];
    for await (const c of fetchChunksInWorker([ref], { servers: nats.server.url, auth: workerAuth(auth.b), stream: b.chunkStream, maxInFlight: 1 })) fetched.push(c);
    expect(fetched[0]?.equals(data)).toBe(true);
  });

  it('a chunk planted under a digest before its owner writes it is refused, never counted as stored', async () => {
    const { nc: a } = await hostStore('a', 'planter');
    const { store: b } = await hostStore('b', 'victim');
    const data = randomBytes(150_000);
    const digest = sha256Digest(data);
    await jetstream(a).publish(chunkSubjectOf(digest), randomBytes(data.length));

    // The owner's write fails with the reason restore would give, instead of a checkpoint that
    // cannot be restored; on the main thread...
    expect(await reasonOf(b.put(data))).toBe('chunk_digest_mismatch');
    const writer = b.writer(2);
    await writer.put(data);
    expect(await reasonOf(writer.flush())).toBe('chunk_digest_mismatch');
    // ...and on the publish worker, with the host's own credentials: as its first chunk (refused
    // publish, then the stored copy read) and after another one (stored copy read before any upload).
    const first = new WorkerChunkWriter({ servers: nats.server.url, auth: workerAuth(auth.b), maxInFlight: 1 });
    await first.put(data);
    expect(await reasonOf(first.flush())).toBe('chunk_digest_mismatch');
    const later = new WorkerChunkWriter({ servers: nats.server.url, auth: workerAuth(auth.b), maxInFlight: 1 });
    await later.put(randomBytes(1000));
    await later.put(data);
    expect(await reasonOf(later.flush())).toBe('chunk_digest_mismatch');
    // Reads still verify: the planted bytes are never returned as that chunk.
    expect(await reasonOf(b.get({ digest, size: data.length }))).toBe('chunk_digest_mismatch');
  });

  it("an identical chunk another host stored counts as stored, on the main thread and in the worker", async () => {
    const { store: a } = await hostStore('a', 'first');
    const { store: b } = await hostStore('b', 'second');
    const data = randomBytes(100_000);
    expect((await a.put(data)).stored).toBe(true);
    expect(await b.put(data)).toEqual({ ref: { digest: sha256Digest(data), size: data.length }, stored: false });
    // In the worker: as its first chunk and after a new one.
    for (const before of [[], [randomBytes(1000)]]) {
      const worker = new WorkerChunkWriter({ servers: nats.server.url, auth: workerAuth(auth.b), maxInFlight: 1 });
      for (const chunk of [...before, data]) await worker.put(chunk);
      const { refs, stats } = await worker.flush();
      expect(refs.at(-1)).toEqual({ digest: sha256Digest(data), size: data.length });
      expect(stats.storedChunks).toBe(before.length);
    }
  });

  it('garbage collection removes a chunk and a later checkpoint stores it again', async () => {
    const { store: a } = await hostStore('a', 'gc');
    const data = randomBytes(50_000);
    const { ref } = await a.put(data);
    await cpStore.delete(ref.digest); // what control-plane/retention.ts does with an unreferenced chunk
    expect(await a.has(ref.digest)).toBe(false);
    expect((await a.put(data)).stored).toBe(true);
    expect((await a.get(ref)).equals(data)).toBe(true);
    // The worker path too.
    await cpStore.delete(ref.digest);
    const worker = new WorkerChunkWriter({ servers: nats.server.url, auth: workerAuth(auth.a), maxInFlight: 2 });
    await worker.put(data);
    expect((await worker.flush()).stats.storedChunks).toBe(1);
    expect((await a.get(ref)).equals(data)).toBe(true);
  });
});

describe('write-once manifests under per-host credentials', () => {
  it('a manifest cannot be replaced, not even by the host that wrote it', async () => {
    const { nc: a, store } = await hostStore('a', 'manifest');
    const data = randomBytes(10_000);
    const { ref } = await store.put(data);
    const layer = { digest: sha256Digest(data), size: data.length, chunks: [ref] };
    const original = manifestFor('cp-1', layer);
    await store.putManifest(original);
    expect(await reasonOf(store.putManifest(manifestFor('cp-1', layer, 'other')))).toBe('manifest_exists');

    const subject = manifestSubject('host-a', 'g-write-once', 'cp-1');
    const before = await stored(store.manifestStream, subject);
    const forged = serializeCheckpointManifest(manifestFor('cp-1', layer, 'forged'));
    await expect(jetstream(a).publish(subject, forged)).rejects.toThrow(/maximum messages per subject exceeded/);
    a.publish(subject, forged);
    await a.flush();
    await cp.flush();
    expect((await stored(store.manifestStream, subject))?.seq).toBe(before?.seq);
    expect(await store.getManifest('host-a', 'g-write-once', 'cp-1')).toEqual(original);

    // Retention removes a manifest (the control plane's purge); only then may the subject be written again.
    await cpStore.deleteManifest('host-a', 'g-write-once', 'cp-1');
    await store.putManifest(manifestFor('cp-1', layer, 'again'));
    expect((await store.getManifest('host-a', 'g-write-once', 'cp-1')).members[0]?.savedLocator).toBe('again');
  });
});
