// What every bench/<name>/run.ts shares: the `--smoke` and `--out` flags, the load average at the
// start and end of the run, and where the result goes. A full run writes bench/results/<file>; a
// smoke run (tiny sizes, seconds; run by `npm test` through bench/smoke.ts so a broken benchmark
// fails CI) writes to `--out` or a fresh temp dir, never over the committed results.
import { mkdir, mkdtemp, writeFile } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** parseArgs options every bench accepts (spread into its own). */
export const BENCH_OPTIONS = {
  smoke: { type: 'boolean', default: false },
  out: { type: 'string' },
} as const;

/** The committed results directory. */
export const RESULTS_DIR = fileURLToPath(new URL('./results/', import.meta.url));

export interface BenchRun {
  readonly name: string;
  readonly smoke: boolean;
  /** Where the result file goes; undefined = bench/results for a full run, a temp dir for a smoke run. */
  readonly out: string | undefined;
  /** os.loadavg() when the bench started (1, 5, 15 min). */
  readonly loadAverageStart: readonly number[];
}

/** Call first thing in a bench's main(): records the start load average. */
export function startBench(name: string, values: { readonly smoke?: boolean | undefined; readonly out?: string | undefined }): BenchRun {
  return { name, smoke: values.smoke === true, out: values.out, loadAverageStart: loadavg() };
}

/**
 * Writes `result` as JSON to `<dir>/<file>` (default `<name>.json`) with the run's common fields
 * in front: benchmark name, smoke flag, load average at start and now (the end). Returns the path.
 */
export async function writeResult(run: BenchRun, result: Record<string, unknown>, file = `${run.name}.json`): Promise<string> {
  const dir = run.out ?? (run.smoke ? await mkdtemp(join(tmpdir(), `sf-bench-smoke-${run.name}-`)) : RESULTS_DIR);
  await mkdir(dir, { recursive: true });
  const path = join(dir, file);
  const out = { benchmark: run.name, smoke: run.smoke, load_average_start: run.loadAverageStart, load_average_end: loadavg(), ...result };
  await writeFile(path, `${JSON.stringify(out, null, 2)}\n`);
  console.log(`result: ${path}`);
  return path;
}
