// The checkpoint streams' settings against a real nats-server: ChunkStore.open creates both streams
// write-once (a second message on a subject is refused, not swapped in), and turns streams made by
// an older build (discard old: the newest message per subject won) or edited by hand into write-once
// ones at the control plane's start, keeping what they hold. A host agent (manage: false) only
// checks that the streams exist.
import { DiscardPolicy, RetentionPolicy, StorageType, jetstream, jetstreamManager, type StreamConfig } from '@nats-io/jetstream';
import type { NatsConnection } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CHECKPOINT_STREAMS } from '../../../src/core/agent-subjects.ts';
import { ChunkStore, sha256Digest } from '../../../src/store/chunk-store.ts';
import { startTestNats, type TestNats } from '../../support/nats.ts';

let nats: TestNats;
let nc: NatsConnection;

beforeAll(async () => {
  nats = await startTestNats();
  nc = await nats.connect('chunk-streams');
});

afterAll(async () => {
  await nats?.cleanup();
});

/** What the build before write-once created (chunk-store.ts before issue #11). */
const OLD_SETTINGS = {
  storage: StorageType.File,
  retention: RetentionPolicy.Limits,
  discard: DiscardPolicy.Old,
  max_msgs_per_subject: 1,
  max_msg_size: 1024 * 1024,
  num_replicas: 1,
  allow_direct: true,
  deny_delete: false,
  deny_purge: false,
} satisfies Partial<StreamConfig>;

function expectWriteOnce(config: StreamConfig): void {
  expect(config).toMatchObject({ discard: DiscardPolicy.New, discard_new_per_subject: true, max_msgs_per_subject: 1, storage: StorageType.File });
  expect(config.allow_rollup_hdrs ?? false).toBe(false);
}

describe('checkpoint streams are write-once', () => {
  it('creates both streams write-once; a second message on a subject is refused', async () => {
    const store = await ChunkStore.open(nc, { chunkStream: 'WO_CHUNKS', manifestStream: 'WO_MANIFESTS' });
    const jsm = await jetstreamManager(nc);
    expectWriteOnce((await jsm.streams.info(store.chunkStream)).config);
    expectWriteOnce((await jsm.streams.info(store.manifestStream)).config);
    const data = Buffer.from('write once');
    const { ref } = await store.put(data);
    await expect(jetstream(nc).publish(`${CHECKPOINT_STREAMS.chunkSubjectPrefix}${ref.digest.slice(7)}`, Buffer.from('other bytes'))).rejects.toThrow(/maximum messages per subject/);
    expect((await store.get(ref)).equals(data)).toBe(true);
    await jsm.streams.delete(store.chunkStream);
    await jsm.streams.delete(store.manifestStream);
  });

  it('makes streams created by an older build write-once at start, keeping their data', async () => {
    const jsm = await jetstreamManager(nc);
    const chunks = { ...OLD_SETTINGS, name: CHECKPOINT_STREAMS.chunks, subjects: [`${CHECKPOINT_STREAMS.chunkSubjectPrefix}*`] };
    const manifests = { ...OLD_SETTINGS, name: CHECKPOINT_STREAMS.manifests, subjects: [`${CHECKPOINT_STREAMS.manifestSubjectPrefix}*.*.*`] };
    await jsm.streams.add(chunks);
    await jsm.streams.add(manifests);
    const js = jetstream(nc);
    const data = Buffer.from('stored by the old build');
    const digest = sha256Digest(data);
    const subject = `${CHECKPOINT_STREAMS.chunkSubjectPrefix}${digest.slice(7)}`;
    // The old settings really are the unsafe ones: a second message replaced the first.
    await js.publish(subject, Buffer.from('junk'));
    await js.publish(subject, data);
    expect((await jsm.streams.info(chunks.name)).state.messages).toBe(1);

    // A host agent does not administer the streams: it leaves them as they are.
    await ChunkStore.open(nc, { manage: false });
    expect((await jsm.streams.info(chunks.name)).config.discard).toBe(DiscardPolicy.Old);

    const store = await ChunkStore.open(nc);
    expectWriteOnce((await jsm.streams.info(chunks.name)).config);
    expectWriteOnce((await jsm.streams.info(manifests.name)).config);
    expect((await store.get({ digest, size: data.length })).equals(data)).toBe(true);
    await expect(js.publish(subject, Buffer.from('junk'))).rejects.toThrow(/maximum messages per subject/);
    await expect(js.publish(`${CHECKPOINT_STREAMS.manifestSubjectPrefix}host-a.g1.c1`, Buffer.from('{}'))).resolves.toMatchObject({ seq: 1 });
    await expect(js.publish(`${CHECKPOINT_STREAMS.manifestSubjectPrefix}host-a.g1.c1`, Buffer.from('{}'))).rejects.toThrow(/maximum messages per subject/);
    expect((await store.get({ digest, size: data.length })).equals(data)).toBe(true);

    // Settings edited by hand are repaired at the next start too: the per-subject refusal alone
    // (discard new without it refuses only when the whole stream is full)...
    const live = (await jsm.streams.info(chunks.name)).config;
    await jsm.streams.update(chunks.name, { ...live, discard_new_per_subject: false });
    await ChunkStore.open(nc);
    expectWriteOnce((await jsm.streams.info(chunks.name)).config);
    // ...and rollups (a rollup header purges the subject before storing).
    await jsm.streams.update(chunks.name, { ...live, allow_rollup_hdrs: true });
    await ChunkStore.open(nc);
    expectWriteOnce((await jsm.streams.info(chunks.name)).config);

    // Garbage collection still empties a subject, which may then be written again.
    await store.delete(digest);
    expect(await store.has(digest)).toBe(false);
    expect((await store.put(data)).stored).toBe(true);
  });
});
