// SHA-256 off the main thread for the checkpoint path (R-G3, R-G5, R-R2), opt-in via the
// `offThreadHash` option of storeLayer/fetchLayer. Capture and restore hash every byte twice (each
// chunk's digest, and the whole layer's); here two worker threads do it, one computing chunk digests
// (any order), the other the running whole-layer digest (in stream order), while the main thread
// parses tar, chunks, and talks to NATS and tar. Data crosses threads in shared memory
// (SharedArrayBuffer), so a chunk cut by FastCDC from shared slabs is never copied for hashing;
// other inputs are copied once (share()).
// Why opt-in: with SHA-NI both passes cost only ~0.3 s CPU per 200 MiB, while shared-memory copies
// and thread handoffs add ~0.1–0.2 s CPU; on the 2-core hosts measured, with other work running,
// inline hashing was faster (bench/checkpoint/phases.ts A/B). It can pay on a host with idle cores.
// The workers start on first use, are shared by all layers of the process, and are unref'd while
// idle so they never keep the process alive. A worker crash fails the pending hashes (callers then
// fail their capture or restore; nothing is trusted without its digest); the next use restarts it.
import { Worker } from 'node:worker_threads';

// Plain CommonJS source: runs in any host (tsx, vitest, compiled) without a TypeScript loader.
const WORKER_SOURCE = `
const { parentPort } = require('node:worker_threads');
const { createHash } = require('node:crypto');
const streams = new Map();
parentPort.on('message', (m) => {
  try {
    switch (m.op) {
      case 'digest':
        parentPort.postMessage({ id: m.id, digest: createHash('sha256').update(m.data).digest('hex') });
        return;
      case 'open':
        streams.set(m.sid, createHash('sha256'));
        return;
      case 'update':
        streams.get(m.sid)?.update(m.data);
        return;
      case 'final': {
        const h = streams.get(m.sid);
        streams.delete(m.sid);
        if (h === undefined) parentPort.postMessage({ id: m.id, error: 'unknown hash stream' });
        else parentPort.postMessage({ id: m.id, digest: h.digest('hex') });
        return;
      }
      case 'drop':
        streams.delete(m.sid);
        return;
    }
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

/** A fresh shared-memory buffer of `size` bytes (uninitialised semantics: zero-filled). */
export function sharedBuffer(size: number): Buffer {
  return Buffer.from(new SharedArrayBuffer(size));
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

  send(message: Record<string, unknown>): void {
    this.get().postMessage(message);
  }
}

const chunkWorker = new HashWorker();
const streamWorker = new HashWorker();
let nextStream = 1;

/** `sha256:<hex>` of one chunk, computed on the chunk worker (`data` should be shared, see share()). */
export function digestOff(data: Uint8Array): Promise<string> {
  return chunkWorker.request({ op: 'digest', data: share(data) });
}

/**
 * A whole-layer digest computed on the stream worker: update() in stream order (messages to one
 * worker are handled in order), digest() once at the end. abort() frees it without a result.
 */
export class OffThreadStreamHash {
  private readonly sid = nextStream++;
  private finished = false;

  constructor() {
    streamWorker.send({ op: 'open', sid: this.sid });
  }

  update(data: Uint8Array): void {
    if (this.finished) throw new Error('hash stream already finished');
    streamWorker.send({ op: 'update', sid: this.sid, data: share(data) });
  }

  digest(): Promise<string> {
    this.finished = true;
    return streamWorker.request({ op: 'final', sid: this.sid });
  }

  abort(): void {
    if (this.finished) return;
    this.finished = true;
    streamWorker.send({ op: 'drop', sid: this.sid });
  }
}
