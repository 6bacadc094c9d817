// SHA-256 of chunks off the main thread for the restore path (R-G5, R-R2), opt-in via the
// `offThreadHash` option of fetchLayer when chunks are fetched on this thread (no fetch worker):
// a worker thread computes chunk digests while the main thread talks to NATS. Data crosses threads
// in shared memory (SharedArrayBuffer); other inputs are copied once (share()).
// Why opt-in: with SHA-NI a digest costs ~0.15 s CPU per 200 MiB, while shared-memory copies and
// thread handoffs add about as much; on the 2-core hosts measured, with other work running, inline
// hashing was faster (bench/checkpoint/phases.ts A/B). It can pay on a host with idle cores. (The
// agent fetches on a fetch worker, store/chunk-fetch-worker.ts, which verifies there.)
// The worker starts on first use, is shared by all layers of the process, and is unref'd while idle
// so it never keeps the process alive. A worker crash fails the pending hashes (callers then fail
// their restore; nothing is trusted without its digest); the next use restarts it.
import { Worker } from 'node:worker_threads';

// Plain CommonJS source: runs in any host (tsx, vitest, compiled) without a TypeScript loader.
const WORKER_SOURCE = `
const { parentPort } = require('node:worker_threads');
const { createHash } = require('node:crypto');
parentPort.on('message', (m) => {
  try {
    parentPort.postMessage({ id: m.id, digest: createHash('sha256').update(m.data).digest('hex') });
  } catch (err) {
    if (m.id !== undefined) parentPort.postMessage({ id: m.id, error: String(err) });
  }
});
`;

interface Reply {
  readonly id: number;
  readonly digest?: string;
  readonly error?: string;
}

/** Copy `data` into shared memory unless it already is (then it is returned as is). */
export function share(data: Uint8Array): Buffer {
  if (data.buffer instanceof SharedArrayBuffer) return Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  const out = Buffer.from(new SharedArrayBuffer(data.byteLength));
  out.set(data);
  return out;
}

class HashWorker {
  private worker: Worker | null = null;
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (d: string) => void; reject: (e: Error) => void }>();

  private get(): Worker {
    if (this.worker !== null) return this.worker;
    const worker = new Worker(WORKER_SOURCE, { eval: true, name: 'sf-sha256' });
    worker.unref();
    worker.on('message', (r: Reply) => {
      const p = this.pending.get(r.id);
      if (p === undefined) return;
      this.pending.delete(r.id);
      if (r.digest !== undefined) p.resolve(`sha256:${r.digest}`);
      else p.reject(new Error(`sha256 worker: ${r.error ?? 'no digest'}`));
    });
    const fail = (err: Error): void => {
      if (this.worker === worker) this.worker = null;
      for (const p of this.pending.values()) p.reject(err);
      this.pending.clear();
    };
    worker.on('error', fail);
    worker.on('exit', (code) => fail(new Error(`sha256 worker exited with ${code}`)));
    this.worker = worker;
    return worker;
  }

  /** Ask for a digest; pending replies keep the worker referenced, so the process waits for them. */
  request(message: Record<string, unknown>): Promise<string> {
    const worker = this.get();
    const id = this.nextId++;
    const reply = new Promise<string>((resolve, reject) => this.pending.set(id, { resolve, reject }));
    if (this.pending.size === 1) worker.ref();
    worker.postMessage({ ...message, id });
    return reply.finally(() => {
      if (this.pending.size === 0) this.worker?.unref();
    });
  }
}

const chunkWorker = new HashWorker();

/** `sha256:<hex>` of one chunk, computed on the worker (`data` should be shared, see share()). */
export function digestOff(data: Uint8Array): Promise<string> {
  return chunkWorker.request({ op: 'digest', data: share(data) });
}
