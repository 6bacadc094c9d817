// Hash, deduplicate and publish checkpoint chunks on a worker thread with its own NATS connection
// (R-G3). Why: capture is CPU-bound on one thread (tar parsing, content-defined chunking, the
// whole-layer digest, and the NATS client's publish path); moving the per-chunk sha256 and the
// publishes to a second thread lets both cores work. Same storage contract as ChunkWriter:
// subject `sf.chunk.<hex>`, put-if-absent (expected last subject sequence 0), no Nats-Msg-Id.
//
// Plain CommonJS evaluated from a string (like chunk-fetch-worker.ts), loading the NATS packages
// by absolute path, so it runs the same under node, tsx and vitest.
import { createRequire } from 'node:module';
import { Worker } from 'node:worker_threads';
import type { ChunkRef } from '../core/checkpoint-manifest.ts';
import { ChunkStoreError, type WriterStats } from './chunk-store.ts';
import { WORKER_AUTH_SOURCE, type WorkerAuth } from './nats-auth.ts';

const require = createRequire(import.meta.url);

export interface WorkerPublishOptions {
  /** NATS server URL(s) the worker connects to (the same cluster as the store's connection). */
  readonly servers: string | readonly string[];
  /** The parent's credentials (nats-auth.ts workerAuth). */
  readonly auth?: WorkerAuth | undefined;
  /** Publishes outstanding at once in the worker. */
  readonly maxInFlight: number;
  /** Chunks handed to the worker and not yet acknowledged (bounded memory). */
  readonly aheadChunks?: number;
  readonly timeoutMs?: number;
}

const WORKER_SOURCE = `${WORKER_AUTH_SOURCE}
const { parentPort, workerData } = require('node:worker_threads');
const { createHash } = require('node:crypto');
const transport = require(workerData.transportPath);
const { connect } = transport;
const { jetstream } = require(workerData.jetstreamPath);
const WRONG_LAST_SEQUENCE = 10071;
const { servers, timeoutMs, maxInFlight } = workerData;
const seen = new Set();
const inflight = new Set();
let js = null;
let nc = null;
let failed = null;
const ready = (async () => {
  nc = await connect({ ...natsAuthOptions(workerData.auth, transport), servers, name: 'sandboxfleet-chunk-publish', timeout: timeoutMs });
  js = jetstream(nc, { timeout: timeoutMs });
})();
ready.catch((err) => { failed = err; });
const wrongLast = (err) => { const c = err && err.api_error && err.api_error.err_code; return c === WRONG_LAST_SEQUENCE || (err && /wrong last sequence/i.test(String(err.message))); };
let chain = Promise.resolve();
parentPort.on('message', (m) => {
  chain = chain.then(async () => {
    if (m.op === 'flush') {
      await Promise.all(inflight);
      if (nc) await nc.close().catch(() => undefined);
      parentPort.postMessage({ op: 'flushed', error: failed ? String(failed.message || failed) : null });
      return;
    }
    const data = m.data;
    const digest = 'sha256:' + createHash('sha256').update(data).digest('hex');
    if (failed) { parentPort.postMessage({ op: 'ack', index: m.index, digest, stored: false }); return; }
    if (seen.has(digest)) { parentPort.postMessage({ op: 'ack', index: m.index, digest, stored: false }); return; }
    seen.add(digest);
    await ready.catch(() => undefined);
    while (inflight.size >= maxInFlight) await Promise.race(inflight);
    const task = (async () => {
      try {
        await js.publish('sf.chunk.' + digest.slice(7), data, { expect: { lastSubjectSequence: 0 } });
        parentPort.postMessage({ op: 'ack', index: m.index, digest, stored: true, size: data.length });
      } catch (err) {
        if (wrongLast(err)) parentPort.postMessage({ op: 'ack', index: m.index, digest, stored: false });
        else { failed = failed || err; parentPort.postMessage({ op: 'ack', index: m.index, digest, stored: false }); }
      }
    })();
    const tracked = task.finally(() => inflight.delete(tracked));
    inflight.add(tracked);
  });
});
`;

type WorkerMessage = { op: 'ack'; index: number; digest: string; stored: boolean } | { op: 'flushed'; error: string | null };

/** A ChunkWriter-like uploader whose hashing and publishing run on a worker thread. */
export class WorkerChunkWriter {
  readonly stats: WriterStats = { chunks: 0, bytes: 0, storedChunks: 0, storedBytes: 0 };
  readonly #worker: Worker;
  readonly #ahead: number;
  readonly #refs: (ChunkRef | undefined)[] = [];
  readonly #sizes: number[] = [];
  #acked = 0;
  #failure: Error | null = null;
  #wake: (() => void) | null = null;
  #flushed: ((error: string | null) => void) | null = null;

  constructor(options: WorkerPublishOptions) {
    this.#ahead = options.aheadChunks ?? 32;
    this.#worker = new Worker(WORKER_SOURCE, {
      eval: true,
      name: 'sf-chunk-publish',
      workerData: {
        servers: typeof options.servers === 'string' ? options.servers : [...options.servers],
        auth: options.auth,
        timeoutMs: options.timeoutMs ?? 10_000,
        maxInFlight: options.maxInFlight,
        transportPath: require.resolve('@nats-io/transport-node'),
        jetstreamPath: require.resolve('@nats-io/jetstream'),
      },
    });
    this.#worker.on('message', (m: WorkerMessage) => this.#onMessage(m));
    this.#worker.on('error', (err: Error) => this.#fail(err));
    this.#worker.on('exit', (code) => this.#fail(new Error(`chunk publish worker exited (${code})`)));
  }

  #onMessage(m: WorkerMessage): void {
    if (m.op === 'flushed') {
      this.#flushed?.(m.error);
      return;
    }
    const size = this.#sizes[m.index] ?? 0;
    this.#refs[m.index] = { digest: m.digest, size };
    if (m.stored) {
      this.stats.storedChunks += 1;
      this.stats.storedBytes += size;
    }
    this.#acked += 1;
    this.#wake?.();
    this.#wake = null;
  }

  #fail(err: Error): void {
    this.#failure ??= err;
    this.#wake?.();
    this.#wake = null;
    this.#flushed?.(err.message);
  }

  /** Hand a chunk to the worker (copied: the caller may reuse its memory); waits only for room. */
  async put(data: Buffer): Promise<void> {
    if (this.#failure) throw new ChunkStoreError('transfer_failed', `chunk upload failed: ${this.#failure.message}`);
    const index = this.#sizes.length;
    this.#sizes.push(data.length);
    this.stats.chunks += 1;
    this.stats.bytes += data.length;
    const own = new Uint8Array(data.length);
    own.set(data);
    this.#worker.postMessage({ op: 'chunk', index, data: own }, [own.buffer]);
    while (!this.#failure && index - this.#acked >= this.#ahead) await new Promise<void>((r) => (this.#wake = r));
  }

  /** Wait for every upload; the refs in submission order, or the first failure. Stops the worker. */
  async flush(): Promise<{ refs: ChunkRef[]; stats: WriterStats }> {
    try {
      const error = await new Promise<string | null>((resolve) => {
        this.#flushed = resolve;
        if (this.#failure) resolve(this.#failure.message);
        else this.#worker.postMessage({ op: 'flush' });
      });
      if (error !== null) throw new ChunkStoreError('transfer_failed', `chunk upload failed: ${error}`);
      const refs = this.#refs.slice(0, this.#sizes.length);
      if (refs.length !== this.#sizes.length || refs.some((r) => r === undefined)) throw new ChunkStoreError('transfer_failed', 'chunk upload ended with unacknowledged chunks');
      return { refs: refs as ChunkRef[], stats: this.stats };
    } finally {
      this.#worker.removeAllListeners('exit');
      await this.#worker.terminate();
    }
  }

  /** Stop without waiting (capture failed). */
  async abort(): Promise<void> {
    this.#worker.removeAllListeners('exit');
    await this.#worker.terminate();
  }
}
