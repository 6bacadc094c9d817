// Turn-end detector for Claude Code 2.1.220 `-p --output-format stream-json --verbose` (R-S4..R-S6).
// The turn ends at the root `result` event and its `is_error` decides; `system/api_retry` is the
// pinned CLI's retry defect, on which the driver ends the turn and lets the process exit. The root
// session id is read from the raw event, before any normalization, and only from events whose
// `parent_tool_use_id` is absent or null, so a sub-agent's session id can never replace it.

import type { TurnEndEvidence, TransportKind } from '../evidence.ts';
import { MAX_ERROR_CHARS } from '../evidence.ts';
import { TurnTracker, type DetectorOptions, type TurnEndDetector } from './detector.ts';
import { BoundedText, bool, clip, errorText, field, isRec, num, rec, str } from './shape.ts';

class ClaudeCodeDetector implements TurnEndDetector {
  readonly cli = 'claude-code' as const;
  private readonly t: TurnTracker;
  private readonly rootText: BoundedText;
  private resultText: string | undefined;

  constructor(options: DetectorOptions) {
    this.t = new TurnTracker(this.cli, options);
    this.rootText = new BoundedText(this.t.maxTextChars);
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
    const parent = event['parent_tool_use_id'];
    // Absent or null: the root agent. Anything else (a tool_use id, or garbage) is not root.
    const isRoot = parent === undefined || parent === null;
    if (!t.open) {
      // After the end, a root event can still reveal a second session id (conflict), never a new end.
      if (t.nativeTurnEnded && isRoot) this.noteRootSession(event);
      t.ignored += 1;
      return;
    }
    if (isRoot) this.noteRootSession(event);

    switch (type) {
      case 'system':
        if (str(event, 'subtype') === 'api_retry') this.onApiRetry(event);
        return;
      case 'assistant':
        if (!isRoot) {
          t.ignored += 1;
          return;
        }
        this.collectAssistantText(event);
        return;
      case 'result':
        if (!isRoot) {
          // A result is only ever the root's; one attributed to a sub-agent cannot end the turn.
          t.ignored += 1;
          return;
        }
        this.onResult(event);
        return;
      default:
        return;
    }
  }

  onTransport(kind: TransportKind, detail?: string): void {
    this.t.transport(kind, detail);
  }

  result(): TurnEndEvidence {
    const text = this.resultText ?? (this.rootText.empty ? undefined : this.rootText.toString());
    return this.t.evidence(text);
  }

  private noteRootSession(event: Record<string, unknown>): void {
    const sid = event['session_id'];
    if (sid === undefined) return;
    if (typeof sid === 'string') this.t.noteLocator(sid);
    else this.t.invalid += 1;
  }

  /** R-S6: end the turn here, keep the locator, let the process exit; next turn is RESTORED. */
  private onApiRetry(event: Record<string, unknown>): void {
    this.t.processWillExit = true;
    const attempt = num(event, 'attempt');
    const max = num(event, 'max_retries');
    const cause = errorText(field(event, 'error'), 512) ?? (num(event, 'error_status') !== undefined ? `HTTP ${num(event, 'error_status')}` : 'API error');
    const tries = attempt !== undefined ? ` (attempt ${attempt}${max !== undefined ? `/${max}` : ''})` : '';
    this.t.endNative('api_retry', false, `api_retry: ${cause}${tries}`);
  }

  private onResult(event: Record<string, unknown>): void {
    const subtype = str(event, 'subtype');
    // is_error decides (R-S5); without it, only an explicit `success` subtype counts as success.
    const isError = bool(event, 'is_error') ?? subtype !== 'success';
    const text = str(event, 'result');
    if (!isError) {
      if (text !== undefined) this.resultText = clip(text, this.t.maxTextChars);
      this.t.endNative('result', true);
      return;
    }
    const errors = field(event, 'errors');
    const firstError = Array.isArray(errors) ? errorText(errors[0], MAX_ERROR_CHARS) : undefined;
    const detail = (text !== undefined && text.length > 0 ? clip(text, MAX_ERROR_CHARS) : undefined) ?? firstError;
    this.t.endNative('result', false, detail !== undefined ? `${subtype ?? 'error'}: ${detail}` : (subtype ?? 'result is_error'));
  }

  private collectAssistantText(event: Record<string, unknown>): void {
    const content = field(rec(event, 'message'), 'content');
    if (!Array.isArray(content)) return;
    for (const block of content) {
      if (str(block, 'type') !== 'text') continue;
      const text = str(block, 'text');
      if (text !== undefined) this.rootText.append(text);
    }
  }
}

/** Detector for one Claude Code turn (stream-json events). */
export function createClaudeCodeDetector(options: DetectorOptions = {}): TurnEndDetector {
  return new ClaudeCodeDetector(options);
}
