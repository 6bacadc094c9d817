// Reads newline-delimited JSON from a CLI's stdout (Claude stream-json, Codex app-server, Pi) into
// values for a detector (R-R4): lines are bounded, malformed or oversized lines are counted and
// skipped, stream errors become an outcome, and nothing here ever throws at the caller. A long-lived
// process keeps its stream across turns, so a read can stop at the turn end without destroying the
// stream and without losing lines already received for the next turn (they stay in the decoder).

import type { Readable } from 'node:stream';
import { StringDecoder } from 'node:string_decoder';

/** Default longest line: 8 Mi characters (a tool result can be large; a runaway line is not). */
export const DEFAULT_MAX_LINE_CHARS = 8 * 1024 * 1024;

export interface JsonLineStats {
  /** Non-blank lines seen (including malformed and oversized ones). */
  readonly lines: number;
  /** Lines parsed into a value. */
  readonly values: number;
  /** Lines that were not valid JSON, or chunks that were not text. */
  readonly malformed: number;
  /** Lines longer than the bound, dropped whole. */
  readonly oversized: number;
}

/** Incremental splitter and parser; keep one per stream so partial lines survive between reads. */
export class JsonLineDecoder {
  private readonly max: number;
  private readonly text = new StringDecoder('utf8');
  private partial = '';
  /** Dropping the rest of an oversized line until its newline. */
  private skipping = false;
  private pending: string[] = [];
  private head = 0;
  private counts = { lines: 0, values: 0, malformed: 0, oversized: 0 };

  constructor(options: { maxLineChars?: number } = {}) {
    const max = options.maxLineChars ?? DEFAULT_MAX_LINE_CHARS;
    this.max = Number.isSafeInteger(max) && max > 0 ? max : DEFAULT_MAX_LINE_CHARS;
  }

  get stats(): JsonLineStats {
    return { ...this.counts };
  }

  /** Adds a chunk; complete lines become available through next(). */
  push(chunk: unknown): void {
    let s: string;
    if (typeof chunk === 'string') s = chunk;
    else if (chunk instanceof Uint8Array) s = this.text.write(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk));
    else {
      this.counts.malformed += 1;
      return;
    }
    let start = 0;
    for (let nl = s.indexOf('\n', start); nl !== -1; nl = s.indexOf('\n', start)) {
      const piece = s.slice(start, nl);
      start = nl + 1;
      if (this.skipping) {
        this.skipping = false;
        this.partial = '';
        continue;
      }
      const line = this.partial + piece;
      this.partial = '';
      if (line.length > this.max) this.oversize();
      else this.pending.push(line);
    }
    if (this.skipping) return;
    this.partial += s.slice(start);
    if (this.partial.length > this.max) {
      this.partial = '';
      this.skipping = true;
      this.oversize();
    }
  }

  /** The stream ended: a last line without a newline still counts. */
  end(): void {
    const rest = this.text.end();
    if (rest.length > 0) this.push(rest);
    if (!this.skipping && this.partial.length > 0) this.pending.push(this.partial);
    this.partial = '';
    this.skipping = false;
  }

  /** Next parsed value, or undefined when no complete line is waiting. Skips bad lines. */
  next(): { value: unknown } | undefined {
    while (this.head < this.pending.length) {
      const raw = this.pending[this.head] ?? '';
      this.head += 1;
      if (this.head === this.pending.length) {
        this.pending = [];
        this.head = 0;
      }
      const line = raw.endsWith('\r') ? raw.slice(0, -1) : raw;
      if (line.trim().length === 0) continue;
      this.counts.lines += 1;
      try {
        const value: unknown = JSON.parse(line);
        this.counts.values += 1;
        return { value };
      } catch {
        this.counts.malformed += 1;
      }
    }
    return undefined;
  }

  private oversize(): void {
    this.counts.lines += 1;
    this.counts.oversized += 1;
  }
}

/** Why a read returned. */
export type ReadOutcome = 'stopped' | 'ended' | 'closed' | 'error' | 'aborted';

export interface ReadJsonLinesOptions {
  /** Reuse across reads of one long-lived stream; a fresh one is made otherwise. */
  readonly decoder?: JsonLineDecoder;
  readonly maxLineChars?: number;
  /** Checked after every value; when true the read stops and the stream is paused, not destroyed. */
  readonly stopWhen?: () => boolean;
  /** Aborting stops the read with outcome `aborted`; the stream is paused, not destroyed. */
  readonly signal?: AbortSignal;
}

export interface ReadJsonLinesResult {
  readonly outcome: ReadOutcome;
  /** Error text for `error` (stream error, or a throwing onValue). */
  readonly error?: string;
  readonly stats: JsonLineStats;
}

/**
 * Feeds each JSON line of `source` to `onValue` until `stopWhen()` holds, the stream ends, fails or
 * closes, or `signal` aborts. Resolves in every case; never rejects.
 */
export function readJsonLines(source: Readable, onValue: (value: unknown) => void, options: ReadJsonLinesOptions = {}): Promise<ReadJsonLinesResult> {
  const decoder = options.decoder ?? new JsonLineDecoder(options.maxLineChars !== undefined ? { maxLineChars: options.maxLineChars } : {});
  const stopWhen = options.stopWhen ?? (() => false);
  const signal = options.signal;

  return new Promise<ReadJsonLinesResult>((resolve) => {
    let done = false;
    const finish = (outcome: ReadOutcome, error?: string): void => {
      if (done) return;
      done = true;
      source.off('data', onData);
      source.off('end', onEnd);
      source.off('error', onError);
      source.off('close', onClose);
      signal?.removeEventListener('abort', onAbort);
      if (outcome === 'stopped' || outcome === 'aborted') source.pause();
      resolve({ outcome, ...(error !== undefined ? { error } : {}), stats: decoder.stats });
    };
    /** Hands waiting values over; true when the read is finished. */
    const drain = (): boolean => {
      for (let v = decoder.next(); v !== undefined; v = decoder.next()) {
        try {
          onValue(v.value);
        } catch (err) {
          finish('error', `onValue threw: ${err instanceof Error ? err.message : String(err)}`.slice(0, 1024));
          return true;
        }
        if (stopWhen()) {
          finish('stopped');
          return true;
        }
      }
      return false;
    };
    const onData = (chunk: unknown): void => {
      if (done) return;
      decoder.push(chunk);
      drain();
    };
    const onEnd = (): void => {
      if (done) return;
      decoder.end();
      if (!drain()) finish('ended');
    };
    const onError = (err: unknown): void => finish('error', (err instanceof Error ? err.message : String(err)).slice(0, 1024));
    const onClose = (): void => {
      if (done) return;
      decoder.end();
      if (!drain()) finish('closed');
    };
    const onAbort = (): void => finish('aborted');

    // Lines left over from an earlier read of this stream come first.
    if (stopWhen()) return finish('stopped');
    if (drain()) return;
    if (signal?.aborted === true) return finish('aborted');
    if (source.readableEnded) {
      decoder.end();
      if (!drain()) finish('ended');
      return;
    }
    if (source.destroyed) {
      const err = source.errored;
      return finish(err !== null && err !== undefined ? 'error' : 'closed', err?.message);
    }
    signal?.addEventListener('abort', onAbort, { once: true });
    source.on('data', onData);
    source.on('end', onEnd);
    source.on('error', onError);
    source.on('close', onClose);
    source.resume();
  });
}
