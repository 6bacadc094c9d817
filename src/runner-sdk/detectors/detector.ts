// The turn-end detector contract and the bookkeeping every CLI detector shares (R-S5): the first
// native end wins, transport events are recorded but never count as a native end, the first root
// locator is kept and a different one is flagged instead of replacing it (R-S2, R-S4).

import {
  DEFAULT_MAX_TEXT_CHARS,
  MAX_ERROR_CHARS,
  type CliKind,
  type LocatorConflict,
  type NativeEndKind,
  type TransportKind,
  type TurnEndEvidence,
} from '../evidence.ts';
import { clip, isId } from './shape.ts';

/**
 * Reads one CLI's native events for ONE turn and says how that turn ended. Feed it every event the
 * CLI emits during the turn (already parsed from JSON lines, SSE or JSON-RPC) and every transport
 * incident the driver sees; ask for `result()` whenever a decision is needed. Never throws on input.
 */
export interface TurnEndDetector {
  readonly cli: CliKind;
  /** True once the CLI reported the end of this turn; the driver may stop reading. */
  readonly nativeTurnEnded: boolean;
  /** One native event. Malformed or unrelated events are counted and ignored. */
  observe(event: unknown): void;
  /** A transport incident. Recorded as evidence; never a native turn end (R-S5). */
  onTransport(kind: TransportKind, detail?: string): void;
  /** Snapshot of the evidence so far. */
  result(): TurnEndEvidence;
}

/** Options every detector takes. */
export interface DetectorOptions {
  /** The locator the driver resumed (BeginTurn's locator); a different reported id is a conflict. */
  readonly expectedLocator?: string;
  /** Bound of the collected assistant text (default 256 KiB). */
  readonly maxTextChars?: number;
}

/** A detector was built with options it cannot work with (a programming error, not bad input). */
export class DetectorOptionError extends Error {
  readonly reason = 'invalid_argument';
  constructor(message: string) {
    super(message);
    this.name = 'DetectorOptionError';
  }
}

interface NativeEnd {
  readonly kind: NativeEndKind;
  readonly succeeded: boolean;
  readonly error?: string;
  readonly nativeTurnId?: string;
}

/** Shared state of one turn; each CLI detector owns one and feeds it what its events mean. */
export class TurnTracker {
  readonly maxTextChars: number;
  private end: NativeEnd | undefined;
  private firstTransport: { kind: TransportKind; detail?: string } | undefined;
  private closed = false;
  private disconnected = false;
  private locator: string | undefined;
  private conflict: LocatorConflict | undefined;
  private readonly expected: string | undefined;
  processWillExit = false;
  events = 0;
  ignored = 0;
  invalid = 0;

  constructor(readonly cli: CliKind, options: DetectorOptions = {}) {
    this.expected = isId(options.expectedLocator) ? options.expectedLocator : undefined;
    const max = options.maxTextChars ?? DEFAULT_MAX_TEXT_CHARS;
    this.maxTextChars = Number.isSafeInteger(max) && max >= 0 ? max : DEFAULT_MAX_TEXT_CHARS;
  }

  get nativeTurnEnded(): boolean {
    return this.end !== undefined;
  }

  /**
   * Whether native events still matter: not after the native end (first end wins), and not after a
   * disconnect or rejection that came first (the stream is gone or the command never ran, so later
   * events cannot belong to this turn). A timeout or cancellation keeps listening: the CLI may still
   * confirm the end natively (e.g. Codex `turn/completed` with status `interrupted`).
   */
  get open(): boolean {
    return this.end === undefined && !this.closed;
  }

  /** The root locator kept so far. */
  get observedLocator(): string | undefined {
    return this.locator;
  }

  /** Records a native end; ignored if one was already recorded. */
  endNative(kind: NativeEndKind, succeeded: boolean, error?: string, nativeTurnId?: string): void {
    if (this.end !== undefined) return;
    this.end = {
      kind,
      succeeded,
      ...(succeeded ? {} : { error: clip(error ?? `${kind} reported a failure`, MAX_ERROR_CHARS) }),
      ...(nativeTurnId !== undefined ? { nativeTurnId } : {}),
    };
  }

  transport(kind: TransportKind, detail?: string): void {
    if (kind === 'disconnect') this.disconnected = true;
    if (this.firstTransport === undefined) {
      this.firstTransport = { kind, ...(detail !== undefined ? { detail: clip(String(detail), MAX_ERROR_CHARS) } : {}) };
    }
    if (this.end === undefined && (kind === 'disconnect' || kind === 'rejected')) this.closed = true;
  }

  /**
   * Offers a root session id. The first valid one is kept; a different later one (or one other than
   * the resumed locator) is flagged as a conflict and never replaces it (R-S2, R-S4).
   */
  noteLocator(candidate: string): void {
    if (!isId(candidate)) {
      this.invalid += 1;
      return;
    }
    if (this.expected !== undefined && candidate !== this.expected) {
      this.conflict ??= { kept: this.expected, other: candidate, source: 'expected' };
    }
    if (this.locator === undefined) {
      this.locator = candidate;
    } else if (candidate !== this.locator) {
      this.conflict ??= { kept: this.locator, other: candidate, source: 'observed' };
    }
  }

  evidence(assistantText?: string): TurnEndEvidence {
    const end = this.end;
    const t = this.firstTransport;
    const base = {
      cli: this.cli,
      processWillExit: this.processWillExit,
      transportUsable: !this.disconnected,
      stats: { events: this.events, ignored: this.ignored, invalid: this.invalid },
      ...(this.locator !== undefined ? { observedLocator: this.locator } : {}),
      ...(this.conflict !== undefined ? { locatorConflict: this.conflict } : {}),
      ...(t !== undefined ? { transport: { ...t } } : {}),
      ...(assistantText !== undefined && assistantText.length > 0 ? { assistantText } : {}),
    };
    if (end !== undefined) {
      return {
        ...base,
        nativeTurnEnded: true,
        succeeded: end.succeeded,
        endKind: end.kind,
        ...(end.error !== undefined ? { error: end.error } : {}),
        ...(end.nativeTurnId !== undefined ? { nativeTurnId: end.nativeTurnId } : {}),
      };
    }
    if (t !== undefined) {
      const error = clip(t.detail !== undefined ? `${t.kind}: ${t.detail}` : t.kind, MAX_ERROR_CHARS);
      return { ...base, nativeTurnEnded: false, succeeded: false, endKind: t.kind, error };
    }
    return { ...base, nativeTurnEnded: false, succeeded: false, endKind: 'none' };
  }
}
