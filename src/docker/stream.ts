// Docker multiplexes stdout and stderr of a non-TTY container (logs, exec) into one byte stream of
// frames: 8-byte header [stream, 0, 0, 0, size uint32 BE] then payload. This splits such a stream,
// keeping at most `limit` bytes per side so a chatty process cannot exhaust host-agent memory.

export interface DemuxedOutput {
  readonly stdout: string;
  readonly stderr: string;
  /** True when output beyond the limit was dropped. */
  readonly truncated: boolean;
}

const HEADER = 8;

/** Incremental demultiplexer: feed chunks as they arrive, then `result()`. */
export class Demuxer {
  private pending: Buffer = Buffer.alloc(0);
  private readonly out: Buffer[] = [];
  private readonly err: Buffer[] = [];
  private outBytes = 0;
  private errBytes = 0;
  private truncated = false;

  constructor(private readonly limit: number) {}

  push(chunk: Buffer): void {
    this.pending = this.pending.length === 0 ? chunk : Buffer.concat([this.pending, chunk]);
    while (this.pending.length >= HEADER) {
      const kind = this.pending[0];
      const size = this.pending.readUInt32BE(4);
      if (this.pending.length < HEADER + size) break;
      const payload = this.pending.subarray(HEADER, HEADER + size);
      this.pending = this.pending.subarray(HEADER + size);
      if (kind === 2) this.errBytes = this.keep(this.err, this.errBytes, payload);
      else this.outBytes = this.keep(this.out, this.outBytes, payload);
    }
  }

  private keep(into: Buffer[], have: number, payload: Buffer): number {
    const room = this.limit - have;
    if (payload.length > room) this.truncated = true;
    if (room > 0) into.push(Buffer.from(payload.subarray(0, room)));
    return have + Math.min(room, payload.length);
  }

  result(): DemuxedOutput {
    return {
      stdout: Buffer.concat(this.out).toString('utf8'),
      stderr: Buffer.concat(this.err).toString('utf8'),
      truncated: this.truncated,
    };
  }
}

/** Demultiplex a complete buffer (e.g. the body of a non-follow logs request). */
export function demux(buffer: Buffer, limit: number): DemuxedOutput {
  const d = new Demuxer(limit);
  d.push(buffer);
  return d.result();
}

/**
 * Streaming splitter of Docker's multiplexed exec stream for a long-lived process (R-I9): calls
 * `onData(stream, bytes)` with payload pieces as they arrive — a frame's payload is passed on in the
 * pieces the socket delivers, never gathered — so memory stays at one 8-byte header whatever the
 * frame sizes. `stream` is 1 for stdout, 2 for stderr.
 */
export class ExecFrameParser {
  readonly #header = Buffer.alloc(HEADER);
  #headerHave = 0;
  #kind = 1;
  #remaining = 0;

  constructor(private readonly onData: (stream: 1 | 2, bytes: Buffer) => void) {}

  push(chunk: Buffer): void {
    let at = 0;
    while (at < chunk.length) {
      if (this.#remaining === 0) {
        const take = Math.min(HEADER - this.#headerHave, chunk.length - at);
        chunk.copy(this.#header, this.#headerHave, at, at + take);
        this.#headerHave += take;
        at += take;
        if (this.#headerHave < HEADER) return;
        this.#headerHave = 0;
        this.#kind = this.#header[0] === 2 ? 2 : 1;
        this.#remaining = this.#header.readUInt32BE(4);
        continue;
      }
      const take = Math.min(this.#remaining, chunk.length - at);
      this.onData(this.#kind as 1 | 2, chunk.subarray(at, at + take));
      this.#remaining -= take;
      at += take;
    }
  }
}
