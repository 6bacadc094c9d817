// Periodic heartbeat (R-H3) on AgentSubjects.heartbeat(hostId): epoch, a sequence that grows within
// the process, inventory and capacity, plus the two "this host is going away" facts the agent can
// see itself (R-H5): Docker data lost, and a spot/preemption notice. Each of those is also
// published once on AgentSubjects.notices(hostId) when it first appears, so the control plane
// need not wait for the next beat. Every notice carries the epoch it is sent under (R-H6: the
// control plane drops one from a revoked epoch), so one that appears before registration is
// published once the agent holds an epoch. Ticks never overlap; a slow engine delays, not stacks, beats.
import { existsSync, readFileSync, statSync } from 'node:fs';
import type { NatsConnection } from '@nats-io/transport-node';
import { AgentSubjects } from '../core/agent-subjects.ts';
import { DOCKER_DATA_LOST_NOTICE } from '../core/host-notice.ts';
import { Heartbeat, ReclaimNotice } from '../gen/sandboxfleet/v1/agent.ts';
import type { Logger } from '../observability/logger.ts';
import type { HostHealth } from './host-health.ts';
import { InventoryElision } from './inventory-elision.ts';
import type { AgentMetrics } from './metrics.ts';

export interface HeartbeaterDeps {
  readonly nc: NatsConnection;
  readonly hostId: string;
  readonly epoch: () => number | undefined;
  readonly health: HostHealth;
  readonly intervalMs: number;
  readonly reclaimNoticeFile: string | undefined;
  readonly logger: Logger;
  readonly metrics: AgentMetrics;
  readonly nowMs: () => number;
}

const MAX_NOTICE_FILE_BYTES = 4096;

/** A reclaim notice as reported to the agent; the epoch is stamped when it is sent. */
export type NoticeReport = Omit<ReclaimNotice, 'hostEpoch'>;

export class Heartbeater {
  private timer: NodeJS.Timeout | undefined;
  private sequence = 0;
  private running: Promise<void> | undefined;
  private notice: NoticeReport | undefined;
  /** The notice went out on the notice subject (it stays in every heartbeat regardless). */
  private noticeAnnounced = false;
  private dataLossAnnounced = false;
  private readonly elision: InventoryElision;

  constructor(private readonly deps: HeartbeaterDeps) {
    this.elision = new InventoryElision();
  }

  start(): void {
    if (this.timer !== undefined) return;
    void this.tick();
    this.timer = setInterval(() => void this.tick(), this.deps.intervalMs);
  }

  async stop(): Promise<void> {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
    await this.running;
  }

  get currentNotice(): NoticeReport | undefined {
    return this.notice;
  }

  /**
   * A reclaim notice from outside (SIGUSR2, a cloud metadata watcher): published now (or, before
   * registration, with the first epoch) and in every beat.
   */
  reportReclaim(notice: NoticeReport): void {
    if (this.notice !== undefined) return;
    this.notice = notice;
    this.announceNotice();
  }

  private announceNotice(): void {
    const epoch = this.deps.epoch();
    if (this.notice === undefined || this.noticeAnnounced || epoch === undefined) return;
    this.noticeAnnounced = true;
    this.publishNotice({ ...this.notice, hostEpoch: epoch });
  }

  /** Send one heartbeat now (also used right after registration). */
  tick(): Promise<void> {
    if (this.running !== undefined) return this.running;
    this.running = this.beat().finally(() => {
      this.running = undefined;
    });
    return this.running;
  }

  private async beat(): Promise<void> {
    const { deps } = this;
    const epoch = deps.epoch();
    if (epoch === undefined) return;
    this.checkNoticeFile();
    this.announceNotice();
    const snap = await deps.health.snapshot();
    if (snap.dataLost && !this.dataLossAnnounced) {
      this.dataLossAnnounced = true;
      deps.logger.error({ reason: snap.dataLostReason }, 'Docker data directory lost (R-H5)');
      this.publishNotice({ source: DOCKER_DATA_LOST_NOTICE, deadlineUnixMs: 0, hostEpoch: epoch });
    }
    this.sequence += 1;
    // Unchanged container entries are left out and named by their digest (inventory-elision.ts).
    const containers = snap.inventory === undefined ? undefined : this.elision.next(epoch, snap.inventory);
    const hb: Heartbeat = {
      hostId: deps.hostId,
      hostEpoch: epoch,
      sequence: this.sequence,
      sentAtUnixMs: deps.nowMs(),
      inventory: containers?.inventory,
      capacity: snap.capacity,
      dockerDataLost: snap.dataLost,
      reclaimNotice: this.notice === undefined ? undefined : { ...this.notice, hostEpoch: epoch },
      containersDigest: containers?.containersDigest ?? Buffer.alloc(0),
      containersOmitted: containers?.containersOmitted ?? false,
    };
    try {
      deps.nc.publish(AgentSubjects.heartbeat(deps.hostId), Heartbeat.encode(hb).finish());
      deps.metrics.heartbeats.inc({ result: snap.inventory === undefined ? 'engine_unreachable' : 'ok' });
    } catch (err) {
      // Not sent: the next beat carries the containers whatever they are.
      this.elision.forget();
      deps.metrics.heartbeats.inc({ result: 'publish_failed' });
      deps.logger.warn({ err }, 'heartbeat publish failed');
    }
  }

  private publishNotice(notice: ReclaimNotice): void {
    this.deps.metrics.notices.inc({ source: notice.source });
    this.deps.logger.warn({ source: notice.source, deadlineUnixMs: notice.deadlineUnixMs, epoch: notice.hostEpoch }, 'publishing reclaim notice (R-H5)');
    try {
      this.deps.nc.publish(AgentSubjects.notices(this.deps.hostId), ReclaimNotice.encode(notice).finish());
    } catch (err) {
      this.deps.logger.warn({ err }, 'notice publish failed; the heartbeat still carries it');
    }
  }

  /**
   * The notice file may hold `{"source": "spot", "deadlineUnixMs": 123}`; any other content means
   * "spot", and so does the source `docker_data_lost`, which only the agent itself may report.
   */
  private checkNoticeFile(): void {
    const file = this.deps.reclaimNoticeFile;
    if (file === undefined || this.notice !== undefined || !existsSync(file)) return;
    let source = 'spot';
    let deadlineUnixMs = 0;
    try {
      if (statSync(file).size <= MAX_NOTICE_FILE_BYTES) {
        const parsed = JSON.parse(readFileSync(file, 'utf8')) as { source?: unknown; deadlineUnixMs?: unknown };
        // `docker_data_lost` is the agent's own finding (it makes the host DEAD at once): an outside
        // watcher's file can only say the machine is going away, never that its data is gone.
        if (typeof parsed.source === 'string' && /^[a-z_]{1,32}$/.test(parsed.source) && parsed.source !== 'docker_data_lost') source = parsed.source;
        if (typeof parsed.deadlineUnixMs === 'number' && Number.isSafeInteger(parsed.deadlineUnixMs) && parsed.deadlineUnixMs > 0) deadlineUnixMs = parsed.deadlineUnixMs;
      }
    } catch {
      // not JSON: the file's presence is the notice
    }
    this.reportReclaim({ source, deadlineUnixMs });
  }
}
