// The two restore passes (restore.ts scanLayer / extractLayer) on a worker thread (issue #11 item 3).
// Why: the scan of a hostile layer parses up to millions of headers and its validator remembers
// every path; on the agent's main thread that is seconds of CPU and a heap of hundreds of MiB whose
// garbage collection pauses the event loop, so heartbeats and commands would wait behind a restore.
// Here the main thread only moves chunk buffers (shared or transferred, not copied, when it can); the
// worker's heap is its own (capped by resourceLimits) and is freed when the worker ends.
// The worker runs layer-worker.ts, TypeScript loaded through tsx's tsImport (tsx is a runtime
// dependency: production runs `node --import tsx` too), so it uses the very same rule and tar code.
// Workers are pooled: starting one costs ~0.2 s (loader set-up), so one idle worker is kept for
// IDLE_MS (unref'd: it never keeps the process alive); a worker whose job failed is terminated.
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import { Worker } from 'node:worker_threads';
import { holdsWholeBuffer } from '../../store/sole-buffers.ts';
import { LayerTransferError, deserializeLayerError, type SerializedLayerError } from './errors.ts';
import type { ExtractJob, LayerChunks, LayerPasses, RestoredLayer, ScanJob, ScannedLayer } from './restore.ts';

const require = createRequire(import.meta.url);

/** Chunks posted ahead of the worker's consumption (bounded memory: ~8 × 1 MiB). */
const AHEAD = 8;
const IDLE_MS = 30_000;
/**
 * Heap cap of a layer worker. The validator of a layer at the default limits (1,000,000 entries,
 * 256 Mi characters of names) needs far less; a worker over it dies (`layer_worker_failed`) instead
 * of taking the agent's memory.
 */
const MAX_OLD_GENERATION_MB = 1536;

const BOOT_SOURCE = `
const { workerData, parentPort } = require('node:worker_threads');
import(workerData.tsxApi)
  .then(({ tsImport }) => tsImport(workerData.module, workerData.parent))
  .catch((err) => parentPort.postMessage({ op: 'boot_error', message: String((err && err.stack) || err) }));
`;

export type JobKind = 'scan' | 'extract';

export type ToWorker =
  | { op: 'job'; id: number; kind: 'scan'; job: ScanJob }
  | { op: 'job'; id: number; kind: 'extract'; job: ExtractJob }
  /** `lent`: hand it back once the pass is done with it (JobOptions.lend). */
  | { op: 'chunk'; id: number; data: Uint8Array; lent?: true }
  | { op: 'end'; id: number }
  | { op: 'abort'; id: number };

export type FromWorker =
  | { op: 'ready' }
  | { op: 'boot_error'; message: string }
  | { op: 'consumed'; id: number; count: number }
  /** A lent chunk (JobOptions.lend) the pass no longer reads, by its position in the source. */
  | { op: 'returned'; id: number; index: number; data: Uint8Array }
  | { op: 'result'; id: number; value: ScannedLayer | RestoredLayer }
  | { op: 'error'; id: number; error: SerializedLayerError };

function startWorker(): Promise<Worker> {
  const worker = new Worker(BOOT_SOURCE, {
    eval: true,
    name: 'sf-layer',
    resourceLimits: { maxOldGenerationSizeMb: MAX_OLD_GENERATION_MB },
    workerData: {
      // The ESM entry of tsx's API (its CommonJS one cannot register the loader inside a worker).
      tsxApi: pathToFileURL(require.resolve('tsx/esm/api').replace(/\.cjs$/, '.mjs')).href,
      module: new URL('./layer-worker.ts', import.meta.url).href,
      parent: import.meta.url,
    },
  });
  return new Promise((resolve, reject) => {
    const done = (): void => {
      worker.off('message', onMessage);
      worker.off('error', onError);
      worker.off('exit', onExit);
    };
    const fail = (message: string): void => {
      done();
      void worker.terminate();
      reject(new LayerTransferError('worker_failed', `layer worker did not start: ${message}`));
    };
    const onMessage = (m: FromWorker): void => {
      if (m.op !== 'ready') return fail(m.op === 'boot_error' ? m.message : `unexpected ${m.op}`);
      done();
      resolve(worker);
    };
    const onError = (err: Error): void => fail(err.message);
    const onExit = (code: number): void => fail(`exited ${code}`);
    worker.on('message', onMessage);
    worker.on('error', onError);
    worker.on('exit', onExit);
  });
}

/**
 * The pooled idle worker, with the listeners it holds while idle. Listeners are always removed by
 * reference: Worker.removeAllListeners() would also drop Node's own ones (it refs and unrefs the
 * message port by listener count), after which messages stop arriving.
 */
let idle: { worker: Worker; timer: NodeJS.Timeout; onExit: () => void; onError: () => void } | undefined;
let nextJobId = 1;

async function acquire(): Promise<Worker> {
  if (idle !== undefined) {
    const { worker, timer, onExit, onError } = idle;
    idle = undefined;
    clearTimeout(timer);
    worker.off('exit', onExit);
    worker.off('error', onError);
    worker.ref();
    return worker;
  }
  return startWorker();
}

function release(worker: Worker, reusable: boolean): void {
  if (!reusable || idle !== undefined) {
    void worker.terminate();
    return;
  }
  worker.unref();
  const onError = (): void => undefined;
  const onExit = (): void => {
    if (idle?.worker === worker) idle = undefined;
  };
  worker.on('error', onError);
  worker.once('exit', onExit);
  // Out of the pool before it is told to stop: its exit comes later, and a job that took it in between
  // would see it exit (code 1) mid-restore (seen: a bench restore ~30 s after the one before failed).
  const timer = setTimeout(() => {
    if (idle?.worker === worker) idle = undefined;
    void worker.terminate();
  }, IDLE_MS);
  timer.unref();
  idle = { worker, timer, onExit, onError };
}


export interface JobOptions {
  /**
   * The source yields buffers nobody else uses afterwards (fresh reads, worker-fetched chunks):
   * they are transferred to the worker. Otherwise each is copied (e.g. an array replayed twice).
   */
  readonly transfer?: boolean;
  /**
   * Chunks the caller lends instead of giving: the worker hands each one `wants` (by its position
   * in the source, asked as it is sent) back to `back` (moved again, not copied) once the pass no
   * longer reads it (the scan: once parsed; the extraction: once tar's pipe took it). A chunk the
   * caller keeps for later then needs no copy of its own. A pass that fails may keep some: the
   * caller must not count on getting every one back.
   */
  readonly lend?: ChunkLender;
}

export interface ChunkLender {
  wants(index: number): boolean;
  back(index: number, data: Uint8Array): void;
}

/**
 * Run one pass on a layer worker, feeding it `chunks` with at most AHEAD in flight. Resolves with
 * the pass's result; rejects with its error (LayerRuleError, LayerTransferError, ...), with the
 * source's own error when reading a chunk fails, or `worker_failed` when the worker dies.
 */
export async function runLayerJob(kind: 'scan', job: ScanJob, chunks: LayerChunks, options?: JobOptions): Promise<ScannedLayer>;
export async function runLayerJob(kind: 'extract', job: ExtractJob, chunks: LayerChunks, options?: JobOptions): Promise<RestoredLayer>;
export async function runLayerJob(kind: JobKind, job: ScanJob | ExtractJob, chunks: LayerChunks, options: JobOptions = {}): Promise<ScannedLayer | RestoredLayer> {
  const worker = await acquire();
  const id = nextJobId++;
  let consumed = 0;
  let wake: (() => void) | undefined;
  let settled: { ok: true; value: ScannedLayer | RestoredLayer } | { ok: false; error: Error } | undefined;
  const settle = (s: NonNullable<typeof settled>): void => {
    settled ??= s;
    wake?.();
  };
  const onMessage = (m: FromWorker): void => {
    if (m.op === 'returned' && m.id === id) return options.lend?.back(m.index, m.data);
    if (m.op === 'consumed' && m.id === id) consumed = m.count;
    else if (m.op === 'result' && m.id === id) settle({ ok: true, value: m.value });
    else if (m.op === 'error' && m.id === id) settle({ ok: false, error: deserializeLayerError(m.error) });
    wake?.();
  };
  const onError = (err: Error): void => settle({ ok: false, error: new LayerTransferError('worker_failed', `layer worker failed: ${err.message}`, { cause: err }) });
  const onExit = (code: number): void => settle({ ok: false, error: new LayerTransferError('worker_failed', `layer worker exited (${code})`) });
  worker.on('message', onMessage);
  worker.on('error', onError);
  worker.on('exit', onExit);
  const waitFor = async (done: () => boolean): Promise<void> => {
    while (!done()) await new Promise<void>((r) => (wake = r));
    wake = undefined;
  };
  worker.postMessage(kind === 'scan' ? { op: 'job', id, kind, job: job as ScanJob } : { op: 'job', id, kind, job: job as ExtractJob });
  let sent = 0;
  let sourceError: unknown;
  let hasSourceError = false;
  try {
    for await (const chunk of chunks) {
      if (settled !== undefined) break; // refused (or failed) early: stop reading
      // Shared memory is shared (never written after a chunk is made); owned buffers are moved; others copied.
      const lent = options.lend?.wants(sent) === true ? ({ lent: true } as const) : {};
      if (chunk.buffer instanceof SharedArrayBuffer) worker.postMessage({ op: 'chunk', id, data: chunk, ...lent });
      else if (options.transfer === true && holdsWholeBuffer(chunk)) worker.postMessage({ op: 'chunk', id, data: chunk, ...lent }, [chunk.buffer as ArrayBuffer]);
      else worker.postMessage({ op: 'chunk', id, data: new Uint8Array(chunk), ...lent });
      sent += 1;
      await waitFor(() => settled !== undefined || sent - consumed < AHEAD);
    }
    if (settled === undefined) worker.postMessage({ op: 'end', id });
  } catch (err) {
    sourceError = err;
    hasSourceError = true;
    if (settled === undefined) worker.postMessage({ op: 'abort', id });
  }
  await waitFor(() => settled !== undefined);
  const outcome = settled!;
  worker.off('message', onMessage);
  worker.off('error', onError);
  worker.off('exit', onExit);
  release(worker, outcome.ok && !hasSourceError);
  // A failure to read the layer is reported as such, not as the worker's "aborted".
  if (hasSourceError) throw sourceError;
  if (!outcome.ok) throw outcome.error;
  return outcome.value;
}

/** The passes of restore.ts on a layer worker thread (restore's default). */
export const WORKER_PASSES: LayerPasses = {
  scan: (chunks, job) => runLayerJob('scan', job, chunks),
  extract: (chunks, job) => runLayerJob('extract', job, chunks),
};

/**
 * The same, transferring the source's buffers (for sources that yield buffers they own), the ones
 * `lend` wants handed back to it once the pass is done with them (JobOptions.lend).
 */
export function workerPassesLending(lend: ChunkLender): LayerPasses {
  return {
    scan: (chunks, job) => runLayerJob('scan', job, chunks, { transfer: true, lend }),
    extract: (chunks, job) => runLayerJob('extract', job, chunks, { transfer: true, lend }),
  };
}
