// Turn-end detector for `codex exec --json` (R-S5): one turn per process, its JSON lines on stdout
// (0.171.0: `thread.started` {thread_id}, `turn.started`, `item.started|updated|completed` {item},
// `turn.completed` {usage}, `turn.failed` {error}, and `error` {message} for a stream that will be
// retried). The turn ends natively on `turn.completed` (succeeded) or `turn.failed` (failed, with
// Codex's own error) — the exec's only turn, so it is the current one; an `error` event, an `error`
// item ("Reconnecting… n/5", "Model metadata … not found") or the process exiting first is not an
// end. Locator = the thread id of the first `thread.started`; another one, or one other than the
// resumed thread (`codex exec resume <id>`), is a conflict (R-S2). The assistant's text is its
// completed `agent_message` items, in order. The process exits after its turn (processWillExit):
// the next turn resumes the thread in a new process (RESTORED).

import type { TransportKind, TurnEndEvidence } from '../evidence.ts';
import { MAX_ERROR_CHARS } from '../evidence.ts';
import { TurnTracker, type DetectorOptions, type TurnEndDetector } from './detector.ts';
import { BoundedText, errorText, field, id, isRec, rec, str } from './shape.ts';

/** Most agent-message items one turn keeps text for; further items are counted and dropped. */
const MAX_ITEMS = 1024;

class CodexExecDetector implements TurnEndDetector {
  readonly cli = 'codex' as const;
  private readonly t: TurnTracker;
  private lastError: string | undefined;
  /** Agent message text per item id, in first-seen order; the completed item's text is the one kept. */
  private readonly items = new Map<string, string>();

  constructor(options: DetectorOptions) {
    this.t = new TurnTracker(this.cli, options);
    this.t.processWillExit = true;
  }

  get nativeTurnEnded(): boolean {
    return this.t.nativeTurnEnded;
  }

  observe(event: unknown): void {
    const t = this.t;
    t.events += 1;
    const type = str(event, 'type');
    if (!isRec(event) || type === undefined) {
      t.invalid += 1;
      return;
    }
    if (!t.open) {
      t.ignored += 1;
      return;
    }
    switch (type) {
      case 'thread.started': {
        const thread = id(event, 'thread_id');
        if (thread === undefined) t.invalid += 1;
        else t.noteLocator(thread);
        return;
      }
      case 'item.completed':
        this.onItem(rec(event, 'item'));
        return;
      case 'error':
        // A stream error Codex retries ("Reconnecting... 2/5"): remembered for a failure without text.
        this.lastError = errorText(field(event, 'message'), MAX_ERROR_CHARS) ?? this.lastError;
        return;
      case 'turn.completed':
        t.endNative('turn_completed', true);
        return;
      case 'turn.failed':
        t.endNative('turn_completed', false, errorText(field(event, 'error'), MAX_ERROR_CHARS) ?? this.lastError ?? 'turn.failed');
        return;
      default:
        // turn.started, item.started, item.updated and anything newer: not an end.
        return;
    }
  }

  private onItem(item: ReturnType<typeof rec>): void {
    const itemId = id(item, 'id');
    const type = str(item, 'type');
    if (item === undefined || itemId === undefined || type === undefined) {
      this.t.invalid += 1;
      return;
    }
    if (type === 'error') {
      this.lastError = errorText(field(item, 'message'), MAX_ERROR_CHARS) ?? this.lastError;
      return;
    }
    if (type !== 'agent_message') return;
    if (!this.items.has(itemId) && this.items.size >= MAX_ITEMS) {
      this.t.ignored += 1;
      return;
    }
    this.items.set(itemId, str(item, 'text') ?? '');
  }

  onTransport(kind: TransportKind, detail?: string): void {
    this.t.transport(kind, detail);
  }

  result(): TurnEndEvidence {
    const text = new BoundedText(this.t.maxTextChars);
    let first = true;
    for (const s of this.items.values()) {
      if (s === '') continue;
      if (!first) text.append('\n');
      text.append(s);
      first = false;
    }
    return this.t.evidence(text.empty ? undefined : text.toString());
  }
}

/** Detector for one `codex exec --json` turn (a process per turn; `resume <thread>` for the next). */
export function createCodexExecDetector(options: DetectorOptions = {}): TurnEndDetector {
  return new CodexExecDetector(options);
}
