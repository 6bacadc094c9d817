// Load generator for the turn benchmark (bench/turns/run.ts), run as a child process so the
// runner clients do not share a Node thread with the API server and control plane they measure.
// A real runner is another process (usually another machine); with client and server on one
// thread, half of the measured CPU was the client's own gRPC/TLS work. The echo ceiling is driven
// by this same child, so the comparison stays fair.
//
// Protocol (IPC, one job at a time): the parent sends a `LoadJob`, the child answers a `LoadResult`.
import { ContextState } from '../../src/gen/sandboxfleet/v1/common.ts';
import { RunnerClient } from '../../src/runner-sdk/index.ts';
import { successEvidence } from '../../test/support/evidence.ts';

export interface LoadJob {
  readonly address: string;
  readonly tls: { readonly ca: string; readonly cert: string; readonly key: string };
  /** groups[i] is driven by runner i only. */
  readonly groups: readonly string[];
  readonly concurrency: number;
  readonly seconds: number;
}

export interface Level {
  readonly pairs: number;
  readonly pairsPerS: number;
  /** Latency of a whole pair (begin + complete, or one raw operation). */
  readonly p50Ms: number;
  readonly p99Ms: number;
  /** Latency of each single call (BeginTurn or CompleteTurn) as a runner sees it. */
  readonly callP50Ms: number;
  readonly callP99Ms: number;
}

export type LoadResult = { readonly ok: true; readonly level: Level; readonly contextStates: string[]; /** Pairs done, warmup included (for writes per pair). */ readonly pairsDone: number } | { readonly ok: false; readonly error: string };

const percentile = (sorted: number[], p: number): number => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? Number.NaN;
export const round = (x: number, d = 1): number => Math.round(x * 10 ** d) / 10 ** d;

/** Runs `worker` on `concurrency` loops for the measurement window (after a short warmup). */
export async function measure(concurrency: number, seconds: number, worker: (i: number, call: <T>(p: Promise<T>) => Promise<T>) => Promise<void>): Promise<Level> {
  const untimed = <T>(p: Promise<T>): Promise<T> => p;
  const warmupEnd = Date.now() + 500;
  while (Date.now() < warmupEnd) await Promise.all(Array.from({ length: concurrency }, (_, i) => worker(i, untimed)));
  const latencies: number[] = [];
  const callLatencies: number[] = [];
  const timed = async <T>(p: Promise<T>): Promise<T> => {
    const t0 = performance.now();
    const v = await p;
    callLatencies.push(performance.now() - t0);
    return v;
  };
  const start = performance.now();
  const end = start + seconds * 1000;
  await Promise.all(
    Array.from({ length: concurrency }, async (_, i) => {
      while (performance.now() < end) {
        const t0 = performance.now();
        await worker(i, timed);
        latencies.push(performance.now() - t0);
      }
    }),
  );
  const elapsed = (performance.now() - start) / 1000;
  latencies.sort((a, b) => a - b);
  callLatencies.sort((a, b) => a - b);
  return {
    pairs: latencies.length,
    pairsPerS: round(latencies.length / elapsed),
    p50Ms: round(percentile(latencies, 50), 2),
    p99Ms: round(percentile(latencies, 99), 2),
    callP50Ms: round(percentile(callLatencies, 50), 2),
    callP99Ms: round(percentile(callLatencies, 99), 2),
  };
}

export const evidence = successEvidence();

/** One measurement window: `concurrency` runners doing begin+complete pairs against `address`. */
export async function runLoad(job: LoadJob): Promise<LoadResult> {
  const client = new RunnerClient({ address: job.address, tls: { ca: Buffer.from(job.tls.ca), cert: Buffer.from(job.tls.cert), key: Buffer.from(job.tls.key) }, deadlineMs: 30_000 });
  const states = new Set<string>();
  let pairsDone = 0;
  try {
    const level = await measure(job.concurrency, job.seconds, async (i, call) => {
      const groupId = job.groups[i] ?? '';
      const begun = await call(client.beginTurn({ groupId, memberId: 'claude' }));
      states.add(ContextState[begun.contextState] ?? String(begun.contextState));
      await call(client.completeTurn({ groupId, memberId: 'claude', turnId: begun.turnId, observedLocator: `sess-${i}`, evidence }));
      pairsDone += 1;
    });
    return { ok: true, level, contextStates: [...states], pairsDone };
  } finally {
    client.close();
  }
}

if (process.send !== undefined) {
  process.on('message', (job: LoadJob) => {
    runLoad(job).then(
      (result) => process.send?.(result),
      (error: unknown) => process.send?.({ ok: false, error: String((error as Error)?.stack ?? error) } satisfies LoadResult),
    );
  });
  process.on('disconnect', () => process.exit(0));
}
