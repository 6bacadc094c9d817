// Hash, deduplicate and publish checkpoint chunks on a worker thread with its own NATS connection
// (R-G3). Why: capture is CPU-bound on one thread (tar parsing, content-defined chunking, the
// whole-layer digest, and the NATS client's publish path); moving the per-chunk sha256 and the
// publishes to a second thread lets both cores work. Same storage contract as ChunkStore.put:
// subject `sf.chunk.<hex>` on a write-once stream; put-if-absent (expected last subject sequence
// 0); a stored copy counts only if its bytes are ours (other bytes: chunk_digest_mismatch, the chunk
// was planted or damaged and cannot be replaced); no Nats-Msg-Id. The stream's name is learned
// from the server's first publish answer (the stream that took or refused the chunk), so callers
// need not pass it; from then on each chunk's stored copy is read before anything is uploaded.
//
// Plain CommonJS evaluated from a string (like chunk-fetch-worker.ts), loading the NATS packages
// by absolute path, so it runs the same under node, tsx and vitest.
import { createRequire } from 'node:module';
import { Worker } from 'node:worker_threads';
import type { ChunkRef } from '../core/checkpoint-manifest.ts';
import { ChunkStoreError, type ChunkStoreErrorReason, type WriterStats } from './chunk-store.ts';
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
const { jetstreamManager } = require(workerData.jetstreamPath);
const WRONG_LAST_SEQUENCE = 10071;
const WRONG_LAST_SEQUENCE_IN_FLIGHT = 10164;
const STORE_FAILED = 10077;
const PUT_ATTEMPTS = 3;
const { servers, timeoutMs, maxInFlight } = workerData;
const seen = new Set();
const inflight = new Set();
let jsm = null;
let nc = null;
let failed = null;
// The chunk stream, as named by the server's first publish answer; null until then.
let stream = null;
const ready = (async () => {
  nc = await connect({ ...natsAuthOptions(workerData.auth, transport), servers, name: 'sandboxfleet-chunk-publish', timeout: timeoutMs });
  jsm = await jetstreamManager(nc, { timeout: timeoutMs });
})();
ready.catch((err) => { failed = failed || { reason: 'transfer_failed', message: String(err && err.message || err) }; });
const refusal = (reason, message) => Object.assign(new Error(message), { reason });
// Present already: the put-if-absent expectation failed, or the stream's one-message-per-subject limit refused it.
const alreadyStored = (e) => e.err_code === WRONG_LAST_SEQUENCE || e.err_code === WRONG_LAST_SEQUENCE_IN_FLIGHT || (e.err_code === STORE_FAILED && /maximum messages per subject exceeded/i.test(String(e.description)));
// A JetStream publish by hand, to read the answer's stream name even when the write is refused.
const publishIfAbsent = async (subject, data) => {
  const h = transport.headers();
  h.set('Nats-Expected-Last-Subject-Sequence', '0');
  const reply = await nc.request(subject, data, { timeout: timeoutMs, headers: h });
  const ack = JSON.parse(new TextDecoder().decode(reply.data));
  if (typeof ack.stream === 'string' && ack.stream !== '') stream = ack.stream;
  if (!ack.error) return true;
  if (alreadyStored(ack.error)) return false;
  throw new Error('publish refused: ' + ack.error.description + ' (' + ack.error.err_code + ')');
};
// Whether the subject holds exactly these bytes; false when empty; other bytes are a refusal (write-once).
const holdsSame = async (subject, digest, data) => {
  const msg = await jsm.direct.getMessage(stream, { last_by_subj: subject });
  if (msg === null) return false;
  if (Buffer.from(msg.data.buffer, msg.data.byteOffset, msg.data.byteLength).equals(Buffer.from(data.buffer, data.byteOffset, data.byteLength))) return true;
  throw refusal('chunk_digest_mismatch', 'chunk ' + digest + ' is already stored with other bytes (planted or damaged); chunks are write-once, so this digest cannot be stored until garbage collection removes that copy');
};
const storeChunk = async (digest, data) => {
  const subject = 'sf.chunk.' + digest.slice(7);
  for (let attempt = 0; attempt < PUT_ATTEMPTS; attempt++) {
    if (stream !== null && (await holdsSame(subject, digest, data))) return false;
    if (await publishIfAbsent(subject, data)) return true;
    if (stream === null) break; // refused, and the answer named no stream to read the copy from
  }
  throw refusal('transfer_failed', 'chunk ' + digest + ': the store reports it present but it could not be read back');
};
let chain = Promise.resolve();
parentPort.on('message', (m) => {
  chain = chain.then(async () => {
    if (m.op === 'flush') {
      await Promise.all(inflight);
      if (nc) await nc.close().catch(() => undefined);
      parentPort.postMessage({ op: 'flushed', error: failed });
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
        const stored = await storeChunk(digest, data);
        parentPort.postMessage({ op: 'ack', index: m.index, digest, stored, size: data.length });
      } catch (err) {
        failed = failed || { reason: err && err.reason ? err.reason : 'transfer_failed', message: String(err && err.message || err) };
        parentPort.postMessage({ op: 'ack', index: m.index, digest, stored: false });
      }
    })();
    const tracked = task.finally(() => inflight.delete(tracked));
    inflight.add(tracked);
  });
});
`;

/** A failure the worker reports: its reason when it knows one (a planted chunk), else transfer_failed. */
interface WorkerFailure {
  readonly reason: string;
  readonly message: string;
}

function toError(failure: WorkerFailure): ChunkStoreError {
  // Only a refusal the store itself would give passes through; anything else means "retry elsewhere".
  const reason: ChunkStoreErrorReason = failure.reason === 'chunk_digest_mismatch' ? 'chunk_digest_mismatch' : 'transfer_failed';
  return new ChunkStoreError(reason, `chunk upload failed: ${failure.message}`);
}

type WorkerMessage = { op: 'ack'; index: number; digest: string; stored: boolean } | { op: 'flushed'; error: WorkerFailure | null };

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
  #flushed: ((error: WorkerFailure | null) => void) | null = null;

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
    this.#flushed?.({ reason: 'transfer_failed', message: err.message });
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
      const error = await new Promise<WorkerFailure | null>((resolve) => {
        this.#flushed = resolve;
        if (this.#failure) resolve({ reason: 'transfer_failed', message: this.#failure.message });
        else this.#worker.postMessage({ op: 'flush' });
      });
      if (error !== null) throw toError(error);
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
