// Every benchmark in bench/smoke.ts runs in its smoke mode (tiny sizes, seconds) exactly as
// `npm run bench` runs it: `node --import tsx bench/<name>/run.ts`, a separate process starting its
// own real nats-server and dockerd hosts. So a change that breaks a benchmark fails `npm test`
// instead of rotting until someone re-measures. The result must be well formed (common fields of
// bench/common.ts, every named figure a finite number), land in the temp dir given by --out, and
// leave the committed bench/results/<name>.json untouched. A bench/<name>/run.ts that is not
// registered fails too: no benchmark escapes its smoke run.
import { spawn } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { SMOKE_BENCHES, type SmokeBench } from '../../../bench/smoke.ts';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));

/** Runs one bench's smoke mode; resolves with its exit code and the tail of its output. */
function runSmoke(bench: SmokeBench, out: string): Promise<{ code: number | null; signal: NodeJS.Signals | null; tail: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', join('bench', bench.name, 'run.ts'), '--smoke', '--out', out, ...(bench.args ?? [])], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  const keep = (b: Buffer): void => {
    output = (output + b.toString()).slice(-8_000);
  };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  // The bench's own bound; its leftover dockerds are reaped by the next test/support start.
  const timer = setTimeout(() => child.kill('SIGKILL'), bench.timeoutS * 1000);
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, tail: output });
    });
  });
}

const readIfThere = (path: string): Promise<Buffer | undefined> => readFile(path).catch(() => undefined);

describe('benchmarks in smoke mode (bench/smoke.ts)', () => {
  it('every bench/<name>/run.ts has a smoke mode registered in bench/smoke.ts', async () => {
    const dirs = await readdir(join(ROOT, 'bench'), { withFileTypes: true });
    const benches: string[] = [];
    for (const d of dirs) {
      if (d.isDirectory() && (await readIfThere(join(ROOT, 'bench', d.name, 'run.ts'))) !== undefined) benches.push(d.name);
    }
    expect(benches.length).toBeGreaterThan(0);
    expect(benches.filter((name) => !SMOKE_BENCHES.some((b) => b.name === name)), 'add one line per benchmark to bench/smoke.ts (bench/README.md)').toEqual([]);
  });

  for (const bench of SMOKE_BENCHES) {
    it(`bench/${bench.name} --smoke runs on real services and writes a well-formed result to --out, not over bench/results`, async () => {
      const committedPath = join(ROOT, 'bench', 'results', `${bench.name}.json`);
      const committedBefore = await readIfThere(committedPath);
      const out = await mkdtemp(join(tmpdir(), `sf-smoke-${bench.name}-`));
      try {
        const started = Date.now();
        const run = await runSmoke(bench, out);
        expect(run, `bench/${bench.name} --smoke failed; output tail:\n${run.tail}`).toMatchObject({ code: 0, signal: null });
        console.log(`bench/${bench.name} --smoke: ${((Date.now() - started) / 1000).toFixed(1)} s`);

        const result = JSON.parse(await readFile(join(out, `${bench.name}.json`), 'utf8')) as Record<string, unknown>;
        expect(result.benchmark).toBe(bench.name);
        expect(result.smoke).toBe(true);
        for (const key of ['load_average_start', 'load_average_end']) {
          const load = result[key];
          expect(Array.isArray(load) && load.length === 3 && load.every((x) => Number.isFinite(x) && x >= 0), `${key}: ${JSON.stringify(load)}`).toBe(true);
        }
        const notFinite = bench.figures.filter((f) => typeof result[f] !== 'number' || !Number.isFinite(result[f]));
        expect(notFinite, `figures missing or not finite numbers: ${notFinite.map((f) => `${f}=${JSON.stringify(result[f])}`).join(', ')}`).toEqual([]);

        expect(await readIfThere(committedPath), `bench/results/${bench.name}.json was changed by a smoke run`).toEqual(committedBefore);
      } finally {
        await rm(out, { recursive: true, force: true });
      }
    }, (bench.timeoutS + 30) * 1000);
  }
});
