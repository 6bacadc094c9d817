// Registration (R-H1, R-H4, R-H6): request/reply on AgentSubjects.register with the attested facts;
// the RegistrationAck carries the new epoch (fencing token), the lease term and the groups this
// host still owns. With no control plane answering (NATS up, no responder; or a timeout) the agent
// retries with capped exponential backoff until it is stopped: a host must not give up on joining.
import { ExponentialBackoff, handleAll, retry } from 'cockatiel';
import type { NatsConnection } from '@nats-io/transport-node';
import { AgentSubjects } from '../core/agent-subjects.ts';
import { Registration, RegistrationAck } from '../gen/sandboxfleet/v1/agent.ts';
import type { Logger } from '../observability/logger.ts';

export class RegistrationError extends Error {
  override readonly name = 'RegistrationError';
  constructor(
    readonly reason: 'ack_invalid' | 'ack_wrong_host' | 'cancelled',
    message: string,
  ) {
    super(message);
  }
}

export interface RegisterOptions {
  readonly timeoutMs: number;
  readonly maxBackoffMs: number;
  readonly logger: Logger;
  readonly signal?: AbortSignal;
  readonly onAttempt?: (result: 'ok' | 'error') => void;
}

/** Check an ack before the agent acts on it (it decides epochs and deletions). */
export function validateAck(ack: RegistrationAck, hostId: string): void {
  if (ack.hostId !== hostId) throw new RegistrationError('ack_wrong_host', `ack is for host ${ack.hostId}, not ${hostId}`);
  if (!Number.isSafeInteger(ack.hostEpoch) || ack.hostEpoch <= 0) throw new RegistrationError('ack_invalid', `ack carries epoch ${ack.hostEpoch}`);
  if (ack.copyVerdicts.length > 4096) throw new RegistrationError('ack_invalid', 'ack carries too many group-copy verdicts');
  for (const v of ack.copyVerdicts) {
    if (!Number.isSafeInteger(v.upToGeneration) || v.upToGeneration < 0) throw new RegistrationError('ack_invalid', `verdict for ${v.groupId.slice(0, 64)} names generation ${v.upToGeneration}`);
  }
}

/** Send a registration and wait for the ack, retrying forever (until `signal` aborts). */
export async function register(nc: NatsConnection, registration: () => Registration, options: RegisterOptions): Promise<RegistrationAck> {
  const policy = retry(handleAll, {
    maxAttempts: Number.MAX_SAFE_INTEGER,
    backoff: new ExponentialBackoff({ initialDelay: 200, maxDelay: options.maxBackoffMs }),
  });
  policy.onRetry(({ delay, ...reason }) => {
    const err = 'error' in reason ? reason.error : undefined;
    options.logger.warn({ err: err instanceof Error ? err.message : err, retryInMs: Math.round(delay) }, 'registration not answered; retrying');
  });
  try {
    return await policy.execute(async () => {
      const reg = registration();
      try {
        const reply = await nc.request(AgentSubjects.register, Registration.encode(reg).finish(), { timeout: options.timeoutMs });
        const ack = RegistrationAck.decode(reply.data);
        validateAck(ack, reg.hostId);
        options.onAttempt?.('ok');
        return ack;
      } catch (err) {
        options.onAttempt?.('error');
        throw err;
      }
    }, options.signal);
  } catch (err) {
    if (options.signal?.aborted) throw new RegistrationError('cancelled', 'registration cancelled by shutdown');
    throw err;
  }
}
