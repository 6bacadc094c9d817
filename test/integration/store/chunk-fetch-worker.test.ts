// The chunk fetch worker (chunk-fetch-worker.ts) over a real nats-server: chunks come back verified
// and in order, and a chunk whose message spanned socket reads comes without a copy — the buffer
// the worker's client assembled the message in, made for it alone, is what moves to this thread
// (its headers before the chunk). If the client's parser no longer lets the worker size those
// buffers (an upgrade of @nats-io/nats-core), chunks come as copies and the first test fails: the
// restore would be slower, not wrong. A small chunk (one read) is copied out of the shared read
// buffer, and a wrong chunk is refused whichever way it came.
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ChunkStore, ChunkStoreError } from '../../../src/store/chunk-store.ts';
import { PAYLOAD_SIZED_FROM, fetchChunksInWorker } from '../../../src/store/chunk-fetch-worker.ts';
import { holdsWholeBuffer } from '../../../src/store/sole-buffers.ts';
import { startTestNats, type TestNats } from '../../support/nats.ts';

let nats: TestNats;
let store: ChunkStore;

beforeAll(async () => {
  nats = await startTestNats();
  store = await ChunkStore.open(await nats.connect('fetch-worker-test'), { chunkStream: 'SF_CHUNKS_FW', manifestStream: 'SF_CKPT_FW' });
}, 60_000);

afterAll(async () => {
  await nats?.cleanup();
});

async function fetchAll(refs: Parameters<typeof fetchChunksInWorker>[0]): Promise<Buffer[]> {
  const out: Buffer[] = [];
  for await (const c of fetchChunksInWorker(refs, { servers: nats.server.url, stream: store.chunkStream, maxInFlight: 4 })) out.push(c);
  return out;
}

describe('chunk fetch worker', () => {
  it('moves a chunk that spanned reads in the buffer its message was assembled in; copies a small one; both verified, in order', async () => {
    const big = [randomBytes(600 * 1024), randomBytes(300 * 1024), randomBytes(1000 * 1024)];
    const small = randomBytes(1000);
    const datas = [big[0]!, small, big[1]!, big[2]!];
    const refs = [];
    for (const d of datas) refs.push((await store.put(d)).ref);
    const got = await fetchAll(refs);
    expect(got.map((b, i) => b.equals(datas[i]!))).toEqual([true, true, true, true]);
    for (const [i, b] of got.entries()) {
      // Every chunk is this thread's alone (moved or copied), so it may be moved on.
      expect(holdsWholeBuffer(b)).toBe(true);
      if (datas[i]!.length >= PAYLOAD_SIZED_FROM) {
        // The message's own buffer: its headers, then the chunk to the end.
        expect(b.byteOffset).toBeGreaterThan(0);
        expect(b.byteOffset + b.byteLength).toBe(b.buffer.byteLength);
      } else {
        expect([b.byteOffset, b.buffer.byteLength]).toEqual([0, b.byteLength]);
      }
    }
  });

  it('refuses a chunk that does not match its reference', async () => {
    const data = randomBytes(200 * 1024);
    const { ref } = await store.put(data);
    await expect(fetchAll([{ digest: ref.digest, size: ref.size + 1 }])).rejects.toThrow(ChunkStoreError);
  });
});
