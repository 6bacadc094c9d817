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
// A connection may also ask for BATCHED READS (`readBatchMs`): after its socket
// delivers data it is paused for that long, so everything that arrived meanwhile is read in one go.
// For a connection that only takes in a steady stream nobody waits on (the control plane's
// heartbeats): on this kind of machine each wake-up of the process costs ~0.2 ms of CPU whatever
// it reads (an empty nats.js subscriber at 100 wake-ups a second: 3.2% of a core; raw socket 2.3%,
// read every 100 ms 1.0%), so 1,000 hosts beating every 2 s cost the control plane hundreds of
// wake-ups a second before any of its own code runs.
// Seam: the transport factory is nats.js's public extension point (setTransportFactory, what
// transport-node's own connect() uses); NodeTransport is subclassed only to wrap send(), connect()
// and close(). The factory is global, so the option rides on the connection's own options, which
// nats.js hands to its transport on every (re)connect.
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

interface PausableSocket {
  pause(): void;
  resume(): void;
  on(event: 'data', listener: () => void): void;
  readonly destroyed: boolean;
}

/** The connection option (passed through nats.js's own options) asking for batched reads. */
export interface BatchedReadOptions {
  /** Pause the socket this long after each read (0 or absent: read as data arrives). */
  readonly readBatchMs?: number;
}

export class CoalescingTransport extends NodeTransport {
  #corked: CorkableSocket | undefined;
  #resumeTimer: NodeJS.Timeout | undefined;
  /** A pause is scheduled or under way (reads batched). */
  #resting = false;

  override async connect(hp: Parameters<NodeTransport['connect']>[0], options: Parameters<NodeTransport['connect']>[1]): Promise<void> {
    await super.connect(hp, options);
    const batchMs = (options as BatchedReadOptions).readBatchMs ?? 0;
    const socket = (this as unknown as { socket?: PausableSocket }).socket;
    if (batchMs > 0 && socket !== undefined) this.#batchReads(socket, batchMs);
  }

  /**
   * After the reads of one poll phase the socket rests `batchMs`. The pause waits for setImmediate
   * (the check phase): libuv goes on reading while data is there (64 KiB a read), so everything that
   * piled up meanwhile is read before the next rest. Pausing at the first read would let through
   * 64 KiB per interval and leave the rest to pile up (measured: a control plane taking in 1 MB/s of
   * inventories fell behind, and the server dropped it as a slow consumer).
   */
  #batchReads(socket: PausableSocket, batchMs: number): void {
    socket.on('data', () => {
      if (this.#resting || socket.destroyed) return;
      this.#resting = true;
      setImmediate(() => {
        if (socket.destroyed) return;
        socket.pause();
        this.#resumeTimer = setTimeout(() => {
          this.#resumeTimer = undefined;
          this.#resting = false;
          if (!socket.destroyed) socket.resume();
        }, batchMs);
      });
    });
  }

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
    clearTimeout(this.#resumeTimer);
    this.#resumeTimer = undefined;
    this.#uncork();
    return super.close(err);
  }
}

/** nats.js connect() with the coalescing transport (same options, same behaviour otherwise). */
export function connectCoalescing(opts: NodeConnectionOptions & BatchedReadOptions): Promise<NatsConnection> {
  setTransportFactory({ factory: () => new CoalescingTransport(), dnsResolveFn: nodeResolveHost });
  return NatsConnectionImpl.connect(opts);
}
