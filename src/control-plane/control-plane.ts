// The control-plane service, wired from its parts: host registry (any replica, queue group),
// leader election, and — on the leader only — the liveness loop, the migration controller and
// checkpoint retention. Exposes the RunnerBackend (for src/api's gRPC runner service) and the
// operator façade `admin` (admin-ops.ts: queries, drain/remove/migrate/destroy, verify with the
// reverse-probe responder, events) for the admin service. cmd/control-plane builds one of these.
import type { NatsConnection } from '@nats-io/transport-node';
import type { ControlPlaneConfig } from '../config/control-plane.ts';
import type { RunnerBackend } from '../core/runner-port.ts';
import type { RemovalSource } from '../core/index.ts';
import type { Logger } from '../observability/logger.ts';
import type { FleetMetrics } from '../observability/metrics.ts';
import type { ChunkStore } from '../store/chunk-store.ts';
import type { StateStore } from '../store/connection.ts';
import { AdminOps } from './admin-ops.ts';
import { NatsAgentClient, type AgentPort } from './agent-client.ts';
import type { ControlPlaneBuckets } from './buckets.ts';
import { EventRecorder } from './events.ts';
import { describeError } from './fleet.ts';
import { HostLeasePolicySchema } from './hosts.ts';
import { HostRegistry, policyFrom } from './host-registry.ts';
import { LeaderElector, type Elector } from './leader.ts';
import { LivenessLoop } from './liveness-loop.ts';
import { MigrationController, type StepHook } from './migration-controller.ts';
import { LeadershipRecordSchema } from './records.ts';
import { GroupOps } from './group-ops.ts';
import { ManifestDigestCache, collectCheckpoints, refreshCheckpoints } from './retention.ts';
import { ControlPlaneRunnerBackend } from './runner-backend.ts';
import { ProbeResponder } from './reverse-probe.ts';
import { openRepositories, type ControlPlaneContext } from './state.ts';

export interface ControlPlaneOptions {
  readonly config: ControlPlaneConfig;
  readonly nc: NatsConnection;
  readonly store: StateStore<ControlPlaneBuckets>;
  readonly chunks: ChunkStore;
  readonly metrics: FleetMetrics;
  readonly logger: Logger;
  readonly apiSha: string;
  /** This build's git SHA: the allowed agent SHA when the config names none. */
  readonly buildSha?: string | undefined;
  readonly replicaId: string;
  readonly now?: () => number;
  /** Tests: replace the NATS agent client, and inject crash points into migration steps. */
  readonly agents?: AgentPort;
  readonly stepHook?: StepHook;
  /** Run reconcile loops on a timer (default true); tests may drive `reconcileOnce()` instead. */
  readonly autoReconcile?: boolean;
  /** Leader election; default: the NATS KV lease (leader.ts). In-cluster: a Kubernetes Lease. */
  readonly elector?: Elector;
}

export class ControlPlane {
  readonly ctx: ControlPlaneContext;
  readonly runner: RunnerBackend;
  readonly registry: HostRegistry;
  readonly controller: MigrationController;
  readonly liveness: LivenessLoop;
  readonly leader: Elector;
  /** Operator queries and commands (the admin service's backend). */
  readonly admin: AdminOps;
  readonly probes: ProbeResponder;
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<void> | undefined;
  #stopped = false;
  #passes = 0;
  /** Parsed manifests' chunk digests, kept across GC passes (manifests are write-once). */
  readonly #manifestDigests = new ManifestDigestCache();
  readonly #groupOps: GroupOps;
  #refreshing: Promise<unknown> | undefined;

  constructor(private readonly opts: ControlPlaneOptions) {
    const now = opts.now ?? Date.now;
    const repos = openRepositories(opts.store);
    const logger = opts.logger.child({ component: 'control-plane', replica: opts.replicaId });
    this.ctx = {
      config: opts.config,
      repos,
      chunks: opts.chunks,
      agents: opts.agents ?? new NatsAgentClient(opts.nc, opts.metrics, now, opts.config.agentCommandTimeoutMs),
      events: new EventRecorder(opts.store.events, `control-plane/${opts.replicaId}`, logger, now),
      metrics: opts.metrics,
      logger,
      now,
      apiSha: opts.apiSha,
      replicaId: opts.replicaId,
    };
    this.runner = new ControlPlaneRunnerBackend(this.ctx);
    this.#groupOps = new GroupOps(this.ctx);
    const policy = policyFrom(this.ctx, opts.buildSha);
    this.registry = new HostRegistry(this.ctx, policy, opts.store.repository('hostLeases', HostLeasePolicySchema));
    this.controller = new MigrationController(this.ctx, opts.stepHook);
    this.probes = new ProbeResponder(opts.nc, opts.replicaId, now, logger);
    this.admin = new AdminOps(this.ctx, opts.store, policy, this.controller, this.probes, opts.buildSha);
    this.liveness = new LivenessLoop(this.ctx);
    this.leader = opts.elector ?? new LeaderElector(opts.store.repository('leadership', LeadershipRecordSchema), opts.replicaId, now, logger);
  }

  /** Serve registrations/heartbeats and start the leader loop. */
  start(): void {
    this.registry.start(this.opts.nc);
    this.probes.start();
    void (async () => {
      for await (const s of this.opts.nc.status()) {
        if (s.type === 'disconnect') this.liveness.natsAvailable(false);
        if (s.type === 'reconnect') this.liveness.natsAvailable(true);
      }
    })().catch(() => undefined);
    if (this.opts.autoReconcile ?? true) this.#schedule();
  }

  #schedule(): void {
    if (this.#stopped) return;
    this.#timer = setTimeout(() => {
      this.#running = this.#pass().finally(() => this.#schedule());
    }, this.opts.config.reconcileIntervalMs);
  }

  async #pass(): Promise<void> {
    const wasLeader = this.leader.isLeader;
    const leads = await this.leader.tick();
    if (!leads) {
      // Leader-only gauges would freeze here while the new leader exports fresh ones (read with max()).
      if (wasLeader) this.ctx.metrics.leadershipLost();
      return;
    }
    if (!wasLeader) this.liveness.reset();
    await this.reconcileOnce();
  }

  /** One leader pass: liveness/leases, migrations, and (every 30th pass) checkpoint GC and refreshes. */
  async reconcileOnce(): Promise<void> {
    try {
      await this.liveness.tick();
    } catch (err) {
      this.ctx.logger.warn(describeError(err), 'liveness pass failed');
    }
    try {
      await this.controller.reconcile();
    } catch (err) {
      this.ctx.logger.warn(describeError(err), 'migration pass failed');
    }
    if (this.#passes++ % 30 === 0) {
      try {
        // Every tenth pass also sweeps chunks of checkpoints that never wrote a manifest.
        await collectCheckpoints(this.ctx, this.#manifestDigests, { fullSweep: this.#passes % 300 === 1 });
      } catch (err) {
        this.ctx.logger.warn(describeError(err), 'checkpoint GC failed');
      }
      // Refreshes take whole checkpoints (up to an agent command timeout each): they run beside the
      // pass, one batch at a time, so liveness, lease renewal and evacuations never wait for them.
      this.#refreshing ??= refreshCheckpoints(this.ctx, this.#groupOps, () => !this.#stopped && this.leader.isLeader)
        .catch((err: unknown) => this.ctx.logger.warn(describeError(err), 'checkpoint refresh pass failed'))
        .finally(() => { this.#refreshing = undefined; });
    }
  }

  /** Operator drain (R-H5): the host's groups are stopped cleanly, checkpointed and moved. */
  drainHost(hostId: string, source: RemovalSource = 'operator_drain'): Promise<boolean> {
    return this.registry.drain(hostId, source);
  }

  /** Operator remove: drain, and the host is REMOVED (epoch ended) once it holds nothing. */
  removeHost(hostId: string): Promise<boolean> {
    return this.registry.drain(hostId, 'operator_remove');
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer) clearTimeout(this.#timer);
    await this.#running?.catch(() => undefined);
    await this.#refreshing;
    this.probes.stop();
    await this.registry.stop();
    await this.leader.resign();
  }
}
