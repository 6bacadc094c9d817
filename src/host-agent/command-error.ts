// How a command handler says "no": REFUSED (not attempted, nothing changed on the host) or FAILED
// (attempted; the host may be partially changed and the control plane reconciles from the next
// inventory). `reason` is the machine-readable string the AgentCommandResult carries (R-H6).
import { CommandOutcome } from '../gen/sandboxfleet/v1/agent.ts';

export class CommandError extends Error {
  override readonly name = 'CommandError';
  constructor(
    readonly outcome: CommandOutcome.REFUSED | CommandOutcome.FAILED,
    readonly reason: string,
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

export function refused(reason: string, message: string): CommandError {
  return new CommandError(CommandOutcome.REFUSED, reason, message);
}

export function failed(reason: string, message: string, cause?: unknown): CommandError {
  return new CommandError(CommandOutcome.FAILED, reason, message, cause === undefined ? undefined : { cause });
}
