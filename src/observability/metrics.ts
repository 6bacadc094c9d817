// The metric catalogue of R-I3, in one place so names, units and labels stay consistent.
// Each process builds one FleetMetrics on its own prom-client Registry (never the global one),
// so tests and several in-process components do not collide. No per-sandbox ids as labels.
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import { ATTESTATION_REASONS } from '../core/attestation.ts';
import { LOST_SESSION_REASONS, type LostSessionReason } from '../core/loss.ts';

/**
 * The LOST counter, typed so that only a reason of LOST_SESSION_REASONS can be counted: every
 * reason the code can emit is then pre-created at 0 (see the constructor), by construction.
 */
export type LostSessionsCounter = Omit<Counter<'reason'>, 'inc'> & {
  inc(labels: { readonly reason: LostSessionReason }, value?: number): void;
};

/** One host's unprotected groups, as exported per scrape. */
export interface UnprotectedHostSummary {
  readonly hostId: string;
  readonly count: number;
  /** Of `count`, those unprotected for longer than the alert age. */
  readonly longCount: number;
  readonly oldestAgeSeconds: number;
}

export class FleetMetrics {
  readonly registry: Registry;
  /** R-I3: turns by context state (NEW/LIVE/RESTORED/LOST) and CLI kind. */
  readonly turns: Counter<'context_state' | 'cli'>;
  /** R-I3, R-G6: every LOST session, by reason. Alerted on (R-I4). */
  readonly lostSessions: LostSessionsCounter;
  readonly groups: Gauge<'state'>;
  readonly hosts: Gauge<'state'>;
  /**
   * Per registered (not REMOVED) host, computed when scraped from the read model (see
   * setHeartbeatAgeSource); DEAD hosts keep growing.
   */
  readonly heartbeatAge: Gauge<'host'>;
  #heartbeatAges: (() => readonly { readonly hostId: string; readonly ageSeconds: number }[]) | undefined;
  readonly attestationRefusals: Counter<'reason'>;
  readonly checkpointBytes: Counter<'kind'>;
  readonly checkpointDuration: Histogram<'phase'>;
  /**
   * Layer captures by mode and why (host-agent/layer/capture-store.ts CaptureWhy): a fleet whose
   * captures are all full for one reason (every index lost, say) pays a full read per checkpoint,
   * which the durations alone do not explain.
   */
  readonly layerCaptures: Counter<'mode' | 'why'>;
  /**
   * R-G4 exposure, set by the leader's checkpoint retention pass (control-plane/retention.ts): over
   * the clean-STOPPED groups, the age of the checkpoint an unplanned host loss would restore from
   * (the group's latest, if it covers its current state), the oldest of them; 0 when there is none.
   */
  readonly checkpointAge: Gauge<never>;
  /** The configured maximum checkpoint age (R-G4): the stale-checkpoint alert fires at a fraction of it. */
  readonly checkpointMaxAge: Gauge<never>;
  /** Clean-STOPPED groups with no checkpoint covering their current state: LOST (no_checkpoint) if their host dies. */
  readonly groupsWithoutCheckpoint: Gauge<never>;
  readonly migrations: Counter<'result'>;
  readonly migrationDuration: Histogram<'result'>;
  readonly locatorMismatches: Counter<'phase'>;
  /** R-S6 slot reclaims before a RESTORED turn: `restarted`, or `already_gone` when the incarnation had ended. */
  readonly slotReclaims: Counter<'outcome'>;
  /** Checkpoints retaken for groups that stayed cleanly stopped (R-G4 age), by result. */
  readonly checkpointRefreshes: Counter<'result'>;
  readonly fencedReports: Counter<'kind'>;
  /**
   * Heartbeats by how their container entries became known: `decoded` (carried, new bytes),
   * `repeated` (carried, the same bytes as the host's previous ones), `reused` (left out by the
   * agent, digest held), `unknown` (left out, digest not held: unknown until the next full beat).
   */
  readonly heartbeatContainers: Counter<'how'>;
  readonly casConflicts: Counter<'bucket'>;
  /** Checkpoint GC passes by result (swept, deferred: a checkpoint was in progress, idle: nothing due). */
  readonly gcPasses: Counter<'result'>;
  /** What GC deleted: checkpoints (manifest + index) and chunks. */
  readonly gcDeleted: Counter<'kind'>;
  /** Revisions the read model is behind its buckets at the last revision check (0 when caught up). */
  readonly readModelLag: Gauge<never>;
  /** Records the read model holds, and records it keeps aside because they fail validation. */
  readonly readModelRecords: Gauge<'bucket' | 'validity'>;
  /** Verdicts on a registering host's group copies (keep/stop/delete), by reason. */
  readonly hostCopyVerdicts: Counter<'action' | 'reason'>;
  /** Execs through the fleet by how they ended (exited, cancelled, deadline, output_limit, host_fenced, …). */
  readonly execs: Counter<'end'>;
  /** Turns run by the fleet (RunTurn) by CLI and how they ended (succeeded, failed, not_ended). */
  readonly runTurns: Counter<'cli' | 'ended'>;
  /**
   * Unprotected groups (R-G6): running, or stopped without a clean stop and a checkpoint of their
   * state, so LOST if their host dies now; by host, computed when scraped from the read model (see
   * setUnprotectedSource). `_long` counts those unprotected for longer than the configured alert age.
   */
  readonly unprotectedGroups: Gauge<'host'>;
  readonly unprotectedGroupsLong: Gauge<'host'>;
  readonly unprotectedOldestAge: Gauge<'host'>;
  #unprotected: (() => readonly UnprotectedHostSummary[]) | undefined;
  /** Idle auto-stops by result: stopped (clean, then checkpointed), unclean, lost_race (a turn got in first), failed. */
  readonly idleStops: Counter<'result'>;
  /**
   * Spot evacuation of a noticed host (set by the leader): its running groups clean-stopped and
   * checkpointed off the host, by result (saved_before_deadline, saved_after_deadline, lost, pending).
   */
  readonly spotEvacuation: Gauge<'host' | 'result'>;
  /** Keys waiting in a reconciler's queue, and reconciles by result. */
  readonly reconcileQueueDepth: Gauge<'queue'>;
  readonly reconciles: Counter<'queue' | 'result'>;

  constructor(registry: Registry = new Registry(), options: { defaultMetrics?: boolean } = {}) {
    this.registry = registry;
    if (options.defaultMetrics) collectDefaultMetrics({ register: registry, prefix: 'sandboxfleet_process_' });
    const registers = [registry];
    this.turns = new Counter({ name: 'sandboxfleet_turns_total', help: 'Turns begun, by reported context state and CLI kind', labelNames: ['context_state', 'cli'], registers });
    this.lostSessions = new Counter({ name: 'sandboxfleet_lost_sessions_total', help: 'Member sessions declared LOST, by reason', labelNames: ['reason'], registers });
    this.groups = new Gauge({ name: 'sandboxfleet_groups', help: 'Sandbox groups by lifecycle state', labelNames: ['state'], registers });
    this.hosts = new Gauge({ name: 'sandboxfleet_hosts', help: 'Hosts by lifecycle state', labelNames: ['state'], registers });
    // Hosts are bounded (tens to hundreds) and operators need to know which one is silent.
    const ages = (): readonly { readonly hostId: string; readonly ageSeconds: number }[] | undefined => this.#heartbeatAges?.();
    this.heartbeatAge = new Gauge({
      name: 'sandboxfleet_host_heartbeat_age_seconds', help: 'Seconds since the last accepted heartbeat', labelNames: ['host'], registers,
      collect() {
        const now = ages();
        if (now === undefined) return;
        this.reset();
        for (const a of now) this.set({ host: a.hostId }, a.ageSeconds);
      },
    });
    this.attestationRefusals = new Counter({ name: 'sandboxfleet_attestation_refusals_total', help: 'Host attestation refusals, by reason', labelNames: ['reason'], registers });
    this.checkpointBytes = new Counter({ name: 'sandboxfleet_checkpoint_bytes_total', help: 'Checkpoint bytes, by kind (layer = logical, stored = new chunk bytes written, reused_unread = layer bytes of an incremental capture reused without being read; restore_cached, restore_fetched)', labelNames: ['kind'], registers });
    this.layerCaptures = new Counter({ name: 'sandboxfleet_layer_captures_total', help: 'Layer captures of checkpoints, by mode (full, incremental) and why (incremental, or why the capture read everything)', labelNames: ['mode', 'why'], registers });
    this.checkpointDuration = new Histogram({ name: 'sandboxfleet_checkpoint_duration_seconds', help: 'Checkpoint and restore phase durations', labelNames: ['phase'], buckets: [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120], registers });
    this.checkpointAge = new Gauge({ name: 'sandboxfleet_checkpoint_oldest_age_seconds', help: 'Among clean-stopped groups, the oldest age of the checkpoint a host loss would restore from (0: none)', registers });
    this.checkpointMaxAge = new Gauge({ name: 'sandboxfleet_checkpoint_max_age_seconds', help: 'Configured maximum checkpoint age: older checkpoints are never restored from', registers });
    this.groupsWithoutCheckpoint = new Gauge({ name: 'sandboxfleet_stopped_groups_without_checkpoint', help: 'Clean-stopped groups with no checkpoint of their current state (LOST no_checkpoint if their host dies)', registers });
    this.migrations = new Counter({ name: 'sandboxfleet_migrations_total', help: 'Group migrations, by result', labelNames: ['result'], registers });
    this.migrationDuration = new Histogram({ name: 'sandboxfleet_migration_duration_seconds', help: 'Group migration duration', labelNames: ['result'], buckets: [0.5, 1, 2.5, 5, 10, 30, 60, 120, 300], registers });
    this.locatorMismatches = new Counter({ name: 'sandboxfleet_locator_mismatches_total', help: 'Locator mismatches refused, by phase (begin/end)', labelNames: ['phase'], registers });
    this.slotReclaims = new Counter({ name: 'sandboxfleet_member_slot_reclaims_total', help: 'Member containers restarted before a RESTORED turn to end a process whose exit was not confirmed', labelNames: ['outcome'], registers });
    this.checkpointRefreshes = new Counter({ name: 'sandboxfleet_checkpoint_refreshes_total', help: 'Checkpoints retaken for groups that stayed cleanly stopped, before they age past the maximum, by result', labelNames: ['result'], registers });
    this.heartbeatContainers = new Counter({ name: 'sandboxfleet_heartbeat_containers_total', help: 'Heartbeats by how their container entries became known: decoded, repeated (same bytes as before), reused (left out by the agent, digest held), unknown (left out, digest not held)', labelNames: ['how'], registers });
    this.fencedReports = new Counter({ name: 'sandboxfleet_fenced_reports_total', help: 'Agent reports or acks rejected for a stale epoch or placement generation', labelNames: ['kind'], registers });
    this.gcPasses = new Counter({ name: 'sandboxfleet_checkpoint_gc_passes_total', help: 'Checkpoint GC passes, by result (swept, deferred while a checkpoint was in progress, idle)', labelNames: ['result'], registers });
    this.gcDeleted = new Counter({ name: 'sandboxfleet_checkpoint_gc_deleted_total', help: 'Checkpoints and chunks deleted by checkpoint GC', labelNames: ['kind'], registers });
    this.execs = new Counter({ name: 'sandboxfleet_execs_total', help: 'Processes run in member containers through the fleet, by how they ended', labelNames: ['end'], registers });
    this.runTurns = new Counter({ name: 'sandboxfleet_run_turns_total', help: 'Turns run by the fleet (RunTurn), by CLI kind and how they ended', labelNames: ['cli', 'ended'], registers });
    this.readModelLag = new Gauge({ name: 'sandboxfleet_read_model_lag_revisions', help: 'Revisions the read model is behind its buckets at the last check (0: caught up)', registers });
    this.readModelRecords = new Gauge({ name: 'sandboxfleet_read_model_records', help: 'Records in the read model by bucket, and records kept aside as invalid', labelNames: ['bucket', 'validity'], registers });
    this.hostCopyVerdicts = new Counter({ name: 'sandboxfleet_host_copy_verdicts_total', help: 'Verdicts on group copies a registering host holds (keep, stop, delete), by reason', labelNames: ['action', 'reason'], registers });
    const unprotected = (): readonly UnprotectedHostSummary[] | undefined => this.#unprotected?.();
    // One source call per scrape feeds all three gauges (the first collected computes, the others reuse).
    let lastSummary: { at: number; rows: readonly UnprotectedHostSummary[] } | undefined;
    const summary = (): readonly UnprotectedHostSummary[] | undefined => {
      const t = Date.now();
      if (lastSummary === undefined || t - lastSummary.at > 100) {
        const rows = unprotected();
        if (rows === undefined) return undefined;
        lastSummary = { at: t, rows };
      }
      return lastSummary.rows;
    };
    const perHost = (name: string, help: string, pick: (r: UnprotectedHostSummary) => number): Gauge<'host'> => new Gauge({
      name, help, labelNames: ['host'], registers,
      collect() {
        const rows = summary();
        if (rows === undefined) return;
        this.reset();
        for (const r of rows) this.set({ host: r.hostId }, pick(r));
      },
    });
    this.unprotectedGroups = perHost('sandboxfleet_unprotected_groups', 'Groups a loss of their host would make LOST now (running, or stopped without a clean stop and a checkpoint of their state), by host', (r) => r.count);
    this.unprotectedGroupsLong = perHost('sandboxfleet_unprotected_groups_long', 'Unprotected groups that have been so for longer than the configured alert age, by host', (r) => r.longCount);
    this.unprotectedOldestAge = perHost('sandboxfleet_unprotected_group_oldest_age_seconds', 'How long the longest-unprotected group on the host has been unprotected', (r) => r.oldestAgeSeconds);
    this.idleStops = new Counter({ name: 'sandboxfleet_idle_stops_total', help: 'Idle auto-stops by result (stopped: clean and checkpointed, unclean, lost_race: a turn got in first, failed)', labelNames: ['result'], registers });
    this.spotEvacuation = new Gauge({ name: 'sandboxfleet_spot_evacuation_groups', help: 'Groups of a host under a spot notice by result: clean-stopped and checkpointed before or after the notice deadline, lost, pending', labelNames: ['host', 'result'], registers });
    this.reconcileQueueDepth = new Gauge({ name: 'sandboxfleet_reconcile_queue_depth', help: 'Keys waiting in a reconcile queue (ready, parked or running)', labelNames: ['queue'], registers });
    this.reconciles = new Counter({ name: 'sandboxfleet_reconciles_total', help: 'Reconciles by queue and result (ok, error)', labelNames: ['queue', 'result'], registers });
    this.casConflicts = new Counter({ name: 'sandboxfleet_state_cas_conflicts_total', help: 'Compare-and-set conflicts on state writes, by bucket', labelNames: ['bucket'], registers });
    // Alerts use increase(); a labelled series that first appears at 1 shows no increase, so the
    // first LOST (or refusal) of a reason after a restart would never page. Export every known
    // reason at 0 from the start.
    for (const reason of LOST_SESSION_REASONS) this.lostSessions.inc({ reason }, 0);
    for (const reason of ATTESTATION_REASONS) this.attestationRefusals.inc({ reason }, 0);
    for (const result of ['swept', 'deferred', 'idle']) this.gcPasses.inc({ result }, 0);
    for (const result of ['stopped', 'unclean', 'lost_race', 'failed']) this.idleStops.inc({ result }, 0);
    // The dashboard's migration and checkpoint panels read these on every replica: a series observed
    // only on the replica that did the work (and lost with it when that pod goes) would leave them
    // empty. Exported at 0 from the start, like the reasons above.
    for (const result of ['succeeded', 'lost', 'checkpoint_refused', 'restore_failed']) this.migrations.inc({ result }, 0);
    this.migrationDuration.zero({ result: 'succeeded' });
    for (const phase of ['capture', 'checkpoint', 'restore', 'restore_validate']) this.checkpointDuration.zero({ phase });
    for (const kind of ['layer', 'stored', 'reused_unread']) this.checkpointBytes.inc({ kind }, 0);
    for (const [mode, why] of [['full', 'no_index'], ['incremental', 'incremental']] as const) this.layerCaptures.inc({ mode, why }, 0);
  }

  /**
   * Where scrapes read heartbeat ages from (the control plane's read model: every registered host,
   * REMOVED and deleted ones excluded, so the missing-heartbeat alert stops for a host that left).
   */
  setHeartbeatAgeSource(source: () => readonly { readonly hostId: string; readonly ageSeconds: number }[]): void {
    this.#heartbeatAges = source;
  }

  /** Where scrapes read the unprotected groups per host from (the control plane's read model). */
  setUnprotectedSource(source: () => readonly UnprotectedHostSummary[]): void {
    this.#unprotected = source;
  }

  /**
   * This replica is no longer the leader: drop what only the leader's loops keep current, so a
   * deposed replica does not export a frozen value next to the new leader's (alerts read max()).
   */
  leadershipLost(): void {
    this.hosts.reset();
    this.groups.reset();
    this.checkpointAge.set(0);
    this.groupsWithoutCheckpoint.set(0);
    this.spotEvacuation.reset();
  }
}
