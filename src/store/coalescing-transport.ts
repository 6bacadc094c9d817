// NATS client transport that gathers every frame written during one turn of the event loop into a
// single socket write (writev), instead of one write per microtask.
//
// Why: nats.js flushes its outbound buffer on a microtask after the first command (protocol.js
// sendCommand), so on a busy control plane each KV compare-and-set usually goes out in its own
// write(2) — ~13% of the control plane's CPU on the turn hot path (issue 5, measured with
// `bench/turns/run.ts --profile`), and one more socket read for nats-server per message. Corking
// the socket on the first frame and uncorking it in setImmediate (the "check" phase, right after
// the poll phase that delivered the gRPC requests and NATS acks that caused the writes) sends
// everything of that loop turn in one writev with no timer: a frame waits at most for the rest of
// the callbacks already queued in this loop turn, never for a clock (unlike Nagle or a flush timer).
//
// Seam: the transport factory is nats.js's public extension point (setTransportFactory, what
// transport-node's own connect() uses); NodeTransport is subclassed only to wrap send().
import { setTransportFactory, NatsConnectionImpl, type NatsConnection, type NodeConnectionOptions } from '@nats-io/transport-node';
// transport-node does not re-export its transport class from the package root; the package has no
// "exports" map, so the deep import is stable for the pinned version.
import { NodeTransport, nodeResolveHost } from '@nats-io/transport-node/lib/node_transport.js';

interface CorkableSocket {
  cork(): void;
  uncork(): void;
  readonly destroyed: boolean;
  readonly writableCorked: number;
}

export class CoalescingTransport extends NodeTransport {
  #corked: CorkableSocket | undefined;

  readonly #uncork = (): void => {
    const s = this.#corked;
    this.#corked = undefined;
    // Uncork only what we corked: a socket replaced or destroyed meanwhile needs nothing.
    if (s !== undefined && !s.destroyed && s.writableCorked > 0) s.uncork();
  };

  override send(frame: Uint8Array): void {
    const socket = (this as unknown as { socket?: CorkableSocket }).socket;
    if (this.#corked === undefined && socket !== undefined && !socket.destroyed) {
      socket.cork();
      this.#corked = socket;
      setImmediate(this.#uncork);
    }
    super.send(frame);
  }

  // close() destroys the socket at once (no flush): hand corked frames to the kernel first, as the
  // uncorked transport would already have done.
  override close(err?: Error): Promise<void> {
    this.#uncork();
    return super.close(err);
  }
}

/** nats.js connect() with the coalescing transport (same options, same behaviour otherwise). */
export function connectCoalescing(opts: NodeConnectionOptions): Promise<NatsConnection> {
  setTransportFactory({ factory: () => new CoalescingTransport(), dnsResolveFn: nodeResolveHost });
  return NatsConnectionImpl.connect(opts);
}
