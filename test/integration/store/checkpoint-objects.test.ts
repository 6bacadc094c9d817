// CheckpointObjects against a real nats-server: write-once puts, digests, bounded sizes, and
// corrupt objects detected on read (R-G4/R-R2: never restore from corrupt data; R-R4).
import { createHash } from 'node:crypto';
import { headers } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { StateStore } from '../../../src/store/connection.ts';
import { CasConflictError, InvalidKeyError, ObjectCorruptError, ObjectNotFoundError, RecordTooLargeError } from '../../../src/store/errors.ts';
import { startTestNats, type TestNats } from '../../support/nats.ts';

let nats: TestNats;
let store: StateStore;
const MAX = 1024 * 1024;

beforeAll(async () => {
  nats = await startTestNats();
  store = await StateStore.open(await nats.connect('obj-test'), { checkpointObjects: { maxObjectBytes: MAX, chunkBytes: 64 * 1024 } });
});

afterAll(async () => {
  await nats?.cleanup();
});

function bytes(n: number, seed = 1): Uint8Array {
  const b = new Uint8Array(n);
  for (let i = 0; i < n; i++) b[i] = (i * 31 + seed) & 0xff;
  return b;
}

function streamOf(data: Uint8Array, piece = 10_000): ReadableStream<Uint8Array> {
  let off = 0;
  return new ReadableStream({
    pull(c) {
      if (off >= data.length) return c.close();
      c.enqueue(data.subarray(off, off + piece));
      off += piece;
    },
  });
}

async function drain(rs: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  const parts: Uint8Array[] = [];
  for await (const p of rs as unknown as AsyncIterable<Uint8Array>) parts.push(p);
  return Buffer.concat(parts);
}

describe('CheckpointObjects', () => {
  it('stores and returns bytes with their sha256', async () => {
    const objs = store.checkpointObjects;
    const data = bytes(300_000);
    const info = await objs.put('ckpt/g1/manifest.json', data, { metadata: { groupId: 'g1' } });
    expect(info.size).toBe(300_000);
    expect(info.sha256Hex).toBe(createHash('sha256').update(data).digest('hex'));
    expect(info.metadata).toEqual({ groupId: 'g1' });
    expect(await objs.info('ckpt/g1/manifest.json')).toMatchObject({ size: 300_000, sha256Hex: info.sha256Hex, revision: info.revision });
    expect(Buffer.from(await objs.getBytes('ckpt/g1/manifest.json')).equals(Buffer.from(data))).toBe(true);
    const s = await objs.getStream('ckpt/g1/manifest.json');
    expect(Buffer.from(await drain(s.data)).equals(Buffer.from(data))).toBe(true);
    expect((await objs.list()).objects.map((o) => o.name)).toContain('ckpt/g1/manifest.json');
  });

  it('is write-once: a second put of the same name is a CAS conflict unless it names the revision', async () => {
    const objs = store.checkpointObjects;
    const first = await objs.put('once', bytes(10, 1));
    await expect(objs.put('once', bytes(10, 2))).rejects.toBeInstanceOf(CasConflictError);
    await expect(objs.put('once', bytes(10, 2), { expectedRevision: (first.revision ?? 0) + 1000 })).rejects.toBeInstanceOf(CasConflictError);
    const second = await objs.put('once', bytes(10, 3), { expectedRevision: first.revision });
    expect(second.sha256Hex).not.toBe(first.sha256Hex);
    expect(Buffer.from(await objs.getBytes('once')).equals(Buffer.from(bytes(10, 3)))).toBe(true);
  });

  it('bounds object size for byte arrays and streams, leaving nothing behind', async () => {
    const objs = store.checkpointObjects;
    await expect(objs.put('too-big', bytes(MAX + 1))).rejects.toBeInstanceOf(RecordTooLargeError);
    const err = await objs.put('too-big-stream', streamOf(bytes(MAX + 50_000))).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RecordTooLargeError);
    expect(await objs.info('too-big-stream')).toBeUndefined();
    // A streamed put within bounds works.
    const ok = await objs.put('streamed', streamOf(bytes(MAX)));
    expect(ok.size).toBe(MAX);
  });

  it('detects a corrupt object (bytes not matching the recorded digest) on read', async () => {
    const objs = store.checkpointObjects;
    const info = await objs.put('victim', bytes(200_000));
    // Rewrite the object's metadata with the digest of other content, as disk corruption or a
    // tampered bucket would look from a reader's point of view.
    const stream = `OBJ_${objs.bucket}`;
    const meta = await store.jsm.streams.getMessage(stream, { seq: info.revision as number });
    const doc = JSON.parse(new TextDecoder().decode(meta?.data)) as { digest: string };
    doc.digest = `SHA-256=${createHash('sha256').update('something else').digest('base64url')}=`;
    const h = headers();
    h.set('Nats-Rollup', 'sub');
    await store.js.publish(meta?.subject as string, JSON.stringify(doc), { headers: h });

    await expect(objs.getBytes('victim')).rejects.toBeInstanceOf(ObjectCorruptError);
    const s = await objs.getStream('victim');
    const e = await drain(s.data).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(ObjectCorruptError);
    expect((e as ObjectCorruptError).reason).toBe('object_corrupt');
  });

  it('deletes objects and reports missing ones with object_not_found', async () => {
    const objs = store.checkpointObjects;
    await objs.put('doomed', bytes(1000));
    expect(await objs.delete('doomed')).toBe(true);
    expect(await objs.info('doomed')).toBeUndefined();
    await expect(objs.getBytes('doomed')).rejects.toBeInstanceOf(ObjectNotFoundError);
    await expect(objs.getStream('never-was')).rejects.toMatchObject({ reason: 'object_not_found' });
    expect(await objs.delete('never-was')).toBe(false);
    // Names are never reused: a deleted name stays taken for write-once puts.
    await expect(objs.put('doomed', bytes(10))).rejects.toBeInstanceOf(CasConflictError);
  });

  it('validates object names', async () => {
    for (const name of ['', '../x', 'a/../b', '/abs', 'a//b', 'sp ace', 'x'.repeat(300)]) {
      await expect(store.checkpointObjects.put(name, bytes(1)), name).rejects.toBeInstanceOf(InvalidKeyError);
    }
  });
});
