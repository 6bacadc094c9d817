// Hash, deduplicate and publish checkpoint chunks on a worker thread with its own NATS connection
// (R-G3). Why: capture is CPU-bound on one thread (tar parsing, content-defined chunking, and the
// NATS client's publish path); moving the per-chunk sha256 and the publishes to a second thread
// lets both cores work. Same storage contract as ChunkStore.put: subject `sf.chunk.<hex>` on a
// write-once stream; put-if-absent (expected last subject sequence 0); a stored copy counts only if
// its bytes are ours (other bytes: chunk_digest_mismatch, the chunk was planted or damaged and
// cannot be replaced); no Nats-Msg-Id. The stream's name is given by the caller (or else learned
// from the server's first publish answer: the stream that took or refused the chunk); once known,
// each chunk's stored copy is read before anything is uploaded.
// An incremental capture also asks it whether the old chunks it reuses are still stored (a stream
// info filtered to the chunk's subject: no chunk bytes move), so a manifest never names a chunk that
// garbage collection removed, and to fetch the old chunks whose bytes it feeds its chunker (off the
// main thread, where assembling ~512 KiB messages in the NATS client cost ~10 ms each, profiled);
// and a version-1 capture has it hash the whole layer in chunk order.
// Pooled: starting a worker and its connection costs 50-200 ms (measured here), as much as a whole
// incremental checkpoint, so one idle worker per connection is kept for IDLE_MS (unref'd: it never
// keeps the process alive); a worker whose job failed is terminated, never reused.
//
// Its connection creates no stack trace per request (`noAsyncTraces`): two requests per chunk made
// that ~10% of the worker's CPU (measured with --cpu-prof); a failure still says what failed.
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
  /** The chunk stream's name, when known (ChunkStore.chunkStream); needed for exists(). */
  readonly stream?: string;
  /** Also hash every chunk, in order, into a whole-layer sha256 (a version-1 layer digest). */
  readonly hashLayer?: boolean;
  /** Told when the worker is done with a chunk passed in shared memory (its memory may be reused). */
  readonly published?: (data: Buffer) => void;
}

const IDLE_MS = 30_000;

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
const { servers, timeoutMs } = workerData;
let jsm = null;
let nc = null;
let broken = null;
const ready = (async () => {
  nc = await connect({ ...natsAuthOptions(workerData.auth, transport), servers, name: 'sandboxfleet-chunk-publish', timeout: timeoutMs, noAsyncTraces: true });
  jsm = await jetstreamManager(nc, { timeout: timeoutMs });
})();
ready.catch((err) => { broken = { reason: 'transfer_failed', message: String(err && err.message || err) }; });
// One job (one layer) at a time: begin resets this.
let job = null;
const refusal = (reason, message) => Object.assign(new Error(message), { reason });
// Present already: the put-if-absent expectation failed, or the stream's one-message-per-subject limit refused it.
const alreadyStored = (e) => e.err_code === WRONG_LAST_SEQUENCE || e.err_code === WRONG_LAST_SEQUENCE_IN_FLIGHT || (e.err_code === STORE_FAILED && /maximum messages per subject exceeded/i.test(String(e.description)));
// A JetStream publish by hand, to read the answer's stream name even when the write is refused.
const publishIfAbsent = async (j, subject, data) => {
  const h = transport.headers();
  h.set('Nats-Expected-Last-Subject-Sequence', '0');
  const reply = await nc.request(subject, data, { timeout: timeoutMs, headers: h });
  const ack = JSON.parse(new TextDecoder().decode(reply.data));
  if (typeof ack.stream === 'string' && ack.stream !== '') j.stream = ack.stream;
  if (!ack.error) return true;
  if (alreadyStored(ack.error)) return false;
  throw new Error('publish refused: ' + ack.error.description + ' (' + ack.error.err_code + ')');
};
// The message on a subject (write-once: at most one). A direct get's "none" may come from a replica
// that has not caught up (after a restart or a freeze): the stream leader's answer decides it.
const lastBySubject = async (stream, subject) => {
  const msg = await jsm.direct.getMessage(stream, { last_by_subj: subject });
  return msg !== null ? msg : jsm.streams.getMessage(stream, { last_by_subj: subject });
};
// Whether the subject holds exactly these bytes; false when empty; other bytes are a refusal (write-once).
// With leader set, an empty answer of a direct get is asked again of the stream leader. Before a publish it
// is not: a lagging replica's "none" only costs an upload that the leader then refuses
// (put-if-absent), and the loop reads the copy again, from the leader. For a new chunk that saves
// a request whose "no message" answer the client turns into an error (~400 per 200 MiB capture).
const holdsSame = async (j, subject, digest, data, leader) => {
  const msg = leader ? await lastBySubject(j.stream, subject) : await jsm.direct.getMessage(j.stream, { last_by_subj: subject });
  if (msg === null) return false;
  if (Buffer.from(msg.data.buffer, msg.data.byteOffset, msg.data.byteLength).equals(Buffer.from(data.buffer, data.byteOffset, data.byteLength))) return true;
  throw refusal('chunk_digest_mismatch', 'chunk ' + digest + ' is already stored with other bytes (planted or damaged); chunks are write-once, so this digest cannot be stored until garbage collection removes that copy');
};
const storeChunk = async (j, digest, data) => {
  const subject = 'sf.chunk.' + digest.slice(7);
  for (let attempt = 0; attempt < PUT_ATTEMPTS; attempt++) {
    if (j.stream !== null && (await holdsSame(j, subject, digest, data, attempt > 0))) return false;
    if (await publishIfAbsent(j, subject, data)) return true;
    if (j.stream === null) break; // refused, and the answer named no stream to read the copy from
  }
  throw refusal('transfer_failed', 'chunk ' + digest + ': the store reports it present but it could not be read back');
};
const track = (j, task) => {
  const tracked = task.finally(() => j.inflight.delete(tracked));
  j.inflight.add(tracked);
};
// An old chunk's bytes (an incremental capture feeds them to its chunker): verified, moved over.
// Served at once, not behind the queued uploads and checks: the capture waits for these bytes.
const serveGet = (j, m) => {
  track(j, (async () => {
    try {
      await ready;
      if (j.stream === null) throw new Error('the chunk stream is not known');
      const msg = await lastBySubject(j.stream, 'sf.chunk.' + m.digest.slice(7));
      if (msg === null) return parentPort.postMessage({ op: 'got', id: m.id, error: { reason: 'chunk_missing', message: 'chunk ' + m.digest + ' is not in the store' } });
      const digest = 'sha256:' + createHash('sha256').update(msg.data).digest('hex');
      if (msg.data.length !== m.size || digest !== m.digest) return parentPort.postMessage({ op: 'got', id: m.id, error: { reason: 'chunk_digest_mismatch', message: 'chunk ' + m.digest + ' does not verify' } });
      const own = new Uint8Array(msg.data.length);
      own.set(msg.data);
      parentPort.postMessage({ op: 'got', id: m.id, data: own }, [own.buffer]);
    } catch (err) {
      parentPort.postMessage({ op: 'got', id: m.id, error: { reason: 'transfer_failed', message: String(err && err.message || err) } });
    }
  })());
};
let chain = Promise.resolve();
parentPort.on('message', (m) => {
  if (m.op === 'get' && job !== null) return serveGet(job, m);
  chain = chain.then(async () => {
    if (m.op === 'begin') {
      job = { seen: new Set(), inflight: new Set(), failed: broken, stream: m.stream || null, missing: [], hash: m.hashLayer ? createHash('sha256') : null, maxInFlight: m.maxInFlight };
      return;
    }
    const j = job;
    if (m.op === 'get') return serveGet(j, m);
    if (m.op === 'flush') {
      await Promise.all(j.inflight);
      job = null;
      parentPort.postMessage({ op: 'flushed', error: j.failed, missing: j.missing, layerDigest: j.hash ? 'sha256:' + j.hash.digest('hex') : null });
      return;
    }
    if (m.op === 'exists') {
      await ready.catch(() => undefined);
      while (j.inflight.size >= j.maxInFlight) await Promise.race(j.inflight);
      track(j, (async () => {
        try {
          if (j.failed) return;
          if (j.stream === null) throw new Error('the chunk stream is not known');
          const subject = 'sf.chunk.' + m.digest.slice(7);
          // The stream info request by hand: an incremental capture checks every reused chunk (~330
          // per 200 MiB), and the manager's wrapper cost ~2x the client CPU (measured).
          const reply = await nc.request('$JS.API.STREAM.INFO.' + j.stream, JSON.stringify({ subjects_filter: subject }), { timeout: timeoutMs });
          const info = JSON.parse(new TextDecoder().decode(reply.data));
          if (info.error) throw new Error('stream info refused: ' + info.error.description + ' (' + info.error.err_code + ')');
          if (!(((info.state && info.state.subjects) || {})[subject] > 0)) j.missing.push(m.index);
        } catch (err) {
          j.failed = j.failed || { reason: 'transfer_failed', message: String(err && err.message || err) };
        }
      })());
      return;
    }
    const data = m.data;
    if (j.hash) j.hash.update(data);
    const digest = 'sha256:' + createHash('sha256').update(data).digest('hex');
    if (j.failed || j.seen.has(digest)) { parentPort.postMessage({ op: 'ack', index: m.index, digest, stored: false }); return; }
    j.seen.add(digest);
    await ready.catch(() => undefined);
    while (j.inflight.size >= j.maxInFlight) await Promise.race(j.inflight);
    track(j, (async () => {
      try {
        const stored = await storeChunk(j, digest, data);
        parentPort.postMessage({ op: 'ack', index: m.index, digest, stored });
      } catch (err) {
        j.failed = j.failed || { reason: err && err.reason ? err.reason : 'transfer_failed', message: String(err && err.message || err) };
        parentPort.postMessage({ op: 'ack', index: m.index, digest, stored: false });
      }
    })());
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

interface Flushed {
  readonly error: WorkerFailure | null;
  readonly missing: number[];
  readonly layerDigest: string | null;
}

type WorkerMessage =
  | { op: 'ack'; index: number; digest: string; stored: boolean }
  | ({ op: 'flushed' } & Flushed)
  | { op: 'got'; id: number; data?: Uint8Array; error?: WorkerFailure };

/** What a flushed writer reports. */
export interface PublishResult {
  /** The new chunks' refs, in the order they were put. */
  readonly refs: ChunkRef[];
  readonly stats: WriterStats;
  /** The `exists()` checks (by their index) whose chunk is not in the store. */
  readonly missing: readonly number[];
  /** The whole-layer sha256 over every put chunk in order, with `hashLayer`; null otherwise. */
  readonly layerDigest: string | null;
}

/** The idle worker kept for the next job on the same connection. */
let idle: { key: string; worker: Worker; timer: NodeJS.Timeout } | undefined;

function connectionKey(options: WorkerPublishOptions): string {
  return JSON.stringify([options.servers, options.auth ?? null, options.timeoutMs ?? 10_000]);
}

function acquire(options: WorkerPublishOptions): Worker {
  const key = connectionKey(options);
  if (idle !== undefined && idle.key === key) {
    const { worker, timer } = idle;
    idle = undefined;
    clearTimeout(timer);
    worker.ref();
    return worker;
  }
  return new Worker(WORKER_SOURCE, {
    eval: true,
    name: 'sf-chunk-publish',
    workerData: {
      servers: typeof options.servers === 'string' ? options.servers : [...options.servers],
      auth: options.auth,
      timeoutMs: options.timeoutMs ?? 10_000,
      transportPath: require.resolve('@nats-io/transport-node'),
      jetstreamPath: require.resolve('@nats-io/jetstream'),
    },
  });
}

function release(worker: Worker, key: string, reusable: boolean): void {
  if (!reusable || idle !== undefined) {
    void worker.terminate();
    return;
  }
  worker.unref();
  const timer = setTimeout(() => {
    if (idle?.worker === worker) idle = undefined;
    void worker.terminate();
  }, IDLE_MS);
  timer.unref();
  idle = { key, worker, timer };
}

/** A ChunkWriter-like uploader whose hashing and publishing run on a (pooled) worker thread. */
export class WorkerChunkWriter {
  readonly stats: WriterStats = { chunks: 0, bytes: 0, storedChunks: 0, storedBytes: 0 };
  readonly #worker: Worker;
  readonly #key: string;
  readonly #ahead: number;
  readonly #refs: (ChunkRef | undefined)[] = [];
  readonly #sizes: number[] = [];
  /** Chunks in shared memory the worker still reads, by index (told to `published` on their ack). */
  readonly #shared = new Map<number, Buffer>();
  readonly #published: ((data: Buffer) => void) | undefined;
  #acked = 0;
  #checks = 0;
  #failure: Error | null = null;
  #wake: (() => void) | null = null;
  #flushed: ((m: Flushed) => void) | null = null;
  #done = false;
  readonly #gets = new Map<number, { resolve: (b: Buffer) => void; reject: (e: Error) => void }>();
  #nextGet = 1;
  readonly #onMessage = (m: WorkerMessage): void => this.#handle(m);
  readonly #onError = (err: Error): void => this.#fail(err);
  readonly #onExit = (code: number): void => this.#fail(new Error(`chunk publish worker exited (${code})`));

  constructor(options: WorkerPublishOptions) {
    this.#ahead = options.aheadChunks ?? 32;
    this.#published = options.published;
    this.#key = connectionKey(options);
    this.#worker = acquire(options);
    this.#worker.on('message', this.#onMessage);
    this.#worker.on('error', this.#onError);
    this.#worker.on('exit', this.#onExit);
    this.#worker.postMessage({ op: 'begin', stream: options.stream ?? null, hashLayer: options.hashLayer === true, maxInFlight: options.maxInFlight });
  }

  #handle(m: WorkerMessage): void {
    if (m.op === 'flushed') {
      this.#flushed?.(m);
      return;
    }
    if (m.op === 'got') {
      const p = this.#gets.get(m.id);
      this.#gets.delete(m.id);
      if (m.data !== undefined) p?.resolve(Buffer.from(m.data.buffer, m.data.byteOffset, m.data.byteLength));
      else {
        const reason = m.error?.reason === 'chunk_missing' || m.error?.reason === 'chunk_digest_mismatch' ? m.error.reason : 'transfer_failed';
        p?.reject(new ChunkStoreError(reason, m.error?.message ?? 'chunk fetch failed'));
      }
      return;
    }
    const size = this.#sizes[m.index] ?? 0;
    this.#refs[m.index] = { digest: m.digest, size };
    const shared = this.#shared.get(m.index);
    if (shared !== undefined) {
      this.#shared.delete(m.index);
      this.#published?.(shared);
    }
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
    for (const p of this.#gets.values()) p.reject(new ChunkStoreError('transfer_failed', `chunk fetch failed: ${err.message}`));
    this.#gets.clear();
    this.#wake?.();
    this.#wake = null;
    this.#flushed?.({ error: { reason: 'transfer_failed', message: err.message }, missing: [], layerDigest: null });
  }

  /**
   * Hand a chunk to the worker; waits only for room. A chunk in shared memory is passed as it is
   * (the caller must not change those bytes until flush(): the chunker never rewrites a cut chunk);
   * any other is copied, so the caller may reuse its memory.
   */
  async put(data: Buffer): Promise<void> {
    if (this.#failure) throw new ChunkStoreError('transfer_failed', `chunk upload failed: ${this.#failure.message}`);
    const index = this.#sizes.length;
    this.#sizes.push(data.length);
    this.stats.chunks += 1;
    this.stats.bytes += data.length;
    if (data.buffer instanceof SharedArrayBuffer) {
      this.#shared.set(index, data);
      this.#worker.postMessage({ op: 'chunk', index, data: new Uint8Array(data.buffer, data.byteOffset, data.byteLength) });
    } else {
      const own = new Uint8Array(data.length);
      own.set(data);
      this.#worker.postMessage({ op: 'chunk', index, data: own }, [own.buffer]);
    }
    while (!this.#failure && index - this.#acked >= this.#ahead) await new Promise<void>((r) => (this.#wake = r));
  }

  /**
   * Ask whether a chunk (one this writer does not upload: an old chunk an incremental capture
   * reuses) is still stored; flush() lists the `index` of each one that is not.
   */
  exists(digest: string): number {
    if (this.#failure) throw new ChunkStoreError('transfer_failed', `chunk check failed: ${this.#failure.message}`);
    const index = this.#checks++;
    this.#worker.postMessage({ op: 'exists', index, digest });
    return index;
  }

  /**
   * A stored chunk's bytes, verified against its digest: the old bytes an incremental capture feeds
   * its chunker (needs the stream named in the options).
   */
  get(ref: ChunkRef): Promise<Buffer> {
    if (this.#failure) return Promise.reject(new ChunkStoreError('transfer_failed', `chunk fetch failed: ${this.#failure.message}`));
    const id = this.#nextGet++;
    const reply = new Promise<Buffer>((resolve, reject) => this.#gets.set(id, { resolve, reject }));
    this.#worker.postMessage({ op: 'get', id, digest: ref.digest, size: ref.size });
    return reply;
  }

  /** Wait for every upload and check; the refs in submission order, or the first failure. Releases the worker. */
  async flush(): Promise<PublishResult> {
    let ok = false;
    try {
      const done = await new Promise<Flushed>((resolve) => {
        this.#flushed = resolve;
        if (this.#failure) resolve({ error: { reason: 'transfer_failed', message: this.#failure.message }, missing: [], layerDigest: null });
        else this.#worker.postMessage({ op: 'flush' });
      });
      if (done.error !== null) throw toError(done.error);
      const refs = this.#refs.slice(0, this.#sizes.length);
      if (refs.length !== this.#sizes.length || refs.some((r) => r === undefined)) throw new ChunkStoreError('transfer_failed', 'chunk upload ended with unacknowledged chunks');
      ok = true;
      return { refs: refs as ChunkRef[], stats: this.stats, missing: done.missing, layerDigest: done.layerDigest };
    } finally {
      this.#finish(ok);
    }
  }

  /** Stop without waiting (capture failed): the worker is terminated, not reused. */
  async abort(): Promise<void> {
    this.#finish(false);
  }

  #finish(reusable: boolean): void {
    if (this.#done) return;
    this.#done = true;
    this.#worker.off('message', this.#onMessage);
    this.#worker.off('error', this.#onError);
    this.#worker.off('exit', this.#onExit);
    release(this.#worker, this.#key, reusable && this.#failure === null);
  }
}
