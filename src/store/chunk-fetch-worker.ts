// Fetch and verify checkpoint chunks on a worker thread with its own NATS connection (R-G5, R-R2).
// Why: restore is CPU-bound in the NATS client's receive path (it assembles each ~512 KiB message
// from 64 KiB socket reads), on the same thread that parses the layer and feeds `tar -x`. On its own
// thread the fetch overlaps with parsing and extraction. Every chunk's size and sha256 are still
// checked (in the worker) before its bytes reach the restore, which checks the whole-layer digest.
//
// The worker is plain CommonJS evaluated from a string (like sha256-pool.ts), so it runs the same
// under node, tsx and vitest; it loads the NATS packages by absolute path resolved here.
import { createRequire } from 'node:module';
import { Worker } from 'node:worker_threads';
import type { ChunkRef } from '../core/checkpoint-manifest.ts';
import { ChunkStoreError } from './chunk-store.ts';
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
  /** Verified chunks the worker may deliver ahead of the consumer (bounded memory). */
  readonly aheadChunks?: number;
  readonly timeoutMs?: number;
}

const WORKER_SOURCE = `${WORKER_AUTH_SOURCE}
const { parentPort, workerData } = require('node:worker_threads');
const { createHash } = require('node:crypto');
const transport = require(workerData.transportPath);
const { connect } = transport;
const { jetstreamManager } = require(workerData.jetstreamPath);
const { refs, stream, maxInFlight, ahead, servers, timeoutMs } = workerData;
let consumed = 0;
let wake = null;
parentPort.on('message', (m) => { if (m.op === 'consumed') { consumed = m.count; if (wake) { wake(); wake = null; } } });
const fail = (reason, message) => parentPort.postMessage({ op: 'error', reason, message });
(async () => {
  let nc;
  try {
    nc = await connect({ ...natsAuthOptions(workerData.auth, transport), servers, name: 'sandboxfleet-chunk-fetch', timeout: timeoutMs });
    const jsm = await jetstreamManager(nc, { timeout: timeoutMs });
    const get = (ref) => jsm.direct.getMessage(stream, { last_by_subj: 'sf.chunk.' + ref.digest.slice(7) });
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
      while (i - consumed >= ahead) await new Promise((r) => { wake = r; });
      const own = new Uint8Array(data.length);
      own.set(data);
      parentPort.postMessage({ op: 'chunk', index: i, data: own }, [own.buffer]);
    }
    parentPort.postMessage({ op: 'done' });
  } catch (err) {
    fail('transfer_failed', err && err.message ? err.message : String(err));
  } finally {
    if (nc) await nc.close().catch(() => undefined);
  }
})();
`;

type WorkerMessage =
  | { op: 'chunk'; index: number; data: Uint8Array }
  | { op: 'done' }
  | { op: 'error'; reason: string; message: string };

// The whole-layer digest stays on the consumer's thread: hashing it in the worker too made the
// worker the bottleneck (measured: ~1.0 s versus ~0.88 s for a 200 MiB layer).
/** Verified chunks in order, fetched on a worker thread (see the file header); abandoning the iteration stops it. */
export async function* fetchChunksInWorker(refs: readonly ChunkRef[], options: WorkerFetchOptions): AsyncGenerator<Buffer> {
  if (refs.length === 0) return;
  const worker = new Worker(WORKER_SOURCE, {
    eval: true,
    name: 'sf-chunk-fetch',
    workerData: {
      refs: refs.map((r) => ({ digest: r.digest, size: r.size })),
      stream: options.stream,
      maxInFlight: options.maxInFlight,
      ahead: options.aheadChunks ?? 32,
      servers: typeof options.servers === 'string' ? options.servers : [...options.servers],
      auth: options.auth,
      timeoutMs: options.timeoutMs ?? 10_000,
      transportPath: require.resolve('@nats-io/transport-node'),
      jetstreamPath: require.resolve('@nats-io/jetstream'),
    },
  });
  const queue: WorkerMessage[] = [];
  let notify: (() => void) | null = null;
  const push = (m: WorkerMessage): void => {
    queue.push(m);
    notify?.();
    notify = null;
  };
  worker.on('message', push);
  worker.on('error', (err: Error) => push({ op: 'error', reason: 'transfer_failed', message: err.message }));
  worker.on('exit', (code) => push({ op: 'error', reason: 'transfer_failed', message: `chunk fetch worker exited (${code})` }));
  try {
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
        return;
      }
      if (m.index !== delivered) throw new ChunkStoreError('transfer_failed', `chunk ${m.index} arrived out of order (expected ${delivered})`);
      delivered += 1;
      worker.postMessage({ op: 'consumed', count: delivered });
      yield Buffer.from(m.data.buffer, m.data.byteOffset, m.data.byteLength);
    }
  } finally {
    worker.removeAllListeners('exit');
    await worker.terminate();
  }
}
