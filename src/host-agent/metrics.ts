// Agent-side metrics (R-I3), registered on the process's FleetMetrics registry. Fenced commands
// count in the catalogue's `sandboxfleet_fenced_reports_total` (kind="agent_command") so one alert
// covers both directions of R-H6; the rest are agent-specific. No per-group labels.
import { Counter, Histogram } from 'prom-client';
import type { FleetMetrics } from '../observability/metrics.ts';
import { smallProcessHelper } from './layer/small-process.ts';

export class AgentMetrics {
  readonly commands: Counter<'command' | 'outcome' | 'reason'>;
  readonly commandDuration: Histogram<'command'>;
  readonly heartbeats: Counter<'result'>;
  readonly registrations: Counter<'result'>;
  readonly notices: Counter<'source'>;
  /** Fenced notices received from the control plane (each starts a re-registration), by reason. */
  readonly fencedNotices: Counter<'reason'>;
  /** Small runs (layer/small-process.ts) the helper could not take: each forked the agent instead. */
  readonly smallProcessUnavailable: Counter;

  constructor(readonly fleet: FleetMetrics) {
    const registers = [fleet.registry];
    this.commands = new Counter({ name: 'sandboxfleet_agent_commands_total', help: 'Agent commands answered, by command, outcome and reason', labelNames: ['command', 'outcome', 'reason'], registers });
    this.commandDuration = new Histogram({ name: 'sandboxfleet_agent_command_duration_seconds', help: 'Agent command execution time', labelNames: ['command'], buckets: [0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120], registers });
    this.heartbeats = new Counter({ name: 'sandboxfleet_agent_heartbeats_total', help: 'Heartbeats published, by result', labelNames: ['result'], registers });
    this.registrations = new Counter({ name: 'sandboxfleet_agent_registrations_total', help: 'Registration attempts, by result', labelNames: ['result'], registers });
    this.fencedNotices = new Counter({ name: 'sandboxfleet_agent_fenced_notices_total', help: 'Notices that this agent\'s epoch was fenced (each starts a re-registration), by reason', labelNames: ['reason'], registers });
    this.notices = new Counter({ name: 'sandboxfleet_agent_reclaim_notices_total', help: 'Reclaim notices (spot/preemption) published, by source', labelNames: ['source'], registers });
    // Read from the helper's own count at each scrape (the capture code that asks it has no metrics).
    let exported = 0;
    this.smallProcessUnavailable = new Counter({
      name: 'sandboxfleet_agent_small_process_unavailable_total',
      help: 'Short tar runs the small helper process could not take (not started, or died first): each forked the agent instead, slower and blocking its event loop',
      registers,
      collect() {
        const now = smallProcessHelper.unavailable;
        if (now > exported) this.inc(now - exported);
        exported = now;
      },
    });
  }

  fenced(reason: string): void {
    this.fleet.fencedReports.inc({ kind: `agent_command_${reason}` });
  }
}
