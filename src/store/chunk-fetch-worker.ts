// Fetch and verify checkpoint chunks on a worker thread with its own NATS connection (R-G5, R-R2).
// Why: restore is CPU-bound in the NATS client's receive path (it assembles each ~512 KiB message
// from 64 KiB socket reads), on the same thread that parses the layer and feeds `tar -x`. On its own
// thread the fetch overlaps with parsing and extraction. Every chunk's size and sha256 are still
// checked (in the worker) before its bytes reach the restore. Bounded: at most `maxInFlight` direct
// gets outstanding and `aheadChunks` verified chunks delivered ahead of the consumer. Each chunk is
// moved (transferred) to the consumer, who may move it on: memory is freed by whoever holds it last,
// not whenever every thread has collected a shared buffer (with shared memory here a 1 GiB restore
// peaked at 1.5 GiB RSS, measured).
// No copy of a chunk is made on its way: in this worker's isolate only, the NATS client's parser
// assembles every message of PAYLOAD_SIZED_FROM bytes or more that spans socket reads (every chunk
// of usual size: reads are 64 KiB) in a buffer of exactly its size made for it alone, instead of a
// buffer that grows by doubling (3 allocations and copies of ~1.6 MB in all per 512 KiB chunk,
// measured as costly as the chunk's sha256). That buffer, headers and chunk, is what moves to the
// consumer. A chunk in any other buffer (a message that came in one read, a client whose parser
// no longer matches what sizePayloads expects) is copied out as before. With both, a 200 MiB
// restore used ~11% less CPU and ~9% less time (tmp probe, alternating runs on this machine).
// Two workers fetch in parallel, each every other chunk (issue #17): one alone is CPU-bound in the
// NATS client's receive path and sha256, and was the slowest stage of a restore's first pass.
// Pooled: starting a worker and its connection costs 50-200 ms (measured here), a large part of
// restoring a small layer, so idle workers are kept for IDLE_MS (unref'd); a job that failed or was
// abandoned terminates its worker instead.
//
// Its connection creates no stack trace per request (`noAsyncTraces`: one per chunk otherwise).
// The worker is plain CommonJS evaluated from a string (like sha256-pool.ts), so it runs the same
// under node, tsx and vitest; it loads the NATS packages by absolute path resolved here.
import { createRequire } from 'node:module';
import { Worker } from 'node:worker_threads';
import type { ChunkRef } from '../core/checkpoint-manifest.ts';
import { ChunkStoreError } from './chunk-store.ts';
import { claimBuffer } from './sole-buffers.ts';
import { WORKER_AUTH_SOURCE, type WorkerAuth } from './nats-auth.ts';

const require = createRequire(import.meta.url);

export interface WorkerFetchOptions {
  /** NATS server URL(s) the worker connects to (the same cluster as the store's connection). */
  readonly servers: string | readonly string[];
  /** The parent's credentials (nats-auth.ts workerAuth). */
  readonly auth?: WorkerAuth | undefined;
  readonly stream: string;
  /** Direct gets outstanding at once. */
  readonly maxInFlight: number;
  /** Verified chunks the workers may deliver ahead of the consumer (bounded memory). */
  readonly aheadChunks?: number;
  readonly timeoutMs?: number;
  /** Workers fetching in parallel, each every n-th chunk (default 2: one alone is CPU-bound in the client's receive path). */
  readonly workers?: number;
}

const IDLE_MS = 30_000;
/** Messages from this size on get a buffer of their own in the worker's client (see the file header). */
export const PAYLOAD_SIZED_FROM = 16 * 1024;

const WORKER_SOURCE = `${WORKER_AUTH_SOURCE}
const { parentPort, workerData } = require('node:worker_threads');
const { createHash } = require('node:crypto');
const transport = require(workerData.transportPath);
const { connect } = transport;
const { jetstreamManager } = require(workerData.jetstreamPath);
const { servers, timeoutMs } = workerData;
// Buffers made for one message each (see the file header): moved to the consumer without a copy.
const soleBuffers = new WeakSet();
(function sizePayloads(core, from) {
  const { Parser, DenoBuffer } = core;
  if (typeof Parser !== 'function' || typeof DenoBuffer !== 'function' || typeof Parser.prototype.parse !== 'function') return;
  const sized = new WeakSet();
  const parse = Parser.prototype.parse;
  // After a read, a message still incomplete has its start in msgBuf and its size in ma.size: the
  // rest goes into a buffer of that size (the parser writes at most ma.size bytes into msgBuf).
  Parser.prototype.parse = function (buf) {
    parse.call(this, buf);
    const mb = this.msgBuf;
    const size = this.ma !== undefined ? this.ma.size : undefined;
    if (mb === undefined || sized.has(mb) || !Number.isSafeInteger(size) || size < from || typeof mb.length !== 'number' || mb.length > size) return;
    const whole = new ArrayBuffer(size);
    const next = new DenoBuffer(whole);
    next.reset();
    next.write(mb.bytes({ copy: false }));
    sized.add(next);
    soleBuffers.add(whole);
    this.msgBuf = next;
  };
})(require(workerData.corePath), workerData.payloadSizedFrom);
let nc = null;
const ready = (async () => {
  nc = await connect({ ...natsAuthOptions(workerData.auth, transport), servers, name: 'sandboxfleet-chunk-fetch', timeout: timeoutMs, noAsyncTraces: true });
  return jetstreamManager(nc, { timeout: timeoutMs });
})();
ready.catch(() => undefined);
// The job being served: its id, how many chunks the consumer has taken, and who waits for that.
let job = null;
parentPort.on('message', (m) => {
  if (m.op === 'consumed' && job && job.id === m.id) { job.consumed = m.count; if (job.wake) { job.wake(); job.wake = null; } }
  if (m.op === 'job') run(m);
});
const run = async (m) => {
  const { id, refs, stream, maxInFlight, ahead } = m;
  job = { id, consumed: 0, wake: null };
  const j = job;
  const fail = (reason, message) => parentPort.postMessage({ op: 'error', id, reason, message });
  try {
    const jsm = await ready;
    // A direct get's "none" may come from a replica that has not caught up: the leader decides it.
    const get = async (ref) => {
      const subject = 'sf.chunk.' + ref.digest.slice(7);
      const msg = await jsm.direct.getMessage(stream, { last_by_subj: subject });
      return msg !== null ? msg : jsm.streams.getMessage(stream, { last_by_subj: subject });
    };
    const window = [];
    let next = 0;
    const issue = () => { const p = get(refs[next++]); p.catch(() => undefined); window.push(p); };
    while (next < refs.length && window.length < maxInFlight) issue();
    for (let i = 0; i < refs.length; i++) {
      const msg = await window.shift();
      if (next < refs.length) issue();
      const ref = refs[i];
      if (msg === null) return fail('chunk_missing', 'chunk ' + ref.digest + ' is not in the store');
      const data = msg.data;
      const digest = 'sha256:' + createHash('sha256').update(data).digest('hex');
      if (data.length !== ref.size || digest !== ref.digest) return fail('chunk_digest_mismatch', 'chunk ' + ref.digest + ' does not verify (got ' + data.length + ' bytes)');
      while (i - j.consumed >= ahead) await new Promise((r) => { j.wake = r; });
      // The message's own buffer (nothing else reads it once the client handed it over) moves with
      // the chunk in it; a chunk inside a shared read buffer is copied out.
      if (soleBuffers.has(data.buffer) && data.byteOffset + data.byteLength === data.buffer.byteLength) {
        soleBuffers.delete(data.buffer);
        parentPort.postMessage({ op: 'chunk', id, index: i, data }, [data.buffer]);
      } else {
        const own = new Uint8Array(data.length);
        own.set(data);
        parentPort.postMessage({ op: 'chunk', id, index: i, data: own }, [own.buffer]);
      }
    }
    parentPort.postMessage({ op: 'done', id });
  } catch (err) {
    fail('transfer_failed', err && err.message ? err.message : String(err));
  }
};
`;

type WorkerMessage =
  | { op: 'chunk'; id: number; index: number; data: Uint8Array }
  | { op: 'done'; id: number }
  | { op: 'error'; id: number; reason: string; message: string };

/** Idle workers kept for the next jobs (as many as one job uses). */
const idle: { key: string; worker: Worker; timer: NodeJS.Timeout }[] = [];
const MAX_IDLE = 2;
let nextJob = 1;

function connectionKey(options: WorkerFetchOptions): string {
  return JSON.stringify([options.servers, options.auth ?? null, options.timeoutMs ?? 10_000]);
}

function acquire(options: WorkerFetchOptions, key: string): Worker {
  const i = idle.findIndex((w) => w.key === key);
  if (i >= 0) {
    const { worker, timer } = idle.splice(i, 1)[0]!;
    clearTimeout(timer);
    worker.ref();
    return worker;
  }
  return new Worker(WORKER_SOURCE, {
    eval: true,
    name: 'sf-chunk-fetch',
    workerData: {
      servers: typeof options.servers === 'string' ? options.servers : [...options.servers],
      auth: options.auth,
      timeoutMs: options.timeoutMs ?? 10_000,
      transportPath: require.resolve('@nats-io/transport-node'),
      jetstreamPath: require.resolve('@nats-io/jetstream'),
      // The client core the transport itself loads (the parser sizePayloads adjusts).
      corePath: createRequire(require.resolve('@nats-io/transport-node')).resolve('@nats-io/nats-core/internal'),
      payloadSizedFrom: PAYLOAD_SIZED_FROM,
    },
  });
}

function release(worker: Worker, key: string, reusable: boolean): void {
  if (!reusable || idle.length >= MAX_IDLE) {
    void worker.terminate();
    return;
  }
  worker.unref();
  const entry = {
    key,
    worker,
    timer: setTimeout(() => {
      const at = idle.indexOf(entry);
      if (at >= 0) idle.splice(at, 1);
      void worker.terminate();
    }, IDLE_MS),
  };
  entry.timer.unref();
  idle.push(entry);
}

// The whole-layer digest (of a version-1 layer) stays on the consumer's thread: hashing it in the
// worker too made the worker the bottleneck (measured: ~1.0 s versus ~0.88 s for a 200 MiB layer).
/**
 * Verified chunks in order, fetched on worker threads (see the file header), each worker every
 * n-th chunk; abandoning the iteration stops them.
 */
export async function* fetchChunksInWorker(refs: readonly ChunkRef[], options: WorkerFetchOptions): AsyncGenerator<Buffer> {
  const n = Math.max(1, Math.min(options.workers ?? 2, refs.length));
  if (n === 1) {
    yield* fetchInOneWorker(refs, options);
    return;
  }
  const share = (x: number): number => Math.max(1, Math.ceil(x / n));
  const streams = Array.from({ length: n }, (_, w) =>
    fetchInOneWorker(
      refs.filter((_, i) => i % n === w),
      { ...options, maxInFlight: share(options.maxInFlight), aheadChunks: share(options.aheadChunks ?? 32) },
    ),
  );
  try {
    for (let i = 0; i < refs.length; i++) {
      const next = await streams[i % n]!.next();
      if (next.done === true) throw new ChunkStoreError('transfer_failed', `chunk fetch ended before chunk ${i} of ${refs.length}`);
      yield next.value;
    }
  } finally {
    await Promise.allSettled(streams.map((s) => s.return(undefined)));
  }
}

async function* fetchInOneWorker(refs: readonly ChunkRef[], options: WorkerFetchOptions): AsyncGenerator<Buffer> {
  if (refs.length === 0) return;
  const key = connectionKey(options);
  const worker = acquire(options, key);
  const id = nextJob++;
  const queue: WorkerMessage[] = [];
  let notify: (() => void) | null = null;
  const push = (m: WorkerMessage): void => {
    queue.push(m);
    notify?.();
    notify = null;
  };
  const onMessage = (m: WorkerMessage): void => {
    if (m.id === id) push(m);
  };
  const onError = (err: Error): void => push({ op: 'error', id, reason: 'transfer_failed', message: err.message });
  const onExit = (code: number): void => push({ op: 'error', id, reason: 'transfer_failed', message: `chunk fetch worker exited (${code})` });
  worker.on('message', onMessage);
  worker.on('error', onError);
  worker.on('exit', onExit);
  let finished = false;
  try {
    worker.postMessage({ op: 'job', id, refs: refs.map((r) => ({ digest: r.digest, size: r.size })), stream: options.stream, maxInFlight: options.maxInFlight, ahead: options.aheadChunks ?? 32 });
    let delivered = 0;
    for (;;) {
      while (queue.length === 0) await new Promise<void>((r) => (notify = r));
      const m = queue.shift()!;
      if (m.op === 'error') {
        const reason = m.reason === 'chunk_missing' || m.reason === 'chunk_digest_mismatch' ? m.reason : 'transfer_failed';
        throw new ChunkStoreError(reason, m.message);
      }
      if (m.op === 'done') {
        if (delivered !== refs.length) throw new ChunkStoreError('transfer_failed', `chunk fetch worker finished after ${delivered} of ${refs.length} chunks`);
        finished = true;
        return;
      }
      if (m.index !== delivered) throw new ChunkStoreError('transfer_failed', `chunk ${m.index} arrived out of order (expected ${delivered})`);
      delivered += 1;
      worker.postMessage({ op: 'consumed', id, count: delivered });
      // Every chunk delivered: the worker is done with this job (its `done` may come after the
      // consumer stopped asking) and may serve the next one.
      if (delivered === refs.length) finished = true;
      // Moved here: this thread holds its buffer alone, headers before the chunk included.
      claimBuffer(m.data);
      yield Buffer.from(m.data.buffer, m.data.byteOffset, m.data.byteLength);
    }
  } finally {
    worker.off('message', onMessage);
    worker.off('error', onError);
    worker.off('exit', onExit);
    // Only a job that ran to its end leaves the worker idle and reusable.
    release(worker, key, finished);
  }
}
