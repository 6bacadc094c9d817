// Scale benchmark (issue 12): one control-plane replica against a fleet of 1,000 simulated hosts and
// 10,000 / 100,000 group records, on the real nats-server with fsync as shipped (`sync_interval:
// always`, test/support/nats.ts). Per fleet size, on a fresh server:
//   - the control plane runs as a child process (bench/scale/control-plane.ts), so its CPU is that
//     process's CPU (/proc), and its heap its own;
//   - a load-generator child (bench/scale/load.ts) registers 1,000 hosts over NATS like agents do,
//     then heartbeats each at the shipped interval (2 s) with a real agent's inventory (one exited
//     container with its layer per group the host holds);
//   - the group records (STOPPED clean, one member with turn history) and one checkpoint index
//     record per group are written directly into their buckets, spread over the hosts;
//   1. steady CPU: control-plane CPU per wall second over a window (heartbeats, liveness, periodic
//      GC and refresh passes included), and the nats-server's and load generator's beside it;
//   2. heartbeat cost: a window at four times the heartbeat rate (the marginal CPU per heartbeat), and
//      one with empty inventories (what the inventories cost);
//   3. dead host: one host's heartbeats stop; from its `host_declared_dead` event to the last of its
//      groups' decisions (each becomes LOST `unclean_stop`: STOPPED uncleanly, without a checkpoint),
//      both event times from the control plane's clock;
//   4. restart: the replica stops (resigning leadership) and a new process starts; catch-up = its
//      ControlPlane.start(), which resolves once the read model holds every record of the store
//      (FleetState.start() → sync()); read-model memory = its heap after minus before (full GCs).
//      `--restarts N` times (3; 1 in smoke): the figures are the medians, every sample recorded.
// With `--baseline-root DIR` (a worktree of the commit before the read model, node_modules
// symlinked) the same scenarios run on that code first; what it lacks (a read model) is reported as
// such, and the sizes it runs at are `--baseline-groups`.
// Writes bench/results/scale.json (--smoke: 10 hosts, 100 / 1,000 groups, short windows and short
// liveness settings, to --out or a temp dir; see bench/common.ts).
//
//   node --import tsx bench/scale/run.ts [--groups 10000,100000] [--hosts 1000] [--window-s 60]
//     [--baseline-root /tmp/scale-base] [--baseline-groups 10000] [--restarts 3] [--cpu-prof-dir DIR] [--migration-parallelism N] [--smoke] [--out DIR]
// --cpu-prof-dir: V8 CPU profiles of the control plane's start() and of each measured window (the
// profiler's own cost is then in the CPU figures: use it to find causes, not for the figures).
// --migration-parallelism: an experiment off the shipped default (recorded as `overrides`).
// SF_TRACE_GC=1: the control plane runs with --trace-gc (its log, in the logs dir, then shows every
// collection: how much of its CPU is garbage collection). SF_PERF=1: it runs with --perf-basic-prof,
// so `perf record -g -p <its pid>` names its JS frames (native time included, which the V8 profile
// of --cpu-prof-dir does not show: ~4% of a core there against ~7% from /proc at 10,000 groups).
import { fork, type ChildProcess } from 'node:child_process';
import { execFileSync } from 'node:child_process';
import { openSync } from 'node:fs';
import { mkdir, mkdtemp, readFile } from 'node:fs/promises';
import { cpus, loadavg, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { startTestNats } from '../../test/support/nats.ts';
import { BENCH_OPTIONS, startBench, writeResult } from '../common.ts';
import type { ChildMessage, ControlPlaneJob } from './control-plane.ts';
import { checkpointRecord, groupId, groupRecord, hostId, hostOfGroup, shippedLiveness, victimHosts, type LivenessSettings } from './fleet.ts';
import type { LoadJob, LoadMessage } from './load.ts';
import { loadProduct, THIS_ROOT, type Product } from './product.ts';

const { values } = parseArgs({ options: {
  groups: { type: 'string' }, hosts: { type: 'string' }, 'window-s': { type: 'string' }, 'settle-s': { type: 'string' },
  root: { type: 'string' }, 'baseline-root': { type: 'string' }, 'baseline-groups': { type: 'string' },
  'cpu-prof-dir': { type: 'string' }, 'log-level': { type: 'string' }, 'migration-parallelism': { type: 'string' }, restarts: { type: 'string' }, ...BENCH_OPTIONS,
} });
const run = startBench('scale', values);
const sized = (flag: string | undefined, full: number, smoke: number): number => Number(flag ?? (run.smoke ? smoke : full));
const list = (flag: string | undefined, full: string, smoke: string): number[] => (flag ?? (run.smoke ? smoke : full)).split(',').map(Number);
const SIZES = list(values.groups, '10000,100000', '100,1000');
const HOSTS = sized(values.hosts, 1_000, 10);
const WINDOW_S = sized(values['window-s'], 60, 4);
const SETTLE_S = sized(values['settle-s'], 10, 1);
/** Replica restarts per scenario; catch-up is their median. */
const RESTARTS = sized(values.restarts, 3, 1);
const BASELINE_SIZES = list(values['baseline-groups'], '10000', '100');
const LOG_LEVEL = values['log-level'] ?? 'warn';
/** Settings other than the shipped ones, for experiments (the result says which). */
const OVERRIDES: Record<string, unknown> = values['migration-parallelism'] !== undefined ? { migrationParallelism: Number(values['migration-parallelism']) } : {};

const sleep = (ms: number) => new Promise((r) => setTimeout(r, Math.max(0, ms)));
const round = (x: number, d = 3): number => Math.round(x * 10 ** d) / 10 ** d;
const mean = (xs: readonly number[]): number => xs.reduce((a, b) => a + b, 0) / xs.length;
/** The median (upper middle) of samples; null when any sample is missing or there are none. */
const median = (xs: readonly (number | null)[]): number | null => {
  if (xs.some((x) => x === null)) return null;
  const sorted = [...(xs as number[])].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)] ?? null;
};
const MiB = 1024 * 1024;

/** CPU milliseconds of a process from /proc (clock ticks of 10 ms): user and system. */
async function procCpu(pid: number): Promise<{ user: number; system: number }> {
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return { user: Number(fields[11]) * 10, system: Number(fields[12]) * 10 };
}

/** CPU milliseconds (user + system) of a process. */
async function procCpuMs(pid: number): Promise<number> {
  const c = await procCpu(pid);
  return c.user + c.system;
}

async function waitFor<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs: number, everyMs = 100): Promise<T | undefined> {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    const v = await probe();
    if (v !== undefined) return v;
    await sleep(everyMs);
  }
  console.log(`  (gave up waiting for ${what} after ${timeoutMs / 1000} s)`);
  return undefined;
}

// ---- child processes ------------------------------------------------------------------------

/** A child speaking JSON over IPC: `next(type)` resolves with the next message of that type. */
class Child<M extends { type: string }> {
  readonly proc: ChildProcess;
  readonly exited: Promise<number | null>;
  readonly #waiting = new Map<string, ((m: M) => void)[]>();
  #failure: string | undefined;

  constructor(script: string, job: unknown, logFd: number, execArgv: string[]) {
    this.proc = fork(fileURLToPath(new URL(script, import.meta.url)), [JSON.stringify(job)], { execArgv: ['--import', 'tsx', ...execArgv], stdio: ['ignore', logFd, logFd, 'ipc'] });
    this.exited = new Promise((resolve) => this.proc.once('exit', (code) => resolve(code)));
    this.proc.on('message', (m: M) => {
      if (m.type === 'error') this.#failure = (m as unknown as { message: string }).message;
      const w = this.#waiting.get(m.type)?.shift();
      w?.(m);
    });
  }

  get pid(): number {
    return this.proc.pid!;
  }

  next<T extends M['type']>(type: T, timeoutMs: number): Promise<Extract<M, { type: T }>> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no '${type}' from ${this.proc.spawnargs[2] ?? 'child'} within ${timeoutMs / 1000} s${this.#failure ? `: ${this.#failure}` : ''}`)), timeoutMs);
      const list = this.#waiting.get(type) ?? [];
      list.push((m) => {
        clearTimeout(timer);
        resolve(m as Extract<M, { type: T }>);
      });
      this.#waiting.set(type, list);
      void this.exited.then((code) => {
        clearTimeout(timer);
        reject(new Error(`child exited (${code}) before '${type}'${this.#failure ? `: ${this.#failure}` : ''}`));
      });
    });
  }

  send(m: object): void {
    this.proc.send(m);
  }
}

/** Ask a control-plane child to stop; SIGKILL it after 60 s. True when it stopped by itself. */
async function stopChild(child: Child<ChildMessage>): Promise<boolean> {
  child.send({ type: 'stop' });
  const timeout = sleep(60_000).then(() => false);
  const stopped = await Promise.race([child.exited.then(() => true), timeout]);
  if (!stopped) {
    child.proc.kill('SIGKILL');
    await child.exited;
  }
  return stopped;
}

// ---- one scenario: one code tree at one fleet size --------------------------------------------

interface CpuWindow {
  readonly wall_s: number;
  readonly heartbeats_per_s: number;
  readonly heartbeat_kib_per_s: number;
  readonly cp_cpu_fraction: number;
  /** The kernel's part of it (socket reads and writes, mostly). */
  readonly cp_system_cpu_fraction: number;
  /** The median of the window's one-second control-plane CPU fractions: the rate between periodic passes. */
  readonly cp_cpu_fraction_median_second: number;
  /** The busiest second (a GC/refresh pass runs every 30 reconcile passes). */
  readonly cp_cpu_fraction_max_second: number;
  /** Mean of the quietest 75% of the seconds: the steady rate without the periodic passes, finer than the median. */
  readonly cp_cpu_fraction_trimmed: number;
  readonly nats_server_cpu_fraction: number;
  readonly load_generator_cpu_fraction: number;
  readonly load_average: readonly number[];
}

/** One host silenced until DEAD, then until each of its groups is decided. */
interface DeadRound {
  readonly victim: string;
  readonly victim_state: string;
  readonly victim_events: readonly string[];
  readonly group_states: Record<string, number>;
  readonly groups_on_victim: number;
  readonly silence_to_dead_s: number | null;
  readonly decided: number;
  readonly decisions: Record<string, number>;
  readonly dead_to_first_mark_s: number | null;
  readonly dead_to_decisions_s: number | null;
  readonly decision_p50_s: number | null;
  readonly cp_cpu_ms: number | null;
  readonly cp_cpu_fraction: number | null;
}

interface ScenarioResult {
  readonly code: string;
  readonly groups: number;
  readonly hosts: number;
  readonly register_s: number;
  readonly plant_s: number;
  readonly records_planted: number;
  readonly first_sync: { readonly ms: number; readonly groups: number; readonly checkpoints: number } | null;
  readonly steady: CpuWindow;
  readonly fast_rate: CpuWindow;
  readonly empty_inventory: CpuWindow;
  /** Control-plane CPU ms per heartbeat: the extra CPU of the 4x-rate window over the extra heartbeats (trimmed means). */
  readonly cpu_ms_per_heartbeat: number;
  /** Upper bound: ALL steady control-plane CPU divided by the heartbeats of that window. */
  readonly cpu_ms_per_heartbeat_all_steady: number;
  /** Share of the steady CPU that the inventories in heartbeats cost (full vs empty inventories, trimmed means). */
  readonly inventory_cpu_fraction: number;
  readonly host_states_after_windows: Record<string, number>;
  readonly dead: {
    readonly rounds: number;
    readonly dead_to_decisions_s: number | null;
    readonly dead_to_decisions_max_s: number | null;
    readonly per_round: readonly DeadRound[];
  };
  readonly restart: {
    readonly stop_s: number;
    readonly stopped_gracefully: boolean;
    readonly read_model: boolean;
    /** The median of `catchup_samples_s`. */
    readonly catchup_s: number | null;
    readonly catchup_samples_s: readonly (number | null)[];
    readonly read_model_groups: number;
    readonly read_model_checkpoints: number;
    readonly heap_delta_mib: number | null;
    readonly heap_after_mib: number;
  };
}

async function scenario(p: Product, code: string, groups: number, liveness: LivenessSettings, logDir: string): Promise<ScenarioResult> {
  const label = `${code}-${groups}`;
  console.log(`== ${label}: ${groups} groups on ${HOSTS} hosts (${p.root})`);
  const nats = await startTestNats();
  const children: { readonly proc: ChildProcess }[] = [];
  const logFd = openSync(join(logDir, `${label}.log`), 'a');
  const profileDir = values['cpu-prof-dir'] !== undefined ? join(values['cpu-prof-dir'], label) : undefined;
  if (profileDir !== undefined) await mkdir(profileDir, { recursive: true });
  const startPlane = async (replicaId: string) => {
    const job: ControlPlaneJob = { root: p.root, natsUrl: nats.server.url, replicaId, liveness, logLevel: LOG_LEVEL, overrides: OVERRIDES, profileDir };
    const child = new Child<ChildMessage>('./control-plane.ts', job, logFd, ['--expose-gc', ...(process.env.SF_TRACE_GC ? ['--trace-gc'] : []), ...(process.env.SF_PERF ? ['--perf-basic-prof'] : [])]);
    children.push(child);
    return { child, ready: await child.next('ready', 600_000) };
  };
  try {
    const natsPid = nats.server.pid!;
    const nc = await nats.connect('bench-scale');
    const store = await p.connection.StateStore.open(nc, { buckets: p.buckets.CONTROL_PLANE_BUCKETS });
    const groupsRepo = store.shardedRepository('groups', p.records.GroupRecordSchema);
    const checkpoints = store.repository('checkpoints', p.records.CheckpointRecordSchema);
    const hostsRepo = store.repository('hosts', p.records.HostRecordSchema);
    const { Keys } = p.state;

    let plane = await startPlane('cp-1');
    const loadJob: LoadJob = { root: p.root, natsUrl: nats.server.url, hosts: HOSTS, groups, intervalMs: liveness.heartbeatIntervalMs };
    const load = new Child<LoadMessage>('./load.ts', loadJob, logFd, []);
    children.push(load);
    const registered = await load.next('registered', 900_000);
    console.log(`  ${registered.admitted} hosts registered in ${registered.seconds.toFixed(1)} s, heartbeating every ${liveness.heartbeatIntervalMs} ms`);

    // The records, written directly (256 in flight), after the hosts exist.
    const now = Date.now();
    const p0 = performance.now();
    let planted = 0;
    let nextIndex = 0;
    await Promise.all(Array.from({ length: 256 }, async () => {
      for (let i = nextIndex++; i < groups; i = nextIndex++) {
        const g = groupRecord(i, HOSTS, now);
        await groupsRepo.create(Keys.group(g.groupId), g);
        const c = checkpointRecord(i, HOSTS, now);
        if (c !== undefined) await checkpoints.create(Keys.checkpoint(c.groupId, c.checkpointId), c);
        planted += c === undefined ? 1 : 2;
      }
    }));
    const plantS = (performance.now() - p0) / 1000;
    console.log(`  ${planted} records planted in ${plantS.toFixed(1)} s`);
    plane.child.send({ type: 'sync' });
    const synced = await plane.child.next('synced', 600_000);
    const firstSync = plane.ready.readModel ? { ms: round(synced.ms, 1), groups: synced.groups, checkpoints: synced.checkpoints } : null;
    if (firstSync !== null && synced.groups !== groups) throw new Error(`read model holds ${synced.groups} groups, planted ${groups}`);
    await waitFor('leadership', async () => {
      plane.child.send({ type: 'leader' });
      return (await plane.child.next('leader', 60_000)).leader ? true : undefined;
    }, 60_000, 500);
    await sleep(SETTLE_S * 1000);

    const measure = async (seconds: number, name: string): Promise<CpuWindow> => {
      plane.child.send({ type: 'profile-start' });
      load.send({ type: 'stats' });
      const s0 = await load.next('stats', 10_000);
      const [cp0, n0, l0, sys0] = await Promise.all([procCpuMs(plane.child.pid), procCpuMs(natsPid), procCpuMs(load.pid), procCpu(plane.child.pid)]);
      const t0 = performance.now();
      // One-second samples as well: the mean hides whether the cost is steady or periodic.
      const perSecond: number[] = [];
      let [lastCpu, lastT] = [cp0, t0];
      for (let i = 0; i < Math.floor(seconds); i++) {
        await sleep(t0 + (i + 1) * 1000 - performance.now());
        const [c, t] = [await procCpuMs(plane.child.pid), performance.now()];
        perSecond.push((c - lastCpu) / (t - lastT));
        [lastCpu, lastT] = [c, t];
      }
      await sleep(t0 + seconds * 1000 - performance.now());
      const [cp1, n1, l1, sys1] = await Promise.all([procCpuMs(plane.child.pid), procCpuMs(natsPid), procCpuMs(load.pid), procCpu(plane.child.pid)]);
      const wallMs = performance.now() - t0;
      const sorted = [...perSecond].sort((a, b) => a - b);
      if (profileDir !== undefined) {
        plane.child.send({ type: 'profile-stop', name });
        console.log(`  profile: ${(await plane.child.next('profiled', 60_000)).path}`);
      }
      load.send({ type: 'stats' });
      const s1 = await load.next('stats', 10_000);
      return {
        wall_s: round(wallMs / 1000, 2),
        heartbeats_per_s: round((s1.sent - s0.sent) / (wallMs / 1000), 1),
        heartbeat_kib_per_s: round((s1.bytes - s0.bytes) / 1024 / (wallMs / 1000), 1),
        cp_cpu_fraction: round((cp1 - cp0) / wallMs, 4),
        cp_system_cpu_fraction: round((sys1.system - sys0.system) / wallMs, 4),
        cp_cpu_fraction_median_second: round(sorted[Math.floor(sorted.length / 2)] ?? Number.NaN, 4),
        cp_cpu_fraction_max_second: round(sorted.at(-1) ?? Number.NaN, 4),
        cp_cpu_fraction_trimmed: round(mean(sorted.slice(0, Math.max(1, Math.ceil(sorted.length * 0.75)))), 4),
        nats_server_cpu_fraction: round((n1 - n0) / wallMs, 4),
        load_generator_cpu_fraction: round((l1 - l0) / wallMs, 4),
        load_average: loadavg().map((x) => round(x, 2)),
      };
    };
    const switchTo = async (cmd: object): Promise<void> => {
      load.send(cmd);
      await sleep(2 * liveness.heartbeatIntervalMs);
    };
    const steady = await measure(WINDOW_S, 'steady');
    console.log(`  steady: control plane ${(100 * steady.cp_cpu_fraction).toFixed(2)}% of a core (median second ${(100 * steady.cp_cpu_fraction_median_second).toFixed(1)}%, busiest ${(100 * steady.cp_cpu_fraction_max_second).toFixed(1)}%), nats-server ${(100 * steady.nats_server_cpu_fraction).toFixed(2)}%, ${steady.heartbeats_per_s} heartbeats/s`);
    await switchTo({ type: 'interval', ms: liveness.heartbeatIntervalMs / 4 });
    const fastRate = await measure(Math.max(2, WINDOW_S / 2), 'fast-rate');
    await switchTo({ type: 'interval', ms: liveness.heartbeatIntervalMs });
    await switchTo({ type: 'inventory', full: false });
    const emptyInventory = await measure(Math.max(2, WINDOW_S / 2), 'empty-inventory');
    await switchTo({ type: 'inventory', full: true });
    // Trimmed means: whether a 30-s GC/refresh pass falls into a window must not decide this figure.
    const cpuMsPerHb = ((fastRate.cp_cpu_fraction_trimmed - steady.cp_cpu_fraction_trimmed) * 1000) / (fastRate.heartbeats_per_s - steady.heartbeats_per_s);
    console.log(`  heartbeat: ${cpuMsPerHb.toFixed(4)} ms CPU each (marginal); empty inventories: ${(100 * emptyInventory.cp_cpu_fraction).toFixed(2)}%`);

    /** `victim` goes silent: until DEAD, then until each of its groups is decided. */
    const deadRound = async (victim: number): Promise<DeadRound> => {
      const victimId = hostId(victim);
      const victimGroups = Array.from({ length: groups }, (_, i) => i).filter((i) => hostOfGroup(i, HOSTS) === victim).map(groupId);
      if (profileDir !== undefined) plane.child.send({ type: 'profile-start' });
      // The control plane's CPU every 50 ms through this phase, to tell CPU-bound from waiting.
      const cpuSamples: [number, number][] = [];
      let sampling = true;
      const sampler = (async () => {
        while (sampling) {
          cpuSamples.push([Date.now(), await procCpuMs(plane.child.pid)]);
          await sleep(50);
        }
      })();
      const silencedAt = Date.now();
      load.send({ type: 'silence', host: victim });
      const deadTimeoutMs = liveness.heartbeatTtlMs + liveness.deadGraceMs + 60_000;
      await waitFor(`${victimId} DEAD`, async () => ((await hostsRepo.get(Keys.host(victimId)))?.value.lifecycle.state === 'DEAD' ? true : undefined), deadTimeoutMs, 100);
      const terminal = (s: string | undefined) => s === 'LOST' || s === 'DESTROYED';
      await waitFor(`decisions on ${victimGroups.length} groups`, async () => {
        const gs = await Promise.all(victimGroups.map((id) => groupsRepo.get(Keys.group(id))));
        return gs.every((g) => terminal(g?.value.lifecycle.state)) ? true : undefined;
      }, code === 'baseline' ? 180_000 : 60_000, 250);
      sampling = false;
      await sampler;
      if (profileDir !== undefined) {
        plane.child.send({ type: 'profile-stop', name: `dead-${victimId}` });
        console.log(`  profile: ${(await plane.child.next('profiled', 60_000)).path}`);
      }
      /** The control plane's CPU ms at time `t`, interpolated between samples. */
      const cpuAt = (t: number): number => {
        const i = cpuSamples.findIndex(([at]) => at >= t);
        if (i <= 0) return (i === 0 ? cpuSamples[0]! : cpuSamples.at(-1)!)[1];
        const [[t0, c0], [t1, c1]] = [cpuSamples[i - 1]!, cpuSamples[i]!];
        return c0 + ((c1 - c0) * (t - t0)) / Math.max(1, t1 - t0);
      };
      const hostEvents = (await store.events.read({ subjectKind: 'host', subjectId: victimId, limit: 1000 })).events.map((e) => e.event).filter((e) => e.timeMs >= silencedAt);
      const deadAt = hostEvents.find((e) => e.type === 'host_declared_dead')?.timeMs;
      const decisionTimes: number[] = [];
      const markTimes: number[] = [];
      const decisions: Record<string, number> = {};
      for (const id of victimGroups) {
        const evs = (await store.events.read({ subjectKind: 'group', subjectId: id, limit: 100 })).events.map((e) => e.event).filter((e) => e.timeMs >= silencedAt);
        const mark = evs.find((e) => e.type === 'evacuation_started');
        if (mark) markTimes.push(mark.timeMs);
        const decided = evs.find((e) => e.toState === 'LOST' || e.type === 'group_migration_started');
        if (decided) {
          decisionTimes.push(decided.timeMs);
          const why = `${decided.toState ?? decided.type}${decided.reason ? ` ${decided.reason}` : ''}`;
          decisions[why] = (decisions[why] ?? 0) + 1;
        }
      }
      decisionTimes.sort((a, b) => a - b);
      const allDecided = deadAt !== undefined && decisionTimes.length === victimGroups.length;
      // What the victim's groups and host look like at the end (says why, when decisions are missing).
      const finalStates: Record<string, number> = {};
      for (const g of await Promise.all(victimGroups.map((id) => groupsRepo.get(Keys.group(id))))) {
        const k = `${g?.value.lifecycle.state ?? 'absent'}${g?.value.evacuation ? ` evacuation:${g.value.evacuation.kind}` : ''}`;
        finalStates[k] = (finalStates[k] ?? 0) + 1;
      }
      return {
        victim: victimId,
        victim_state: (await hostsRepo.get(Keys.host(victimId)))?.value.lifecycle.state ?? 'absent',
        victim_events: hostEvents.map((e) => e.type),
        group_states: finalStates,
        groups_on_victim: victimGroups.length,
        silence_to_dead_s: deadAt !== undefined ? round((deadAt - silencedAt) / 1000) : null,
        decided: decisionTimes.length,
        decisions,
        dead_to_first_mark_s: deadAt !== undefined && markTimes.length > 0 ? round((Math.min(...markTimes) - deadAt) / 1000) : null,
        dead_to_decisions_s: allDecided ? round((decisionTimes.at(-1)! - deadAt) / 1000) : null,
        decision_p50_s: allDecided ? round((decisionTimes[Math.floor(decisionTimes.length / 2)]! - deadAt) / 1000) : null,
        // Control-plane CPU from DEAD to the last decision, and as a fraction of that time (near 1: CPU-bound).
        cp_cpu_ms: allDecided ? round(cpuAt(decisionTimes.at(-1)!) - cpuAt(deadAt), 0) : null,
        cp_cpu_fraction: allDecided ? round((cpuAt(decisionTimes.at(-1)!) - cpuAt(deadAt)) / Math.max(1, decisionTimes.at(-1)! - deadAt), 3) : null,
      };
    };

    // What the hosts look like after the windows: a control plane that fell behind on heartbeats
    // has declared hosts SUSPECT or DEAD that never stopped beating.
    const hostStates: Record<string, number> = {};
    for (const e of (await hostsRepo.list()).entries) hostStates[e.value.lifecycle.state] = (hostStates[e.value.lifecycle.state] ?? 0) + 1;
    console.log(`  host states after the windows: ${JSON.stringify(hostStates)}`);

    // ---- hosts go silent one after another: DEAD, then a decision for each of their groups ----
    const deadRounds: DeadRound[] = [];
    for (const victim of victimHosts(HOSTS).slice(0, code === 'baseline' || run.smoke ? 1 : 3)) {
      const result = await deadRound(victim);
      console.log(`  dead: ${JSON.stringify(result)}`);
      deadRounds.push(result);
    }
    const complete = deadRounds.map((r) => r.dead_to_decisions_s).filter((x): x is number => x !== null).sort((a, b) => a - b);
    const dead = {
      rounds: deadRounds.length,
      // The median round (every round must have decided every group, else null).
      dead_to_decisions_s: median(deadRounds.map((r) => r.dead_to_decisions_s)),
      dead_to_decisions_max_s: complete.length === deadRounds.length ? complete.at(-1)! : null,
      per_round: deadRounds,
    };

    // ---- restart: a new replica process catches up, RESTARTS times (the median is the figure: one
    // start on this machine has measured anywhere from 6 to 15 s across runs) ----
    const samples: { readonly stop_s: number; readonly stopped_gracefully: boolean; readonly catchup_s: number | null; readonly heap_delta_mib: number | null }[] = [];
    let r = plane.ready;
    for (let i = 0; i < RESTARTS; i++) {
      const stop0 = performance.now();
      const stoppedInTime = await stopChild(plane.child);
      const stopS = round((performance.now() - stop0) / 1000, 1);
      plane = await startPlane(`cp-${i + 2}`);
      r = plane.ready;
      if (r.readModel && r.groups !== groups) throw new Error(`restarted read model holds ${r.groups} groups, expected ${groups}`);
      samples.push({
        // How long the stopped replica took to stop (resign, finish its pass and heartbeat backlog); killed after 60 s.
        stop_s: stopS,
        stopped_gracefully: stoppedInTime,
        catchup_s: r.readModel ? round(r.startMs / 1000) : null,
        heap_delta_mib: r.readModel ? round((r.heapAfterBytes - r.heapBeforeBytes) / MiB, 1) : null,
      });
      console.log(`  restart ${i + 1}/${RESTARTS}: ${JSON.stringify(samples.at(-1))}`);
    }
    const restart = {
      stop_s: Math.max(...samples.map((x) => x.stop_s)),
      stopped_gracefully: samples.every((x) => x.stopped_gracefully),
      read_model: r.readModel,
      catchup_s: median(samples.map((x) => x.catchup_s)),
      catchup_samples_s: samples.map((x) => x.catchup_s),
      read_model_groups: r.groups,
      read_model_checkpoints: r.checkpoints,
      heap_delta_mib: median(samples.map((x) => x.heap_delta_mib)),
      heap_after_mib: round(r.heapAfterBytes / MiB, 1),
    };
    console.log(`  restart: ${JSON.stringify(restart)}`);
    load.send({ type: 'stop' });
    await Promise.all([stopChild(plane.child), load.exited]);
    return {
      code, groups, hosts: HOSTS, register_s: round(registered.seconds, 1), plant_s: round(plantS, 1), records_planted: planted, first_sync: firstSync,
      steady, fast_rate: fastRate, empty_inventory: emptyInventory,
      cpu_ms_per_heartbeat: round(cpuMsPerHb, 4),
      cpu_ms_per_heartbeat_all_steady: round((steady.cp_cpu_fraction * 1000) / steady.heartbeats_per_s, 4),
      inventory_cpu_fraction: round(steady.cp_cpu_fraction_trimmed - emptyInventory.cp_cpu_fraction_trimmed, 4),
      host_states_after_windows: hostStates,
      dead, restart,
    };
  } finally {
    for (const c of children) c.proc.kill('SIGKILL');
    await nats.cleanup();
  }
}

function gitCommit(root: string): string {
  try {
    return execFileSync('git', ['-C', root, 'rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
  } catch {
    return 'unknown';
  }
}

async function main(): Promise<void> {
  const logDir = await mkdtemp(join(tmpdir(), 'sf-bench-scale-logs-'));
  console.log(`logs: ${logDir}`);
  const current = await loadProduct(values.root ?? THIS_ROOT);
  const shipped = shippedLiveness(current);
  // Smoke: the shipped rhythm scaled down 4x so a DEAD host is seen in seconds; full: as shipped.
  const liveness: LivenessSettings = run.smoke ? { heartbeatIntervalMs: 500, heartbeatTtlMs: 2_000, deadGraceMs: 1_000 } : shipped;
  const results: ScenarioResult[] = [];
  let baselineCommit: string | undefined;
  if (values['baseline-root'] !== undefined) {
    const base = await loadProduct(values['baseline-root']);
    baselineCommit = gitCommit(base.root);
    for (const n of BASELINE_SIZES) results.push(await scenario(base, 'baseline', n, liveness, logDir));
  }
  for (const n of SIZES) results.push(await scenario(current, 'read_model', n, liveness, logDir));

  const [small, large] = [Math.min(...SIZES), Math.max(...SIZES)];
  const at = (code: string, n: number) => results.find((r) => r.code === code && r.groups === n);
  const s = at('read_model', small)!;
  const l = at('read_model', large)!;
  const goals = {
    cp_cpu_fraction_100k: { goal: '<= 0.05', value: l.steady.cp_cpu_fraction, met: l.steady.cp_cpu_fraction <= 0.05 },
    cp_cpu_ratio_100k_over_10k: { goal: '<= 2', value: round(l.steady.cp_cpu_fraction / s.steady.cp_cpu_fraction, 2), met: l.steady.cp_cpu_fraction / s.steady.cp_cpu_fraction <= 2 },
    dead_to_decisions_s: { goal: '<= 1', value: l.dead.dead_to_decisions_s, met: l.dead.dead_to_decisions_s !== null && l.dead.dead_to_decisions_s <= 1 },
    catchup_s_100k: { goal: '<= 10', value: l.restart.catchup_s, met: l.restart.catchup_s !== null && l.restart.catchup_s <= 10 },
  };
  const baselineVs: Record<string, unknown> = {};
  for (const b of results.filter((r) => r.code === 'baseline')) {
    const mine = at('read_model', b.groups);
    if (mine === undefined) continue;
    baselineVs[`groups_${b.groups}`] = {
      baseline_cp_cpu_fraction: b.steady.cp_cpu_fraction,
      read_model_cp_cpu_fraction: mine.steady.cp_cpu_fraction,
      cp_cpu_baseline_over_read_model: round(b.steady.cp_cpu_fraction / mine.steady.cp_cpu_fraction, 1),
      baseline_nats_server_cpu_fraction: b.steady.nats_server_cpu_fraction,
      read_model_nats_server_cpu_fraction: mine.steady.nats_server_cpu_fraction,
      baseline_cpu_ms_per_heartbeat: b.cpu_ms_per_heartbeat,
      read_model_cpu_ms_per_heartbeat: mine.cpu_ms_per_heartbeat,
      baseline_dead_to_decisions_s: b.dead.dead_to_decisions_s,
      baseline_decided: `${b.dead.per_round[0]?.decided ?? 0}/${b.dead.per_round[0]?.groups_on_victim ?? 0}`,
      read_model_dead_to_decisions_s: mine.dead.dead_to_decisions_s,
    };
  }
  const notes: string[] = [
    `fleet: ${HOSTS} simulated hosts registered over NATS (Registration request, attestation admitted by the policy) and heartbeating every ${liveness.heartbeatIntervalMs} ms at evenly spread phases with a real agent's inventory (one exited member container with its layer per group the host holds: ${Math.ceil(large / HOSTS)} per host at ${large} groups); groups STOPPED clean, one member with turn history, spread round-robin over the hosts; every group but those of the three victim hosts has a checkpoint index record.`,
    `dead host: a victim host's heartbeats stop; dead_to_decisions_s is host_declared_dead -> the last of its ${Math.ceil(large / HOSTS)} groups' decision events (LOST unclean_stop), both on the control plane's clock; the median of ${l.dead.rounds} victims silenced one after another (dead_to_decisions_max_s: the slowest).`,
    `liveness: heartbeat interval ${liveness.heartbeatIntervalMs} ms, TTL ${liveness.heartbeatTtlMs} ms, dead grace ${liveness.deadGraceMs} ms${run.smoke ? ' (smoke: scaled down)' : ' (shipped defaults)'}; every other setting is the shipped default (reconcile every 1 s, GC/refresh pass every 30 passes, resync every 10 min).`,
    `CPU: /proc utime+stime of the control-plane child over a ${WINDOW_S} s window after the read model caught up and ${SETTLE_S} s of settling; cpu_ms_per_heartbeat is the extra control-plane CPU of a window at four times the heartbeat rate divided by the extra heartbeats, both windows taken as the mean of their quietest 75% of seconds (so a 30-s GC/refresh pass falling in one window or not does not decide it).`,
    `catch-up: the replica is stopped and a new process started ${RESTARTS} time(s) in a row while every host keeps beating; catchup_s is the median of the new processes' start() (read model complete: every bucket's watch has applied the stream's last sequence), every sample in catchup_samples_s_100k and the scenarios.`,
    `machine: ${cpus().length} cores shared with the nats-server, the load generator and other users (load averages recorded per window).`,
  ];
  for (const [k, g] of Object.entries(goals)) notes.push(`${k}: ${g.value} (goal ${g.goal}) ${g.met ? 'MET' : 'MISSED'}`);
  // What the baseline ran at and how it fared, from its own scenarios (sizes it skipped are named).
  const baselines = results.filter((r) => r.code === 'baseline');
  if (baselines.length > 0) {
    const skipped = SIZES.filter((n) => !baselines.some((b) => b.groups === n));
    const fared = baselines.map((b) => {
      const r0 = b.dead.per_round[0];
      const wronglyDead = b.host_states_after_windows.DEAD ?? 0;
      return `at ${b.groups} groups its control plane used ${(100 * b.steady.cp_cpu_fraction).toFixed(1)}% of a core steady (nats-server ${(100 * b.steady.nats_server_cpu_fraction).toFixed(1)}%), ${wronglyDead} of ${b.hosts} hosts that never stopped beating were DEAD after the CPU windows, and the silenced ${r0?.victim ?? '?'} was ${r0?.victim_state ?? '?'} at the end with ${r0?.decided ?? 0}/${r0?.groups_on_victim ?? 0} of its groups decided`;
    });
    notes.push(`baseline ${baselineCommit ?? '?'} (the control plane before the read model) ran at ${baselines.map((b) => b.groups).join(', ')} groups only (--baseline-groups)${skipped.length > 0 ? `, not run at ${skipped.join(', ')}` : ''}; ${fared.join('; ')}.`);
  }
  notes.push(`steady CPU at ${large} groups: ${(100 * l.steady.cp_cpu_fraction_trimmed).toFixed(2)}% of a core between the 30-s GC/refresh passes (quietest 75% of seconds), plus ${round((l.steady.cp_cpu_fraction - l.steady.cp_cpu_fraction_trimmed) * 30, 2)} s of CPU per 30 s above that rate (the pass walks every group and checkpoint record); at ${small}: ${(100 * s.steady.cp_cpu_fraction_trimmed).toFixed(2)}% plus ${round((s.steady.cp_cpu_fraction - s.steady.cp_cpu_fraction_trimmed) * 30, 2)} s.`);
  await writeResult(run, {
    when: new Date().toISOString(),
    machine: { cpus: cpus().length, memory_gib: round(totalmem() / 1024 ** 3, 1) },
    commit: gitCommit(current.root),
    baseline_commit: baselineCommit ?? null,
    sizes: { small, large, hosts: HOSTS },
    liveness,
    overrides: OVERRIDES,
    cp_cpu_fraction_100k: l.steady.cp_cpu_fraction,
    cp_cpu_fraction_10k: s.steady.cp_cpu_fraction,
    cp_cpu_ratio_100k_over_10k: goals.cp_cpu_ratio_100k_over_10k.value,
    // The rate between the 30-s GC/refresh passes (mean of the quietest 75% of seconds) ...
    cp_cpu_fraction_between_passes_100k: l.steady.cp_cpu_fraction_trimmed,
    cp_cpu_fraction_between_passes_10k: s.steady.cp_cpu_fraction_trimmed,
    // ... and the CPU above it per 30 s (one pass): the periodic part.
    periodic_cpu_s_per_30s_100k: round((l.steady.cp_cpu_fraction - l.steady.cp_cpu_fraction_trimmed) * 30, 2),
    periodic_cpu_s_per_30s_10k: round((s.steady.cp_cpu_fraction - s.steady.cp_cpu_fraction_trimmed) * 30, 2),
    dead_to_decisions_s: l.dead.dead_to_decisions_s,
    dead_to_decisions_max_s: l.dead.dead_to_decisions_max_s,
    dead_to_decisions_s_10k: s.dead.dead_to_decisions_s,
    catchup_s_100k: l.restart.catchup_s,
    catchup_s_10k: s.restart.catchup_s,
    catchup_samples_s_100k: l.restart.catchup_samples_s,
    read_model_mib_100k: l.restart.heap_delta_mib,
    read_model_mib_10k: s.restart.heap_delta_mib,
    cpu_ms_per_heartbeat: l.cpu_ms_per_heartbeat,
    cpu_ms_per_heartbeat_10k: s.cpu_ms_per_heartbeat,
    // What all hosts' heartbeats cost at the shipped rate: marginal CPU per heartbeat × heartbeats/s.
    heartbeat_cpu_fraction_100k: round((l.cpu_ms_per_heartbeat * l.steady.heartbeats_per_s) / 1000, 4),
    inventory_cpu_fraction_100k: l.inventory_cpu_fraction,
    nats_server_cpu_fraction_100k: l.steady.nats_server_cpu_fraction,
    goals,
    baseline_vs_read_model: baselineVs,
    notes,
    scenarios: results,
  });
}

await main();
