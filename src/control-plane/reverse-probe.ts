// Reverse probe responder (R-H7): `verify` sends an agent a ProbeCommand naming the host's own
// callback subject (the only probe subject its NATS credentials may publish to, R-R5); the agent
// sends a ProbeEcho back there. Every replica listens on all probe subjects WITHOUT a queue group,
// and only the replica that issued the nonce answers — so the echo (with the SHAs of the build that
// is actually running) reaches the verifier, and `answered_by` names it.
import type { NatsConnection, Subscription } from '@nats-io/transport-node';
import { AgentSubjects } from '../core/agent-subjects.ts';
import { ProbeEcho, ProbeEchoAck } from '../gen/sandboxfleet/v1/agent.ts';
import type { Logger } from '../observability/logger.ts';

const ALL_PROBES = 'sf.probe.*';

export interface PendingProbe {
  /** Resolves with the echo, or undefined when cancelled. */
  readonly echo: Promise<ProbeEcho | undefined>;
  cancel(): void;
}

export class ProbeResponder {
  readonly #pending = new Map<string, { hostId: string; resolve: (e: ProbeEcho | undefined) => void }>();
  #sub: Subscription | undefined;

  constructor(
    private readonly nc: NatsConnection,
    private readonly replicaId: string,
    private readonly now: () => number,
    private readonly logger: Logger,
  ) {}

  start(): void {
    if (this.#sub !== undefined) return;
    this.#sub = this.nc.subscribe(ALL_PROBES, {
      callback: (err, msg) => {
        if (err) return;
        let echo: ProbeEcho;
        try {
          echo = ProbeEcho.decode(msg.data);
        } catch {
          return;
        }
        const waiter = this.#pending.get(echo.nonce);
        // Another replica's probe (or a stray echo): not ours to answer.
        if (waiter === undefined) return;
        let expectedSubject: string;
        try {
          expectedSubject = AgentSubjects.probeCallback(waiter.hostId);
        } catch {
          return;
        }
        // The echo must come in on the probed host's own subject and name that host.
        if (msg.subject !== expectedSubject || echo.hostId !== waiter.hostId) {
          this.logger.warn({ subject: msg.subject, hostId: echo.hostId, expected: waiter.hostId }, 'probe echo from the wrong host ignored');
          return;
        }
        this.#pending.delete(echo.nonce);
        waiter.resolve(echo);
        msg.respond(ProbeEchoAck.encode({ nonce: echo.nonce, replica: this.replicaId, receivedAtUnixMs: this.now() }).finish());
      },
    });
  }

  /** Register a nonce before sending the ProbeCommand. */
  expect(hostId: string, nonce: string): PendingProbe {
    let resolve!: (e: ProbeEcho | undefined) => void;
    const echo = new Promise<ProbeEcho | undefined>((r) => (resolve = r));
    this.#pending.set(nonce, { hostId, resolve });
    return {
      echo,
      cancel: () => {
        if (this.#pending.get(nonce)?.resolve === resolve) this.#pending.delete(nonce);
        resolve(undefined);
      },
    };
  }

  stop(): void {
    this.#sub?.unsubscribe();
    this.#sub = undefined;
    for (const w of this.#pending.values()) w.resolve(undefined);
    this.#pending.clear();
  }
}
