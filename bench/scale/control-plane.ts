// One control-plane replica for bench/scale, run as a child process so its CPU is exactly this
// process's CPU (read from /proc by the parent) and its heap is its own. It loads the control plane
// from the tree named in its job (this checkout or a baseline worktree), connects to the benchmark's
// nats-server, and starts a ControlPlane as cmd/control-plane does (leader election, registry,
// reconcile loops, shipped defaults). It reports how long start() took — for the read-model control
// plane, that is catching up with the store (FleetState.start() resolves once every bucket's watch
// has applied the stream's last sequence) — and the heap before and after it, both after a full GC.
//
// With `profileDir`, the child writes V8 CPU profiles of its start() (`start-<replica>.cpuprofile`)
// and of any window the parent brackets with `profile-start` / `profile-stop` (`<name>.cpuprofile`).
//
// IPC: parent → child `{ type: 'sync' | 'leader' | 'stop' | 'profile-start' }` or
// `{ type: 'profile-stop', name }`; child → parent `ready`, `synced`, `leader`, `profiled` or `error`
// (see ChildMessage).
import { writeFile } from 'node:fs/promises';
import { Session } from 'node:inspector/promises';
import { join } from 'node:path';
import { loadProduct } from './product.ts';
import { controlPlaneConfig, type LivenessSettings } from './fleet.ts';

export interface ControlPlaneJob {
  readonly root: string;
  readonly natsUrl: string;
  readonly replicaId: string;
  readonly liveness: LivenessSettings;
  readonly logLevel: string;
  /** Settings other than the shipped defaults (experiments only; recorded in the result). */
  readonly overrides?: Record<string, unknown>;
  /** Where CPU profiles go (none when undefined). */
  readonly profileDir?: string | undefined;
}

export type ChildMessage =
  | { readonly type: 'ready'; readonly startMs: number; readonly heapBeforeBytes: number; readonly heapAfterBytes: number; readonly readModel: boolean; readonly groups: number; readonly checkpoints: number }
  | { readonly type: 'synced'; readonly ms: number; readonly groups: number; readonly checkpoints: number; readonly heapBytes: number }
  | { readonly type: 'leader'; readonly leader: boolean }
  | { readonly type: 'profiled'; readonly path: string }
  | { readonly type: 'error'; readonly message: string };

const send = (m: ChildMessage): void => {
  process.send?.(m);
};

/** Heap in use after a full collection (the child runs with --expose-gc). */
function settledHeap(): number {
  const gc = (globalThis as { gc?: () => void }).gc;
  if (gc === undefined) throw new Error('run with --expose-gc');
  gc();
  gc();
  return process.memoryUsage().heapUsed;
}

/** A V8 CPU profile of this process, started and stopped on request (node:inspector). */
class Profiler {
  readonly #session = new Session();
  #running = false;

  constructor(private readonly dir: string | undefined) {
    if (dir !== undefined) this.#session.connect();
  }

  async start(): Promise<void> {
    if (this.dir === undefined || this.#running) return;
    this.#running = true;
    await this.#session.post('Profiler.enable');
    await this.#session.post('Profiler.start');
  }

  async stop(name: string): Promise<string> {
    if (this.dir === undefined || !this.#running) return '';
    this.#running = false;
    const { profile } = await this.#session.post('Profiler.stop');
    const path = join(this.dir, `${name}.cpuprofile`);
    await writeFile(path, JSON.stringify(profile));
    return path;
  }
}

async function main(): Promise<void> {
  const job = JSON.parse(process.argv[2] ?? '') as ControlPlaneJob;
  const p = await loadProduct(job.root);
  const nc = await p.connection.connectNats({ servers: job.natsUrl, name: job.replicaId });
  const store = await p.connection.StateStore.open(nc, { buckets: p.buckets.CONTROL_PLANE_BUCKETS });
  const chunks = await p.chunkStore.ChunkStore.open(nc);
  // As cmd/control-plane wires it, where the tree has it: heartbeats on their own connection, read in batches.
  const readBatchMs = (p.controlPlane as { HEARTBEAT_READ_BATCH_MS?: number }).HEARTBEAT_READ_BATCH_MS;
  const heartbeatNc = readBatchMs !== undefined ? await p.connection.connectNats({ servers: job.natsUrl, name: `${job.replicaId}-heartbeats`, readBatchMs }) : undefined;
  const plane = new p.controlPlane.ControlPlane({
    config: controlPlaneConfig(p, job.liveness, job.overrides), nc, ...(heartbeatNc !== undefined ? { heartbeatNc } : {}), store, chunks, metrics: new p.metrics.FleetMetrics(),
    logger: p.logger.createLogger({ name: job.replicaId, level: job.logLevel }), apiSha: p.apiSha.API_SHA, replicaId: job.replicaId,
  });
  // The pre-read-model control plane has no `fleet` (and a synchronous start()).
  const fleet = (plane as { fleet?: typeof plane.fleet }).fleet;
  const profiler = new Profiler(job.profileDir);
  const heapBeforeBytes = settledHeap();
  await profiler.start();
  const t0 = performance.now();
  await plane.start();
  const startMs = performance.now() - t0;
  await profiler.stop(`start-${job.replicaId}`);
  const heapAfterBytes = settledHeap();
  send({ type: 'ready', startMs, heapBeforeBytes, heapAfterBytes, readModel: fleet !== undefined, groups: fleet?.groupCount() ?? -1, checkpoints: fleet?.checkpointCount() ?? -1 });

  process.on('message', (raw: { type: string }) => {
    void (async () => {
      try {
        if (raw.type === 'sync') {
          const s0 = performance.now();
          await fleet?.sync();
          send({ type: 'synced', ms: performance.now() - s0, groups: fleet?.groupCount() ?? -1, checkpoints: fleet?.checkpointCount() ?? -1, heapBytes: settledHeap() });
        } else if (raw.type === 'leader') {
          send({ type: 'leader', leader: plane.leader.isLeader });
        } else if (raw.type === 'profile-start') {
          await profiler.start();
        } else if (raw.type === 'profile-stop') {
          send({ type: 'profiled', path: await profiler.stop((raw as { name?: string }).name ?? 'window') });
        } else if (raw.type === 'stop') {
          await plane.stop();
          await nc.close();
          process.disconnect?.();
          process.exit(0);
        }
      } catch (err) {
        send({ type: 'error', message: err instanceof Error ? err.stack ?? err.message : String(err) });
      }
    })();
  });
}

main().catch((err: unknown) => {
  send({ type: 'error', message: err instanceof Error ? err.stack ?? err.message : String(err) });
  process.exitCode = 1;
});
