// Sends fenced commands to host agents over NATS request/reply (R-H6, R-I2) and checks the answer's
// fencing tokens: a result from another epoch or generation is rejected and counted, never applied.
// Command ids are chosen by the caller and are deterministic per step, so a new leader repeating a
// step gets the agent's first answer instead of a second execution (R-R3).
import type { NatsConnection } from '@nats-io/transport-node';
import { Fenced, Unavailable } from '../core/index.ts';
import { AgentSubjects } from '../core/agent-subjects.ts';
import { AgentCommand, AgentCommandResult, CommandOutcome } from '../gen/sandboxfleet/v1/agent.ts';
import type { FleetMetrics } from '../observability/metrics.ts';

export type CommandBody = NonNullable<AgentCommand['command']>;
export type ResultCase = NonNullable<AgentCommandResult['result']>['$case'];
/** The result payload of case C. */
export type ResultOf<C extends ResultCase> = Extract<NonNullable<AgentCommandResult['result']>, { $case: C }>['value'];

export interface AgentTarget {
  readonly hostId: string;
  readonly epoch: number;
  /** 0 for host-scoped commands. */
  readonly generation: number;
}

/**
 * The agent answered REFUSED or FAILED: `reason` is its machine-readable reason (AgentRefusalReason
 * in wire/agent-protocol.ts, or `docker_<reason>`), `detail` the agent's own message, kept whole so
 * it can travel into the event and the group record that report the failure.
 */
export class AgentCommandFailed extends Error {
  override readonly name = 'AgentCommandFailed';
  constructor(
    readonly outcome: 'refused' | 'failed',
    readonly reason: string,
    message: string,
    readonly detail = '',
  ) {
    super(message);
  }
}

export interface AgentPort {
  /** Send one command; resolves with the OK result of the expected case, or throws. */
  send<C extends ResultCase>(target: AgentTarget, commandId: string, body: CommandBody, expect: C, timeoutMs?: number): Promise<ResultOf<C>>;
}

export class NatsAgentClient implements AgentPort {
  constructor(
    private readonly nc: NatsConnection,
    private readonly metrics: FleetMetrics,
    private readonly now: () => number,
    private readonly defaultTimeoutMs: number,
  ) {}

  async send<C extends ResultCase>(target: AgentTarget, commandId: string, body: CommandBody, expect: C, timeoutMs = this.defaultTimeoutMs): Promise<ResultOf<C>> {
    const issued = this.now();
    const command: AgentCommand = {
      commandId,
      hostId: target.hostId,
      hostEpoch: target.epoch,
      placementGeneration: target.generation,
      issuedAtUnixMs: issued,
      deadlineUnixMs: issued + timeoutMs,
      command: body,
    };
    let reply;
    try {
      reply = await this.nc.request(AgentSubjects.commands(target.hostId), AgentCommand.encode(command).finish(), { timeout: timeoutMs });
    } catch (cause) {
      throw new Unavailable('host_unreachable', `host ${target.hostId} did not answer ${body.$case}`, { cause, details: { hostId: target.hostId, command: body.$case } });
    }
    let result: AgentCommandResult;
    try {
      result = AgentCommandResult.decode(reply.data);
    } catch (cause) {
      throw new Unavailable('host_unreachable', `host ${target.hostId} sent an undecodable result`, { cause, details: { hostId: target.hostId } });
    }
    if (result.hostEpoch !== target.epoch || result.commandId !== commandId) {
      // R-H6: an answer from another epoch (a zombie or a newer registration) is not ours to apply.
      this.metrics.fencedReports.inc({ kind: 'command_result' });
      throw new Fenced(result.hostEpoch < target.epoch ? 'stale_epoch' : 'unknown_epoch', `result for ${body.$case} carries epoch ${result.hostEpoch}, expected ${target.epoch}`, {
        details: { hostId: target.hostId, messageEpoch: result.hostEpoch, currentEpoch: target.epoch },
      });
    }
    if (result.outcome !== CommandOutcome.OK) {
      const outcome = result.outcome === CommandOutcome.REFUSED ? 'refused' : 'failed';
      if (result.reason === 'stale_epoch' || result.reason === 'stale_generation') this.metrics.fencedReports.inc({ kind: 'command_refused' });
      throw new AgentCommandFailed(outcome, (result.reason || 'unspecified').slice(0, 128), `${body.$case} on ${target.hostId} ${outcome}: ${result.reason} ${result.message}`.slice(0, 1024), result.message.slice(0, 1024));
    }
    if (result.result?.$case !== expect) {
      throw new AgentCommandFailed('failed', 'unexpected_result', `${body.$case} on ${target.hostId} answered ${result.result?.$case ?? 'nothing'}`);
    }
    return result.result.value as ResultOf<C>;
  }
}
