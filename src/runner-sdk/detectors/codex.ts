// Turn-end detector for the Codex app-server (JSON-RPC over stdio, R-S5). The turn ends ONLY on
// `turn/completed` for the CURRENT native turn id: the one the `turn/start` response returned, or
// failing that the first `turn/started` of the root thread. Completions of any other turn (an
// earlier one finishing late, a sub-agent thread's turn) are ignored. Locator = root thread id.

import type { TransportKind, TurnEndEvidence } from '../evidence.ts';
import { MAX_ERROR_CHARS } from '../evidence.ts';
import { TurnTracker, type DetectorOptions, type TurnEndDetector } from './detector.ts';
import { BoundedText, errorText, field, id, isRec, rec, str } from './shape.ts';

/** Most agent-message items one turn keeps text for; further items are counted and dropped. */
const MAX_ITEMS = 1024;

export interface CodexDetectorOptions extends DetectorOptions {
  /** The current turn id, when the driver already has the `turn/start` response. */
  readonly turnId?: string;
  /** JSON-RPC id of the driver's `turn/start` request: an error response to it is a rejection. */
  readonly turnStartRequestId?: string | number;
}

class CodexDetector implements TurnEndDetector {
  readonly cli = 'codex' as const;
  private readonly t: TurnTracker;
  private turnId: string | undefined;
  private readonly turnStartRequestId: string | undefined;
  private readonly expectedThread: string | undefined;
  private lastError: string | undefined;
  /** Agent message text per item id, in first-seen order; a completed item replaces its deltas. */
  private readonly items = new Map<string, BoundedText>();

  constructor(options: CodexDetectorOptions) {
    this.t = new TurnTracker(this.cli, options);
    this.turnId = id(options, 'turnId');
    this.turnStartRequestId = id(options, 'turnStartRequestId');
    this.expectedThread = id(options, 'expectedLocator');
  }

  get nativeTurnEnded(): boolean {
    return this.t.nativeTurnEnded;
  }

  /** The turn id this detector waits for, once known. */
  get currentTurnId(): string | undefined {
    return this.turnId;
  }

  observe(event: unknown): void {
    const t = this.t;
    t.events += 1;
    if (!isRec(event)) {
      t.invalid += 1;
      return;
    }
    if (!t.open) {
      t.ignored += 1;
      return;
    }
    const method = str(event, 'method');
    if (method !== undefined) {
      this.onNotification(method, rec(event, 'params') ?? {});
      return;
    }
    if ('result' in event || 'error' in event) {
      this.onResponse(event);
      return;
    }
    t.invalid += 1;
  }

  onTransport(kind: TransportKind, detail?: string): void {
    this.t.transport(kind, detail);
  }

  result(): TurnEndEvidence {
    const text = new BoundedText(this.t.maxTextChars);
    let first = true;
    for (const item of this.items.values()) {
      if (item.empty) continue;
      if (!first) text.append('\n');
      text.append(item.toString());
      first = false;
    }
    const ev = this.t.evidence(text.empty ? undefined : text.toString());
    return this.turnId !== undefined && ev.nativeTurnId === undefined ? { ...ev, nativeTurnId: this.turnId } : ev;
  }

  private onResponse(event: Record<string, unknown>): void {
    const result = rec(event, 'result');
    if (result !== undefined) {
      // thread/start and thread/resume answer with the thread; turn/start with the new turn.
      const threadId = id(rec(result, 'thread'), 'id');
      if (threadId !== undefined && this.t.observedLocator === undefined) this.t.noteLocator(threadId);
      const turnId = id(rec(result, 'turn'), 'id');
      if (turnId !== undefined) this.turnId ??= turnId;
      return;
    }
    const requestId = id(event, 'id');
    if (this.turnStartRequestId !== undefined && requestId === this.turnStartRequestId) {
      this.t.transport('rejected', errorText(field(event, 'error'), MAX_ERROR_CHARS) ?? 'turn/start failed');
    } else {
      this.t.ignored += 1;
    }
  }

  /** True when the notification names a thread that is not the root thread. */
  private otherThread(params: Record<string, unknown>): boolean {
    const threadId = id(params, 'threadId');
    // The root thread is the first one the app-server reported, else the one being resumed.
    const root = this.t.observedLocator ?? this.expectedThread;
    return threadId !== undefined && root !== undefined && threadId !== root;
  }

  /** True when the notification is about the current turn (or names no turn at all). */
  private currentTurn(params: Record<string, unknown>): boolean {
    const turnId = id(params, 'turnId');
    return turnId === undefined || turnId === this.turnId;
  }

  private onNotification(method: string, params: Record<string, unknown>): void {
    const t = this.t;
    switch (method) {
      case 'thread/started': {
        const threadId = id(rec(params, 'thread'), 'id');
        if (threadId === undefined) t.invalid += 1;
        // The first thread is the root; later ones are sub-agent threads, never the locator.
        else if (t.observedLocator === undefined) t.noteLocator(threadId);
        else if (threadId !== t.observedLocator) t.ignored += 1;
        return;
      }
      case 'turn/started': {
        const turnId = id(rec(params, 'turn'), 'id');
        if (turnId === undefined) {
          t.invalid += 1;
          return;
        }
        if (this.otherThread(params) || (this.turnId !== undefined && turnId !== this.turnId)) {
          t.ignored += 1;
          return;
        }
        this.turnId = turnId;
        const threadId = id(params, 'threadId');
        if (threadId !== undefined) t.noteLocator(threadId);
        return;
      }
      case 'turn/completed': {
        const turn = rec(params, 'turn');
        const turnId = id(turn, 'id');
        if (turnId === undefined) {
          t.invalid += 1;
          return;
        }
        // Unknown current turn: a completion cannot be attributed, so it must not end this turn.
        if (this.turnId === undefined || turnId !== this.turnId || this.otherThread(params)) {
          t.ignored += 1;
          return;
        }
        const threadId = id(params, 'threadId');
        if (threadId !== undefined) t.noteLocator(threadId);
        this.onCompleted(turnId, turn ?? {});
        return;
      }
      case 'item/agentMessage/delta': {
        if (this.otherThread(params) || !this.currentTurn(params)) {
          t.ignored += 1;
          return;
        }
        const itemId = id(params, 'itemId');
        const delta = str(params, 'delta');
        if (itemId === undefined || delta === undefined) t.invalid += 1;
        else this.itemText(itemId)?.append(delta);
        return;
      }
      case 'item/completed': {
        if (this.otherThread(params) || !this.currentTurn(params)) {
          t.ignored += 1;
          return;
        }
        const item = rec(params, 'item');
        if (str(item, 'type') !== 'agentMessage') return;
        const itemId = id(item, 'id');
        const text = str(item, 'text');
        if (itemId === undefined || text === undefined) {
          t.invalid += 1;
          return;
        }
        const bounded = new BoundedText(t.maxTextChars);
        bounded.append(text);
        if (this.items.has(itemId) || this.items.size < MAX_ITEMS) this.items.set(itemId, bounded);
        return;
      }
      case 'error': {
        if (this.otherThread(params) || !this.currentTurn(params)) {
          t.ignored += 1;
          return;
        }
        this.lastError = errorText(field(params, 'error'), MAX_ERROR_CHARS) ?? this.lastError;
        return;
      }
      default:
        return;
    }
  }

  private itemText(itemId: string): BoundedText | undefined {
    let text = this.items.get(itemId);
    if (text === undefined && this.items.size < MAX_ITEMS) {
      text = new BoundedText(this.t.maxTextChars);
      this.items.set(itemId, text);
    }
    return text;
  }

  private onCompleted(turnId: string, turn: Record<string, unknown>): void {
    const status = str(turn, 'status');
    switch (status) {
      case 'completed':
        this.t.endNative('turn_completed', true, undefined, turnId);
        return;
      case 'failed':
        this.t.endNative('turn_completed', false, errorText(field(turn, 'error'), MAX_ERROR_CHARS) ?? this.lastError ?? 'turn failed', turnId);
        return;
      case 'interrupted':
        this.t.endNative('turn_completed', false, 'turn interrupted', turnId);
        return;
      default:
        // The turn is over natively, but an unknown status is never read as success.
        this.t.endNative('turn_completed', false, `turn completed with unexpected status ${JSON.stringify(status ?? null).slice(0, 64)}`, turnId);
    }
  }
}

/** Detector for one Codex app-server turn (JSON-RPC notifications and responses). */
export function createCodexDetector(options: CodexDetectorOptions = {}): TurnEndDetector & { readonly currentTurnId: string | undefined } {
  return new CodexDetector(options);
}
