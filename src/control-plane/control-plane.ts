// The control-plane service, wired from its parts (the composition root of src/control-plane):
// - the read model (fleet-state.ts), fed by KV watches and in-memory heartbeats, on every replica;
// - the one writer per record kind (group-store.ts, hosts.ts HostStore, checkpoint-index.ts);
// - the host registry (registrations and notices on any replica, heartbeats on all of them);
// - leader election, and on the leader only two keyed reconcile queues fed by the read model's
//   change notifications: hosts (liveness, lease drain, "drained and empty → REMOVED") and groups
//   (evacuations and migrations, LOST retention), each key requeued at its own next deadline, plus
//   a slow resync as a safety net and checkpoint GC/refresh every 30 passes (both run beside the
//   loop: nothing slow sits between two lease renewals; the read model's sync is bounded too).
// Leader-only work runs only while the lease is known to be held: every renewal arms a deadline at
// half the lease duration, and if no renewal lands by then (a pass stuck in a slow write, a long
// pause of this process) the queues stop as if leadership were lost — another replica may lead
// from the lease's end — and start again from a fresh sync after the next renewal.
// Exposes the RunnerBackend (for src/api's gRPC runner service) and the operator façade `admin`
// (admin-ops.ts) for the admin service. cmd/control-plane builds one of these.
import type { NatsConnection } from '@nats-io/transport-node';
import type { ControlPlaneConfig } from '../config/control-plane.ts';
import type { RunnerBackend } from '../core/runner-port.ts';
import type { ExecBackend } from '../core/exec-port.ts';
import type { RemovalSource } from '../core/index.ts';
import type { Logger } from '../observability/logger.ts';
import type { FleetMetrics } from '../observability/metrics.ts';
import type { ChunkStore } from '../store/chunk-store.ts';
import type { KvRepository } from '../store/kv-repository.ts';
import { DEFAULT_BUCKETS, type StateStore } from '../store/connection.ts';
import { AdminOps } from './admin-ops.ts';
import { NatsAgentClient, type AgentPort } from './agent-client.ts';
import type { ControlPlaneBuckets } from './buckets.ts';
import { CheckpointIndex } from './checkpoint-index.ts';
import { EventRecorder } from './events.ts';
import { describeError } from './fleet.ts';
import { FleetState, hasControllerWork, isTerminal } from './fleet-state.ts';
import { GroupStore } from './group-store.ts';
import { HostLeasePolicySchema, HostStore } from './hosts.ts';
import { HostRegistry, policyFrom } from './host-registry.ts';
import { KeyedQueue } from './keyed-queue.ts';
import { LeaderElector, type Elector } from './leader.ts';
import { LivenessLoop } from './liveness-loop.ts';
import { MigrationController, type StepHook } from './migration-controller.ts';
import { GroupReadModelSchema, LeadershipRecordSchema, type GroupRecord, type HostRecord } from './records.ts';
import { GroupOps } from './group-ops.ts';
import { ManifestDigestCache, collectCheckpoints, refreshCheckpoints } from './retention.ts';
import { ControlPlaneRunnerBackend } from './runner-backend.ts';
import { ExecRelay } from './exec-relay.ts';
import { TurnRunner } from './turn-runner.ts';
import { ProbeResponder } from './reverse-probe.ts';
import { IdleStopper } from './idle-stop.ts';
import { ProtectionIndex } from './protection.ts';
import { SpotEvacuator } from './spot-evacuation.ts';
import { Keys, openRepositories, type ControlPlaneDeps, type Repositories } from './state.ts';

/**
 * How often the heartbeat connection's socket is read (ControlPlaneOptions.heartbeatNc): 1,000 hosts
 * beating every 2 s are then ten reads a second, not up to 500, each a wake-up of the process; a
 * beat waits at most this long, against a liveness TTL of seconds.
 */
export const HEARTBEAT_READ_BATCH_MS = 100;

export interface ControlPlaneOptions {
  readonly config: ControlPlaneConfig;
  readonly nc: NatsConnection;
  /**
   * The connection heartbeats are taken in on; default `nc`. The product gives them their own,
   * read in batches (connection.ts readBatchMs): nobody waits on a heartbeat, and each read of a
   * busy connection wakes the process.
   */
  readonly heartbeatNc?: NatsConnection;
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
  /** Run the leader's reconcile queues (default true); tests may drive `reconcileOnce()` instead. */
  readonly autoReconcile?: boolean;
  /** Leader election; default: the NATS KV lease (leader.ts). In-cluster: a Kubernetes Lease. */
  readonly elector?: Elector;
}

/**
 * How long one renewal of the leader lease is trusted here: half the lease's duration (the NATS KV
 * lease expires by the leadership bucket's TTL; the Kubernetes Lease by its duration), from the
 * moment the renewal was sent. The other half is margin for clocks, timer lateness and work
 * already in flight when the deadline passes.
 */
export function leaseTrustMs(config: ControlPlaneConfig): number {
  const leaseMs = config.leaderElection === 'kubernetes-lease' ? config.leaseDurationSeconds * 1000 : DEFAULT_BUCKETS.leadership.ttlMs ?? 15_000;
  return Math.max(100, Math.floor(leaseMs / 2));
}

/** Host states whose groups must leave (the controller marks them for evacuation). */
const GOING_AWAY = new Set<HostRecord['lifecycle']['state']>(['DRAINING', 'DEAD', 'REMOVED']);

/**
 * Workers of the groups queue. Most of a host loss's group decisions are a few store round trips
 * (mark, LOST): they run this many at once, while the steps that talk to agents or read chunks stay
 * bounded by migrationParallelism inside the controller (bench/scale: host DEAD → 100 decisions).
 */
const GROUP_QUEUE_WORKERS = 32;
/**
 * Each steady host falls due about once per heartbeat TTL (liveness-loop.ts), 100 a second at 1,000
 * hosts: due times on a 250-ms step make that four timer firings a second, not one per host, for a
 * liveness verdict at most 250 ms later.
 */
const HOST_DUE_STEP_MS = 250;
const groupWorkers = (migrationParallelism: number): number => Math.max(migrationParallelism, GROUP_QUEUE_WORKERS);

export class ControlPlane {
  /** Every dependency (the composition root's bag; services get narrow Picks of it). */
  readonly ctx: ControlPlaneDeps;
  /** The raw buckets, for tests and benchmarks that plant or inspect records. */
  readonly repos: Repositories;
  readonly fleet: FleetState;
  readonly runner: RunnerBackend;
  readonly #runner: ControlPlaneRunnerBackend;
  /** Exec and RunTurn (R-I9): processes and whole turns in member containers, through the fleet. */
  readonly exec: ExecBackend;
  readonly registry: HostRegistry;
  readonly controller: MigrationController;
  readonly liveness: LivenessLoop;
  readonly leader: Elector;
  /** Operator queries and commands (the admin service's backend). */
  readonly admin: AdminOps;
  readonly probes: ProbeResponder;
  /** Idle auto-stop (idle-stop.ts): its own keyed queue, leader only. */
  readonly idle: IdleStopper;
  /** Unprotected groups per host (protection.ts), exported at scrape. */
  readonly protection: ProtectionIndex;
  /** Spot notices: every group saved off the host first (spot-evacuation.ts), leader only. */
  readonly spot: SpotEvacuator;
  readonly #hostQueue: KeyedQueue;
  readonly #groupQueue: KeyedQueue;
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<void> | undefined;
  #stopped = false;
  #leading = false;
  /** Until when the last renewal of the leader lease is trusted (leaseTrustMs from its start). */
  #leaseTrustedUntilMs = 0;
  #leaseTimer: NodeJS.Timeout | undefined;
  #collecting: Promise<unknown> | undefined;
  #passes = 0;
  #lastResyncMs = 0;
  /** Parsed manifests' chunk digests, kept across GC passes (manifests are write-once). */
  readonly #manifestDigests = new ManifestDigestCache();
  readonly #groupOps: GroupOps;
  #refreshing: Promise<unknown> | undefined;

  constructor(private readonly opts: ControlPlaneOptions) {
    const now = opts.now ?? Date.now;
    const repos = openRepositories(opts.store);
    const logger = opts.logger.child({ component: 'control-plane', replica: opts.replicaId });
    const events = new EventRecorder(opts.store.events, `control-plane/${opts.replicaId}`, logger, now);
    this.repos = repos;
    // The read model follows the groups through their read-model schema (what it keeps, records.ts).
    const groupsAsRead: readonly KvRepository<GroupRecord>[] = opts.store.shardedRepository('groups', GroupReadModelSchema).parts;
    this.fleet = new FleetState({ hosts: repos.hosts, groups: groupsAsRead, checkpoints: repos.checkpoints }, logger, opts.metrics, { checkpointKeep: opts.config.checkpointKeep });
    this.ctx = {
      config: opts.config,
      fleet: this.fleet,
      groups: new GroupStore({ repo: repos.groups, events, metrics: opts.metrics, now }),
      hosts: new HostStore({ repo: repos.hosts, events, now }),
      checkpoints: new CheckpointIndex(repos.checkpoints),
      conversations: repos.conversations,
      idempotency: repos.idempotency,
      gcLocks: repos.gcLocks,
      chunks: opts.chunks,
      agents: opts.agents ?? new NatsAgentClient(opts.nc, opts.metrics, now, opts.config.agentCommandTimeoutMs),
      events,
      metrics: opts.metrics,
      logger,
      now,
      apiSha: opts.apiSha,
      replicaId: opts.replicaId,
    };
    this.leader = opts.elector ?? new LeaderElector(opts.store.repository('leadership', LeadershipRecordSchema), opts.replicaId, now, logger);
    this.#runner = new ControlPlaneRunnerBackend(this.ctx);
    this.runner = this.#runner;
    const relay = new ExecRelay(this.ctx, opts.nc);
    const turns = new TurnRunner(this.ctx, this.runner, relay);
    this.exec = { exec: (input, signal) => relay.exec(input, signal), runTurn: (input, signal) => turns.runTurn(input, signal) };
    this.#groupOps = new GroupOps(this.ctx);
    const policy = policyFrom(this.ctx, opts.buildSha);
    this.registry = new HostRegistry(this.ctx, policy, opts.store.repository('hostLeases', HostLeasePolicySchema));
    this.controller = new MigrationController(this.ctx, opts.stepHook);
    this.probes = new ProbeResponder(opts.nc, opts.replicaId, now, logger);
    this.admin = new AdminOps(this.ctx, opts.store, policy, this.controller, this.probes, opts.buildSha);
    this.liveness = new LivenessLoop(this.ctx);
    opts.metrics.setHeartbeatAgeSource(() => this.liveness.heartbeatAges());
    this.idle = new IdleStopper(this.ctx);
    this.protection = new ProtectionIndex(this.fleet);
    opts.metrics.setUnprotectedSource(() => this.protection.summary(now(), opts.config.unprotectedAlertAfterMs));
    this.spot = new SpotEvacuator(this.ctx, this.controller);

    const onError = (queue: string) => (key: string, err: unknown) => {
      opts.metrics.reconciles.inc({ queue, result: 'error' });
      logger.warn({ key, queue, ...describeError(err) }, 'reconcile failed; retried with backoff');
    };
    this.#hostQueue = new KeyedQueue(async (hostId) => {
      // A run that starts while the lease is not trusted does nothing now and looks again later: a
      // renewal may land before the lease timer ends leadership, and then no re-enqueue of every key
      // follows (a real loss stops the queue, which drops the retry).
      if (!this.#leaseTrusted()) return { requeueAfterMs: opts.config.reconcileIntervalMs };
      opts.metrics.reconciles.inc({ queue: 'hosts', result: 'ok' });
      const next = await this.liveness.reconcileHost(hostId);
      await this.controller.reconcileDrainingHost(hostId);
      return next;
    }, { concurrency: 8, onError: onError('hosts'), now, dueStepMs: HOST_DUE_STEP_MS });
    this.#groupQueue = new KeyedQueue(async (groupId) => {
      if (!this.#leaseTrusted()) return { requeueAfterMs: opts.config.reconcileIntervalMs };
      opts.metrics.reconciles.inc({ queue: 'groups', result: 'ok' });
      return this.controller.reconcileGroup(groupId);
    }, { concurrency: groupWorkers(opts.config.migrationParallelism), onError: onError('groups'), now });
    this.fleet.onHostChange((_key, before, after) => {
      this.#hostChanged(before, after);
      this.spot.hostChanged(before, after);
    });
    this.fleet.onGroupChange((_key, before, after) => this.#groupChanged(before, after));
  }

  /** Follow the store into the read model, serve registrations/heartbeats, start the leader loop. */
  async start(): Promise<void> {
    await this.fleet.start();
    this.registry.start(this.opts.nc, this.opts.heartbeatNc);
    this.probes.start();
    // Liveness verdicts are suspended while EITHER connection is down: heartbeats missed on a lost
    // heartbeat connection say nothing about the hosts.
    const down = new Set<NatsConnection>();
    const follow = (nc: NatsConnection): void => void (async () => {
      for await (const s of nc.status()) {
        if (s.type === 'disconnect') down.add(nc);
        else if (s.type === 'reconnect') down.delete(nc);
        else continue;
        this.liveness.natsAvailable(down.size === 0);
      }
    })().catch(() => undefined);
    follow(this.opts.nc);
    if (this.opts.heartbeatNc !== undefined && this.opts.heartbeatNc !== this.opts.nc) follow(this.opts.heartbeatNc);
    if (this.opts.autoReconcile ?? true) this.#schedule();
  }

  // ---- change notifications → keys ------------------------------------------------------------

  #hostChanged(before: HostRecord | undefined, after: HostRecord | undefined): void {
    if (!this.#leading) return;
    const host = after ?? before;
    if (host === undefined) return;
    this.#hostQueue.add(host.hostId);
    // A host that starts going away: each of its groups gets its evacuation mark.
    if (after !== undefined && GOING_AWAY.has(after.lifecycle.state) && before?.lifecycle.state !== after.lifecycle.state) this.#enqueueGroupsOn(after.hostId);
  }

  #groupChanged(before: GroupRecord | undefined, after: GroupRecord | undefined): void {
    if (!this.#leading) return;
    if (after !== undefined && this.#needsController(after)) this.#groupQueue.add(after.groupId);
    // A group leaving a draining host may leave it empty (→ REMOVED).
    const left = before?.lifecycle.hostId;
    if (left !== undefined && (after === undefined || isTerminal(after) || after.lifecycle.hostId !== left || after.lifecycle.migration === undefined && before?.lifecycle.migration !== undefined)) this.#hostQueue.add(left);
    const target = before?.lifecycle.migration?.targetHostId;
    if (target !== undefined && after?.lifecycle.migration?.targetHostId !== target) this.#hostQueue.add(target);
  }

  #needsController(g: GroupRecord): boolean {
    if (hasControllerWork(g)) return true;
    if (isTerminal(g)) return false;
    const host = this.fleet.host(Keys.host(g.lifecycle.hostId))?.value;
    return host !== undefined && GOING_AWAY.has(host.lifecycle.state);
  }

  #enqueueGroupsOn(hostId: string): void {
    for (const key of this.fleet.groupKeysOnHost(hostId)) {
      const g = this.fleet.group(key)?.value;
      if (g !== undefined) this.#groupQueue.add(g.groupId);
    }
  }

  /** Every key with possible work: all hosts, groups with controller work, groups on departing hosts. */
  #enqueueAll(): void {
    for (const { value: h } of this.fleet.hosts()) {
      this.#hostQueue.add(h.hostId);
      if (GOING_AWAY.has(h.lifecycle.state)) this.#enqueueGroupsOn(h.hostId);
    }
    for (const key of this.fleet.groupKeysWithWork()) {
      const g = this.fleet.group(key)?.value;
      if (g !== undefined) this.#groupQueue.add(g.groupId);
    }
  }

  // ---- the leader loop --------------------------------------------------------------------------

  #schedule(): void {
    if (this.#stopped) return;
    this.#timer = setTimeout(() => {
      this.#running = this.#pass().finally(() => this.#schedule());
    }, this.opts.config.reconcileIntervalMs);
  }

  async #pass(): Promise<void> {
    const tickStartMs = this.ctx.now();
    const leads = await this.leader.tick();
    if (!leads) {
      if (this.#leading) this.#loseLeadership();
      return;
    }
    if (this.#stopped) return;
    this.#trustLease(tickStartMs);
    if (!this.#leading) {
      // A new leader has observed nothing yet (stall guard), and starts from a complete model.
      this.liveness.reset();
      try {
        // Bounded: the next renewal must not wait on a read model that does not catch up.
        await this.fleet.sync({ timeoutMs: Math.max(50, Math.floor(leaseTrustMs(this.opts.config) / 2)) });
      } catch (err) {
        this.ctx.logger.warn(describeError(err), 'read model not caught up; leading from the next pass');
        return;
      }
      if (!this.#leaseTrusted()) return;
      this.#leading = true;
      this.#hostQueue.start();
      this.#groupQueue.start();
      this.#lastResyncMs = this.ctx.now();
      this.#enqueueAll();
      this.idle.startLeading();
      this.spot.startLeading();
    }
    this.liveness.observeTick();
    if (this.ctx.now() - this.#lastResyncMs >= this.opts.config.resyncIntervalMs) {
      this.#lastResyncMs = this.ctx.now();
      this.#enqueueAll();
    }
    this.#gauges();
    // Not awaited: GC and refreshes run beside the loop, never between two renewals.
    void this.#periodic();
  }

  /** A renewal sent at `sentAtMs` succeeded: leader-only work may run until leaseTrustMs after it. */
  #trustLease(sentAtMs: number): void {
    const trustMs = leaseTrustMs(this.opts.config);
    this.#leaseTrustedUntilMs = sentAtMs + trustMs;
    if (this.#leaseTimer) clearTimeout(this.#leaseTimer);
    this.#leaseTimer = setTimeout(() => {
      this.#leaseTimer = undefined;
      if (!this.#leading || this.#leaseTrusted()) return;
      this.ctx.logger.warn({ trustMs }, 'leader lease not renewed in time: leader-only work stopped until the next renewal');
      this.#loseLeadership();
    }, Math.max(0, this.#leaseTrustedUntilMs - this.ctx.now()));
    this.#leaseTimer.unref?.();
  }

  #leaseTrusted(): boolean {
    return this.ctx.now() < this.#leaseTrustedUntilMs;
  }

  #loseLeadership(): void {
    this.#leading = false;
    this.#hostQueue.stop();
    this.#groupQueue.stop();
    this.idle.stopLeading();
    this.spot.stopLeading();
    // Leader-only gauges would freeze here while the new leader exports fresh ones (read with max()).
    this.ctx.metrics.leadershipLost();
  }

  #gauges(): void {
    const { metrics } = this.ctx;
    for (const s of ['REGISTERING', 'UNATTESTED', 'READY', 'DRAINING', 'SUSPECT', 'DEAD', 'REMOVED']) metrics.hosts.set({ state: s }, this.fleet.hostCountsByState().get(s) ?? 0);
    for (const s of ['PENDING', 'RUNNING', 'STOPPING', 'STOPPED', 'MIGRATING', 'LOST', 'DESTROYED']) metrics.groups.set({ state: s }, this.fleet.groupCountsByState().get(s) ?? 0);
    metrics.reconcileQueueDepth.set({ queue: 'hosts' }, this.#hostQueue.depth);
    metrics.reconcileQueueDepth.set({ queue: 'groups' }, this.#groupQueue.depth);
    metrics.reconcileQueueDepth.set({ queue: 'idle' }, this.idle.depth);
    metrics.reconcileQueueDepth.set({ queue: 'spot' }, this.spot.depth);
    metrics.readModelRecords.set({ bucket: 'groups', validity: 'valid' }, this.fleet.groupCount());
    metrics.readModelRecords.set({ bucket: 'groups', validity: 'invalid' }, this.fleet.invalidGroupCount());
    metrics.readModelRecords.set({ bucket: 'checkpoints', validity: 'valid' }, this.fleet.checkpointCount());
    metrics.readModelRecords.set({ bucket: 'checkpoints', validity: 'invalid' }, this.fleet.invalidCheckpointCount());
  }

  /**
   * Every 30th pass: checkpoint GC (every tenth of those a full sweep) and idle-checkpoint refreshes.
   * Resolves when this call's GC pass has ended (the leader loop does not wait for it).
   */
  async #periodic(): Promise<void> {
    if (this.#passes++ % 30 !== 0) return;
    // Every tenth pass also sweeps chunks of checkpoints that never wrote a manifest. One GC at a time.
    const fullSweep = this.#passes % 300 === 1;
    this.#collecting ??= collectCheckpoints(this.ctx, this.#manifestDigests, { fullSweep })
      .catch((err: unknown) => this.ctx.logger.warn(describeError(err), 'checkpoint GC failed'))
      .finally(() => { this.#collecting = undefined; });
    const collecting = this.#collecting;
    // Refreshes take whole checkpoints (up to an agent command timeout each): they run beside the
    // loop, one batch at a time, so liveness, lease renewal and evacuations never wait for them.
    this.#refreshing ??= refreshCheckpoints(this.ctx, this.#groupOps, () => !this.#stopped && this.leader.isLeader)
      .catch((err: unknown) => this.ctx.logger.warn(describeError(err), 'checkpoint refresh pass failed'))
      .finally(() => { this.#refreshing = undefined; });
    await collecting;
  }

  /**
   * One full pass, synchronously, without the queues (tests and benchmarks drive this): the model
   * brought up to date, every host judged, every group with work (or on a departing host) advanced,
   * drained-and-empty hosts removed, and (every 30th call) GC and refreshes.
   */
  async reconcileOnce(): Promise<void> {
    await this.fleet.sync();
    this.liveness.observeTick();
    try {
      await this.liveness.tick();
    } catch (err) {
      this.ctx.logger.warn(describeError(err), 'liveness pass failed');
    }
    await this.fleet.sync();
    const groupIds = new Set<string>();
    for (const key of this.fleet.groupKeysWithWork()) {
      const g = this.fleet.group(key)?.value;
      if (g !== undefined) groupIds.add(g.groupId);
    }
    for (const { value: h } of this.fleet.hosts()) {
      if (!GOING_AWAY.has(h.lifecycle.state)) continue;
      for (const key of this.fleet.groupKeysOnHost(h.hostId)) {
        const g = this.fleet.group(key)?.value;
        if (g !== undefined) groupIds.add(g.groupId);
      }
    }
    const queue = [...groupIds];
    const worker = async (): Promise<void> => {
      for (let id = queue.shift(); id !== undefined; id = queue.shift()) await this.controller.reconcileGroup(id);
    };
    await Promise.all(Array.from({ length: groupWorkers(this.opts.config.migrationParallelism) }, worker));
    await this.fleet.sync();
    for (const { value: h } of [...this.fleet.hosts()]) {
      if (h.lifecycle.state !== 'DRAINING') continue;
      try {
        await this.controller.reconcileDrainingHost(h.hostId);
      } catch (err) {
        this.ctx.logger.warn({ hostId: h.hostId, ...describeError(err) }, 'drained-host check failed');
      }
    }
    this.#gauges();
    await this.#periodic();
  }

  /** Wait until both reconcile queues have nothing ready or running (tests). */
  async whenIdle(): Promise<void> {
    await Promise.all([this.#hostQueue.whenIdle(), this.#groupQueue.whenIdle(), this.idle.whenIdle(), this.spot.whenIdle(), this.#runner.whenBackgroundIdle()]);
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
    if (this.#leaseTimer) clearTimeout(this.#leaseTimer);
    await this.#running?.catch(() => undefined);
    this.#leading = false;
    this.#hostQueue.stop();
    this.#groupQueue.stop();
    this.idle.close();
    this.spot.stopLeading();
    this.protection.close();
    // The read model stops feeding the queues first: runs in flight end (a sync they wait on is
    // rejected), nothing new arrives, and waiting for idle cannot be kept waiting by new changes.
    this.fleet.stop();
    await this.whenIdle();
    await this.#refreshing;
    await this.#collecting;
    this.probes.stop();
    await this.registry.stop();
    await this.leader.resign();
  }
}
