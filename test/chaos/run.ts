// `npm run chaos`: the seeded chaos suite on this machine (test/chaos/chaos.ts): a 3-node NATS
// cluster, 3 dockerd hosts with the host-agent binary, two control-plane replicas; K schedules, each
// a live workload under 1-3 seeded faults, checked against its history. Prints each seed; `--seed N`
// replays one schedule. Figures go to bench/results/chaos.json (rewritten after every schedule, so
// an interrupted run keeps what it measured). Exit code 1 when any invariant was violated.
//   npm run chaos -- [--schedules 5] [--first-seed S] [--seed N] [--duration-ms 20000]
//                    [--kinds nats_kill,agent_freeze,...] [--out bench/results/chaos.json]
import { randomInt } from 'node:crypto';
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { parseArgs } from 'node:util';
import { startClusterFleet } from './cluster-fleet.ts';
import { FAULT_KINDS, figures, planSchedule, readyFleet, runSchedule, type FaultKind, type ScheduleResult } from './chaos.ts';

const { values } = parseArgs({
  options: {
    schedules: { type: 'string', default: '5' },
    'first-seed': { type: 'string' },
    seed: { type: 'string' },
    'duration-ms': { type: 'string', default: '20000' },
    kinds: { type: 'string', default: FAULT_KINDS.join(',') },
    out: { type: 'string', default: 'bench/results/chaos.json' },
  },
});

const int = (name: string, v: string | undefined, min: number, max: number): number => {
  const n = Number(v);
  if (!Number.isInteger(n) || n < min || n > max) throw new Error(`--${name} must be an integer in ${min}..${max}, got ${v}`);
  return n;
};
const kinds = values.kinds.split(',').map((k) => k.trim());
for (const k of kinds) if (!(FAULT_KINDS as readonly string[]).includes(k)) throw new Error(`unknown fault kind ${k} (known: ${FAULT_KINDS.join(', ')})`);
const durationMs = int('duration-ms', values['duration-ms'], 5_000, 600_000);
const seeds = values.seed !== undefined
  ? [int('seed', values.seed, 0, 2 ** 31 - 1)]
  : (() => {
      const first = values['first-seed'] !== undefined ? int('first-seed', values['first-seed'], 0, 2 ** 31 - 1) : randomInt(1, 1_000_000);
      return Array.from({ length: int('schedules', values.schedules, 1, 100_000) }, (_, i) => first + i);
    })();

console.log(`chaos: ${seeds.length} schedule(s), seeds ${seeds[0]}..${seeds[seeds.length - 1]}, ${durationMs} ms of workload each, faults ${kinds.join(',')}`);
const fleet = await startClusterFleet(3);
let stopping = false;
const stop = async (): Promise<void> => {
  if (stopping) return;
  stopping = true;
  await fleet.cleanup().catch((err: unknown) => console.error(`cleanup: ${String(err)}`));
};
process.once('SIGINT', () => void stop().then(() => process.exit(130)));
process.once('SIGTERM', () => void stop().then(() => process.exit(143)));

const results: ScheduleResult[] = [];
try {
  await readyFleet(fleet);
  for (const seed of seeds) {
    if (stopping) break;
    const plan = planSchedule(seed, durationMs, kinds as FaultKind[]);
    console.log(`seed ${seed}: ${plan.faults.map((f) => `${f.kind}@${f.atMs}ms`).join(', ')}`);
    const r = await runSchedule(fleet, plan, (s) => console.log(s));
    results.push(r);
    const verdict = r.violations.length === 0 ? 'ok' : `VIOLATIONS ${r.violations.length}`;
    console.log(`seed ${seed}: ${verdict}; ${r.ackedOperations} acknowledged ops, ${r.groups} groups (${r.lost} LOST with a reason), ${r.fencedReports} fenced reports, recovery ${r.faults.map((f) => `${f.kind}=${f.recoveryS}s`).join(' ')}, ${r.wallS.toFixed(0)} s`);
    for (const v of r.violations) console.log(`  ${v}   (replay: npm run chaos -- --seed ${seed})`);
    await mkdir(dirname(values.out), { recursive: true });
    await writeFile(values.out, `${JSON.stringify({ command: `npm run chaos -- ${process.argv.slice(2).join(' ')}`.trim(), duration_ms: durationMs, ...figures(results) }, null, 2)}\n`);
  }
} finally {
  await stop();
}
const f = figures(results);
console.log(`chaos: ${f.schedules} schedules, ${f.acked_operations} acknowledged ops, faults ${JSON.stringify(f.faults_by_kind)}, violations ${f.violations}, acked writes lost ${f.acked_writes_lost}, double running ${f.double_running}, silent losses ${f.silent_losses}, fenced reports ${f.fenced_reports}; figures in ${values.out}`);
process.exit(f.violations === 0 ? 0 : 1);
