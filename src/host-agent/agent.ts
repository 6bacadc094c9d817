// The host agent (one per host, R-H1..R-H7): attests its engine and image, registers for an epoch
// naming the group copies it holds, acts on the control plane's verdict for each (delete only on
// the positive proof the verdict carries, R-H6, R-R6), executes fenced commands from the control
// plane, and heartbeats its inventory. Told that its reports are fenced (a zombie back from a
// freeze or partition), it stops taking commands of that epoch and registers again by itself —
// unless the host's live epoch is newer and was certainly not granted to this process (another
// agent process registered the host): then it stands by, taking no work and not registering, until
// that registration ends (DEAD or REMOVED). Registering again at once would fence the other process,
// which would register again in turn: two processes fencing each other in a loop.
// Lifecycle, each state saying what holds in it:
//   NEW         constructed; nothing touched.
//   REGISTERING attested; waiting for a RegistrationAck (retrying with backoff). No commands yet.
//   RUNNING     has an epoch; commands are accepted (fenced) and heartbeats flow.
//   STOPPING    no new commands; in-flight ones finish (bounded); heartbeats stopped.
//   STOPPED     subscription drained; the NATS connection belongs to the caller.
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import type { NatsConnection, Subscription } from '@nats-io/transport-node';
import { AgentSubjects } from '../core/agent-subjects.ts';
import type { DockerRuntime } from '../docker/runtime.ts';
import { AgentCommand, CopyAction, type FencedNotice, type GroupCopy, type Registration, type RegistrationAck } from '../gen/sandboxfleet/v1/agent.ts';
import type { Logger } from '../observability/logger.ts';
import type { FleetMetrics } from '../observability/metrics.ts';
import { setTimeout as sleep } from 'node:timers/promises';
import { ChunkStore } from '../store/chunk-store.ts';
import { workerAuth } from '../store/nats-auth.ts';
import { attest, type Attested } from './attestation.ts';
import { CheckpointOps } from './checkpoint-ops.ts';
import { CommandHandler } from './command-handler.ts';
import { ExecSessions } from './exec-sessions.ts';
import { layerRestoreSettingsOf, natsAuthOf, type HostAgentConfig } from './config.ts';
import { FenceState } from './fencing.ts';
import { GroupOps } from './group-ops.ts';
import { Heartbeater, type NoticeReport } from './heartbeat.ts';
import { HostHealth } from './host-health.ts';
import { AgentMetrics } from './metrics.ts';
import { register } from './registration.ts';
import { startSmallProcessHelper } from './layer/small-process.ts';

export type AgentState = 'NEW' | 'REGISTERING' | 'RUNNING' | 'STOPPING' | 'STOPPED';

export interface HostAgentDeps {
  readonly config: HostAgentConfig;
  /** The caller owns the connection (cmd/ drains it after stop()). */
  readonly nc: NatsConnection;
  readonly runtime: DockerRuntime;
  readonly logger: Logger;
  readonly metrics: FleetMetrics;
  readonly nowMs?: () => number;
}

export class HostAgentError extends Error {
  override readonly name = 'HostAgentError';
  constructor(
    readonly reason: 'image_not_found' | 'image_id_mismatch' | 'data_root_not_visible' | 'data_root_mismatch' | 'invalid_state',
    message: string,
  ) {
    super(message);
  }
}

export class HostAgent {
  readonly instanceId = randomUUID();
  private stateValue: AgentState = 'NEW';
  private readonly fence = new FenceState();
  private readonly agentMetrics: AgentMetrics;
  private readonly nowMs: () => number;
  private readonly log: Logger;
  private attested: Attested | undefined;
  private ack: RegistrationAck | undefined;
  private sub: Subscription | undefined;
  private heartbeater: Heartbeater | undefined;
  private handler: CommandHandler | undefined;
  private health: HostHealth | undefined;
  private execs: ExecSessions | undefined;
  private readonly inflight = new Set<Promise<void>>();
  private readonly abort = new AbortController();
  /** The group copies this host held at its last registration (the verdicts name them). */
  private copies: GroupCopy[] = [];
  /** Told the host left the fleet on purpose: no heartbeats, no commands, until restarted. */
  private retired = false;
  /** A re-registration under way (a fenced notice starts one; repeats join it). */
  private reregistering: Promise<RegistrationAck> | undefined;
  /** Attempts the latest registration took: after one, no other attempt of ours can have been granted later. */
  private registrationAttempts = 0;
  /** The epoch this process holds while another process's newer registration is live (standing by). */
  private supersededEpoch: number | undefined;

  constructor(private readonly deps: HostAgentDeps) {
    this.nowMs = deps.nowMs ?? Date.now;
    this.agentMetrics = new AgentMetrics(deps.metrics);
    this.log = deps.logger.child({ hostId: deps.config.hostId });
  }

  get state(): AgentState {
    return this.stateValue;
  }

  get epoch(): number | undefined {
    return this.fence.epoch;
  }

  get lastAck(): RegistrationAck | undefined {
    return this.ack;
  }

  get attestation(): Attested | undefined {
    return this.attested;
  }

  /** Attest, register (retrying until answered), clean up, then take commands and heartbeat. */
  async start(): Promise<RegistrationAck> {
    if (this.stateValue !== 'NEW') throw new HostAgentError('invalid_state', `start() in state ${this.stateValue}`);
    const { config, runtime, nc } = this.deps;
    this.stateValue = 'REGISTERING';
    // Now, while this process is small: its later tar runs fork the helper, not this process.
    startSmallProcessHelper();
    // Throwaway containers of a crashed predecessor (attestation probes) are ours to sweep.
    await runtime.removeOneshots();
    this.attested = await attest(runtime, config.imageRef, config.agentSha, this.nowMs);
    const imageId = this.attested.probe.imageId;
    if (imageId === '') throw new HostAgentError('image_not_found', `sandbox image ${config.imageRef} is not on this engine`);
    if (config.imageId !== undefined && config.imageId !== imageId) {
      throw new HostAgentError('image_id_mismatch', `${config.imageRef} resolves to ${imageId}, configured pin is ${config.imageId}`);
    }
    const engine = await runtime.engineInfo();
    // Layers are read and written in the engine's data root, and its disappearance is how data loss
    // is seen (R-H5): the agent must see it at the engine's own path (the DaemonSet mounts it so).
    if (config.dockerDataRoot !== undefined && resolve(config.dockerDataRoot) !== resolve(engine.dockerRootDir)) {
      throw new HostAgentError('data_root_mismatch', `the engine's data root is ${engine.dockerRootDir}, configured ${config.dockerDataRoot} (SANDBOXFLEET_DOCKER_DATA_ROOT)`);
    }
    if (!existsSync(engine.dockerRootDir)) {
      throw new HostAgentError('data_root_not_visible', `the engine's data root ${engine.dockerRootDir} is not visible to the agent`);
    }
    const store = await this.openChunkStore();
    // Re-learn placement generations from container labels so fencing survives an agent restart.
    for (const c of await runtime.listMembers()) if (c.member) this.fence.observe(c.member.groupId, c.member.placementGeneration);

    this.health = new HostHealth(runtime, engine.dockerRootDir, config.maxMembers, config.engineFailuresForDataLoss, this.nowMs, () => this.execs?.turnProcesses() ?? []);
    const groups = new GroupOps({ runtime, config, imageId: () => imageId, nowMs: this.nowMs });
    const checkpoints = new CheckpointOps({
      runtime,
      store,
      groups,
      metrics: this.deps.metrics,
      hostId: config.hostId,
      epoch: () => this.fence.epoch ?? 0,
      imageId: () => imageId,
      imageRef: config.imageRef,
      workerConnection: { servers: config.natsUrl.split(','), auth: workerAuth(natsAuthOf(config)) },
      bridgeVersion: () => this.attested?.provenBridgeVersion,
      nowMs: this.nowMs,
      logger: this.log,
      layerRestore: layerRestoreSettingsOf(config),
    });
    this.execs = new ExecSessions({ nc, hostId: config.hostId, runtime, logger: this.log, nowMs: this.nowMs });
    this.handler = new CommandHandler({
      nc,
      hostId: config.hostId,
      agentSha: config.agentSha,
      fence: this.fence,
      groups,
      execs: this.execs,
      checkpoints,
      health: this.health,
      metrics: this.agentMetrics,
      logger: this.log,
      nowMs: this.nowMs,
      admitted: () => this.ack?.admitted === true,
    });
    this.heartbeater = new Heartbeater({
      nc,
      hostId: config.hostId,
      epoch: () => this.fence.epoch,
      health: this.health,
      intervalMs: config.heartbeatIntervalMs,
      reclaimNoticeFile: config.reclaimNoticeFile,
      logger: this.log,
      metrics: this.agentMetrics,
      nowMs: this.nowMs,
    });

    const ack = await this.registerOnce(groups);
    this.subscribe();
    // Running means commands reach us: the server has the subscription once the flush returns (the
    // control plane may send the first command right after the registration it just answered).
    await nc.flush();
    this.stateValue = 'RUNNING';
    this.heartbeater.start();
    this.log.info({ epoch: ack.hostEpoch, admitted: ack.admitted, imageId, bridge: this.attested.provenBridgeVersion }, 'host agent running');
    return ack;
  }

  /**
   * The checkpoint streams, once they exist. The control plane creates them; an agent's credentials
   * may not (R-R5), and an agent may well start first (DaemonSet before Deployment): wait, loudly.
   */
  private async openChunkStore(): Promise<ChunkStore> {
    for (let attempt = 0; ; attempt++) {
      try {
        return await ChunkStore.open(this.deps.nc, { manage: false });
      } catch (err) {
        if (this.abort.signal.aborted) throw err;
        const waitMs = Math.min(this.deps.config.registerMaxBackoffMs, 250 * 2 ** Math.min(attempt, 8));
        this.log.warn({ err, retryInMs: waitMs }, 'checkpoint streams not available yet (the control plane creates them); retrying');
        await sleep(waitMs, undefined, { signal: this.abort.signal }).catch(() => undefined);
      }
    }
  }

  /**
   * Register again (a new epoch; e.g. after the control plane removed this host). Commands of the
   * old epoch are refused from the moment the ack is applied.
   */
  async reregister(): Promise<RegistrationAck> {
    if (this.stateValue !== 'RUNNING') throw new HostAgentError('invalid_state', `reregister() in state ${this.stateValue}`);
    this.reregistering ??= (async () => {
      const { config, runtime } = this.deps;
      const groups = new GroupOps({ runtime, config, imageId: () => this.attested!.probe.imageId, nowMs: this.nowMs });
      const ack = await this.registerOnce(groups);
      await this.heartbeater?.tick();
      return ack;
    })().finally(() => { this.reregistering = undefined; });
    return this.reregistering;
  }

  /**
   * The control plane fenced a report of this agent (R-H6): the epoch it reported with is not the
   * host's live one any more (declared DEAD or REMOVED while this process was frozen or cut off, or
   * a newer registration). Stop acting on commands of that epoch at once, then register again.
   * A notice about an epoch this agent no longer holds is old news and ignored.
   */
  private onFenced(reportedEpoch: number, notice: FencedNotice): void {
    if (this.stateValue !== 'RUNNING' || this.fence.epoch !== reportedEpoch) return;
    this.fence.revoke();
    // Processes started for the fenced epoch must not go on writing into layers.
    this.execs?.cancelAll();
    this.agentMetrics.fencedNotices.inc({ reason: notice.reason.slice(0, 32) || 'unspecified' });
    // A newer epoch is live (not DEAD or REMOVED: those come as host_dead/host_removed). If our last
    // registration was answered at its first attempt, no registration of ours can have been granted
    // after it: another process holds the host. Stand by; heartbeats of the old epoch go on, and
    // the notice that answers them says when that registration has ended.
    if (notice.reason === 'stale_epoch' && notice.currentEpoch > reportedEpoch && this.registrationAttempts === 1) {
      if (this.supersededEpoch === reportedEpoch) return;
      this.supersededEpoch = reportedEpoch;
      this.log.error({ epoch: reportedEpoch, currentEpoch: notice.currentEpoch }, 'superseded: another agent process registered this host with a newer epoch; this one takes no work and stands by until that registration ends');
      return;
    }
    if (notice.reason === 'host_retired') {
      // Drained or removed on purpose: stay out (no commands, no heartbeats) until restarted.
      if (this.retired) return;
      this.retired = true;
      this.log.error({ epoch: reportedEpoch }, 'this host was drained or removed on purpose: no more work; restart the agent to rejoin the fleet');
      void this.heartbeater?.stop();
      return;
    }
    this.log.warn({ epoch: reportedEpoch, currentEpoch: notice.currentEpoch, reason: notice.reason }, 'the control plane fenced this agent\'s epoch: registering again');
    void this.reregister().catch((err: unknown) => this.log.error({ err }, 're-registration after a fenced notice failed'));
  }

  /** A spot/preemption notice (R-H5), e.g. from SIGUSR2 or a metadata watcher. */
  reportReclaimNotice(notice: NoticeReport): void {
    this.heartbeater?.reportReclaim(notice);
  }

  /** Graceful stop: no new commands, in-flight ones finish (bounded), heartbeats end. */
  async stop(): Promise<void> {
    if (this.stateValue === 'STOPPED' || this.stateValue === 'STOPPING') return;
    this.stateValue = 'STOPPING';
    this.abort.abort();
    this.execs?.cancelAll();
    const sub = this.sub;
    this.sub = undefined;
    // drain(): no new messages are delivered; the ones already received are still handled.
    await sub?.drain().catch(() => undefined);
    await this.heartbeater?.stop();
    const pending = Promise.allSettled([...this.inflight]);
    const bounded = new Promise<'timeout'>((r) => setTimeout(() => r('timeout'), this.deps.config.shutdownTimeoutMs).unref());
    if ((await Promise.race([pending, bounded])) === 'timeout') this.log.warn({ inflight: this.inflight.size }, 'shutdown timeout: in-flight commands abandoned');
    this.stateValue = 'STOPPED';
    this.log.info('host agent stopped');
  }

  private registration(): Registration {
    const { config } = this.deps;
    return {
      hostId: config.hostId,
      agentInstanceId: this.instanceId,
      attestation: { ...this.attested!.report },
      capacity: { maxMembers: config.maxMembers, usedMembers: 0, diskFreeBytes: 0, memoryAvailableBytes: 0 },
      requestedLeaseEndUnixMs: config.leaseEndUnixMs,
      sentAtUnixMs: this.nowMs(),
      groupCopies: this.copies,
    };
  }

  /** The groups this host holds containers of, with the newest generation of each (labels). */
  private async groupCopies(): Promise<GroupCopy[]> {
    const newest = new Map<string, number>();
    for (const c of await this.deps.runtime.listMembers()) {
      if (c.member === undefined) continue;
      newest.set(c.member.groupId, Math.max(newest.get(c.member.groupId) ?? 0, c.member.placementGeneration));
    }
    return [...newest].map(([groupId, maxGeneration]) => ({ groupId, maxGeneration })).slice(0, 4096);
  }

  private async registerOnce(groups: GroupOps): Promise<RegistrationAck> {
    const { config } = this.deps;
    this.copies = await this.groupCopies();
    let attempts = 0;
    const ack = await register(this.deps.nc, () => this.registration(), {
      timeoutMs: config.registerTimeoutMs,
      maxBackoffMs: config.registerMaxBackoffMs,
      logger: this.log,
      signal: this.abort.signal,
      onAttempt: (r) => {
        attempts += 1;
        this.agentMetrics.registrations.inc({ result: r });
      },
    });
    this.registrationAttempts = attempts;
    this.supersededEpoch = undefined;
    this.fence.setEpoch(ack.hostEpoch);
    this.ack = ack;
    if (!ack.admitted) {
      this.log.error({ reasons: ack.refusalReasons, mismatches: ack.mismatches }, 'attestation refused: this host takes no work (R-H2)');
      return ack;
    }
    await this.applyVerdicts(groups, ack);
    return ack;
  }

  /**
   * R-H6, R-R6: act on the control plane's verdict for each group copy named at registration. Only a
   * DELETE verdict deletes, and only the generations it names; a copy without a verdict is kept.
   */
  private async applyVerdicts(groups: GroupOps, ack: RegistrationAck): Promise<void> {
    const named = new Set(this.copies.map((c) => c.groupId));
    for (const v of ack.copyVerdicts) {
      if (!named.has(v.groupId)) continue;
      try {
        if (v.action === CopyAction.DELETE) {
          const removed = await groups.delete(v.groupId, v.upToGeneration);
          // The newest generation seen stays known (not forgotten): a command of the new epoch may
          // already have placed a newer one here, and forgetting would let an older command through.
          this.log.warn({ groupId: v.groupId, reason: v.reason, upToGeneration: v.upToGeneration, removed: removed.length }, 'deleted a group copy the control plane proved is not needed');
        } else if (v.action === CopyAction.STOP) {
          const stopped = await groups.stopAll(v.groupId, this.deps.config.defaultStopGraceMs);
          if (stopped.length > 0) this.log.warn({ groupId: v.groupId, reason: v.reason, stopped: stopped.length }, 'stopped the containers of a LOST group; their layers are kept');
        }
      } catch (err) {
        this.log.error({ err, groupId: v.groupId, action: v.action }, 'acting on a group-copy verdict failed; kept as it is');
      }
    }
  }

  private subscribe(): void {
    const { nc, config } = this.deps;
    const handler = this.handler!;
    this.sub = nc.subscribe(AgentSubjects.commands(config.hostId), {
      callback: (err, msg) => {
        if (err) {
          this.log.warn({ err }, 'command subscription error');
          return;
        }
        if (msg.reply === undefined || msg.reply === '') {
          // Published, not requested: only a fenced notice is sent that way.
          this.onNotice(msg.data);
          return;
        }
        const task = handler.handleBytes(msg.data).then(
          (bytes) => {
            if (!msg.reply) {
              this.log.warn('command without reply subject: result not sent');
              return;
            }
            // A connection closed or draining under a late result throws here: said, never an
            // unhandled rejection (the control plane's request times out and is retried).
            try {
              msg.respond(bytes);
            } catch (err) {
              this.log.warn({ err }, 'command result not sent');
            }
          },
          (e: unknown) => this.log.error({ err: e }, 'command handler crashed'),
        );
        const tracked = task.finally(() => this.inflight.delete(tracked));
        this.inflight.add(tracked);
      },
    });
  }

  private onNotice(data: Uint8Array): void {
    let cmd: AgentCommand;
    try {
      cmd = AgentCommand.decode(data);
    } catch (err) {
      this.log.warn({ err }, 'undecodable notice on the command subject');
      return;
    }
    if (cmd.command?.$case !== 'fenced' || cmd.hostId !== this.deps.config.hostId) {
      this.log.warn({ command: cmd.command?.$case }, 'a command without a reply subject: ignored');
      return;
    }
    this.onFenced(cmd.hostEpoch, cmd.command.value);
  }
}
