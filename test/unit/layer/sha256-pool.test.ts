// Off-thread SHA-256 (sha256-pool.ts): the digests the checkpoint path trusts (R-R2) must equal
// node:crypto's on the main thread, whatever memory the bytes live in and however they are split.
import { createHash, randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { OffThreadStreamHash, digestOff, share, sharedBuffer } from '../../../src/host-agent/layer/sha256-pool.ts';

const sha = (b: Uint8Array): string => `sha256:${createHash('sha256').update(b).digest('hex')}`;

describe('sha256 worker pool', () => {
  it('digests chunks like node:crypto, from plain, pooled-slice and shared memory', async () => {
    const plain = randomBytes(700_000);
    const slice = Buffer.from('a small string in the shared 8 KiB buffer pool').subarray(2, 20);
    const shared = share(plain);
    expect(shared.buffer).toBeInstanceOf(SharedArrayBuffer);
    expect(share(shared).buffer).toBe(shared.buffer); // already shared: no copy
    const view = shared.subarray(1000, 5000);
    const got = await Promise.all([digestOff(plain), digestOff(slice), digestOff(shared), digestOff(view), digestOff(new Uint8Array(0))]);
    expect(got).toEqual([sha(plain), sha(slice), sha(plain), sha(view), sha(new Uint8Array(0))]);
  });

  it('hashes a stream in order across interleaved streams, and forgets aborted ones', async () => {
    const parts = Array.from({ length: 20 }, (_, i) => randomBytes(1000 + i * 5000));
    const a = new OffThreadStreamHash();
    const b = new OffThreadStreamHash();
    const dropped = new OffThreadStreamHash();
    for (const p of parts) {
      a.update(p);
      b.update(share(p.subarray(0, 100)));
      dropped.update(p);
    }
    dropped.abort();
    expect(await a.digest()).toBe(sha(Buffer.concat(parts)));
    expect(await b.digest()).toBe(sha(Buffer.concat(parts.map((p) => p.subarray(0, 100)))));
    expect(() => a.update(parts[0]!)).toThrow(/finished/);
    const empty = new OffThreadStreamHash();
    expect(await empty.digest()).toBe(sha(new Uint8Array(0)));
  });

  it('allocates zeroed shared buffers', () => {
    const buf = sharedBuffer(4096);
    expect(buf.buffer).toBeInstanceOf(SharedArrayBuffer);
    expect(buf.every((x) => x === 0)).toBe(true);
  });
});
