// The metric catalogue of SPEC R-I3, in one place so names, units and labels stay consistent.
// Each process builds one FleetMetrics on its own prom-client Registry (never the global one),
// so tests and several in-process components do not collide. No per-sandbox ids as labels.
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import { ATTESTATION_REASONS } from '../core/attestation.ts';
import { LOSS_REASONS } from '../core/loss.ts';

export class FleetMetrics {
  readonly registry: Registry;
  /** R-I3: turns by context state (NEW/LIVE/RESTORED/LOST) and CLI kind. */
  readonly turns: Counter<'context_state' | 'cli'>;
  /** R-I3, R-G6: every LOST session, by reason. Alerted on (R-I4). */
  readonly lostSessions: Counter<'reason'>;
  readonly groups: Gauge<'state'>;
  readonly hosts: Gauge<'state'>;
  readonly heartbeatAge: Gauge<'host'>;
  readonly attestationRefusals: Counter<'reason'>;
  readonly checkpointBytes: Counter<'kind'>;
  readonly checkpointDuration: Histogram<'phase'>;
  readonly checkpointAge: Gauge<never>;
  readonly migrations: Counter<'result'>;
  readonly migrationDuration: Histogram<'result'>;
  readonly locatorMismatches: Counter<'phase'>;
  readonly fencedReports: Counter<'kind'>;
  readonly casConflicts: Counter<'bucket'>;
  /** Checkpoint GC passes by result (swept, deferred: a checkpoint was in progress, idle: nothing due). */
  readonly gcPasses: Counter<'result'>;
  /** What GC deleted: checkpoints (manifest + index) and chunks. */
  readonly gcDeleted: Counter<'kind'>;

  constructor(registry: Registry = new Registry(), options: { defaultMetrics?: boolean } = {}) {
    this.registry = registry;
    if (options.defaultMetrics) collectDefaultMetrics({ register: registry, prefix: 'sandboxfleet_process_' });
    const registers = [registry];
    this.turns = new Counter({ name: 'sandboxfleet_turns_total', help: 'Turns begun, by reported context state and CLI kind', labelNames: ['context_state', 'cli'], registers });
    this.lostSessions = new Counter({ name: 'sandboxfleet_lost_sessions_total', help: 'Member sessions declared LOST, by reason', labelNames: ['reason'], registers });
    this.groups = new Gauge({ name: 'sandboxfleet_groups', help: 'Sandbox groups by lifecycle state', labelNames: ['state'], registers });
    this.hosts = new Gauge({ name: 'sandboxfleet_hosts', help: 'Hosts by lifecycle state', labelNames: ['state'], registers });
    // Hosts are bounded (tens to hundreds) and operators need to know which one is silent.
    this.heartbeatAge = new Gauge({ name: 'sandboxfleet_host_heartbeat_age_seconds', help: 'Seconds since the last accepted heartbeat', labelNames: ['host'], registers });
    this.attestationRefusals = new Counter({ name: 'sandboxfleet_attestation_refusals_total', help: 'Host attestation refusals, by reason', labelNames: ['reason'], registers });
    this.checkpointBytes = new Counter({ name: 'sandboxfleet_checkpoint_bytes_total', help: 'Checkpoint bytes, by kind (layer = logical, stored = new chunk bytes written)', labelNames: ['kind'], registers });
    this.checkpointDuration = new Histogram({ name: 'sandboxfleet_checkpoint_duration_seconds', help: 'Checkpoint and restore phase durations', labelNames: ['phase'], buckets: [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120], registers });
    this.checkpointAge = new Gauge({ name: 'sandboxfleet_checkpoint_oldest_age_seconds', help: 'Age of the oldest newest-checkpoint among stopped groups', registers });
    this.migrations = new Counter({ name: 'sandboxfleet_migrations_total', help: 'Group migrations, by result', labelNames: ['result'], registers });
    this.migrationDuration = new Histogram({ name: 'sandboxfleet_migration_duration_seconds', help: 'Group migration duration', labelNames: ['result'], buckets: [0.5, 1, 2.5, 5, 10, 30, 60, 120, 300], registers });
    this.locatorMismatches = new Counter({ name: 'sandboxfleet_locator_mismatches_total', help: 'Locator mismatches refused, by phase (begin/end)', labelNames: ['phase'], registers });
    this.fencedReports = new Counter({ name: 'sandboxfleet_fenced_reports_total', help: 'Agent reports or acks rejected for a stale epoch or placement generation', labelNames: ['kind'], registers });
    this.gcPasses = new Counter({ name: 'sandboxfleet_checkpoint_gc_passes_total', help: 'Checkpoint GC passes, by result (swept, deferred while a checkpoint was in progress, idle)', labelNames: ['result'], registers });
    this.gcDeleted = new Counter({ name: 'sandboxfleet_checkpoint_gc_deleted_total', help: 'Checkpoints and chunks deleted by checkpoint GC', labelNames: ['kind'], registers });
    this.casConflicts = new Counter({ name: 'sandboxfleet_state_cas_conflicts_total', help: 'Compare-and-set conflicts on state writes, by bucket', labelNames: ['bucket'], registers });
    // Alerts use increase(); a labelled series that first appears at 1 shows no increase, so the
    // first LOST (or refusal) of a reason after a restart would never page. Export every known
    // reason at 0 from the start.
    for (const reason of LOSS_REASONS) this.lostSessions.inc({ reason }, 0);
    for (const reason of ATTESTATION_REASONS) this.attestationRefusals.inc({ reason }, 0);
    for (const result of ['swept', 'deferred', 'idle']) this.gcPasses.inc({ result }, 0);
  }

  /** A host left the fleet: drop its heartbeat-age series so the missing-heartbeat alert stops. */
  forgetHost(hostId: string): void {
    this.heartbeatAge.remove({ host: hostId });
  }
}
