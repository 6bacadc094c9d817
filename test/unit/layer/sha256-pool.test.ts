// Off-thread SHA-256 (sha256-pool.ts): the digests the checkpoint path trusts (R-R2) must equal
// node:crypto's on the main thread, whatever memory the bytes live in and however they are split.
import { createHash, randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { digestOff, share } from '../../../src/host-agent/layer/sha256-pool.ts';

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
});
