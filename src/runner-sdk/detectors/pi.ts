// Turn-end detector for Pi (`pi --mode json` and `--mode rpc`, R-S5). The turn ends on `agent_end`;
// success is read from the LAST assistant message's `stopReason`. A terminal API error is a
// failure, never an empty success: an empty last message that carries an error, or follows a
// failed auto-retry, fails the turn. Locator = the session id from the `session` header (or the
// RPC `get_state` answer).
//
// Auto-retry (Pi 0.73.1, agent-session.js): a failed call Pi will retry still ends its run with
// `agent_end` (stopReason `error`); only AFTER it does Pi announce `auto_retry_start` (and run the
// same turn again, ending with another `agent_end`) or, out of attempts, `auto_retry_end` with
// success false. So an `agent_end` whose error Pi retries is provisional: the turn's end is the
// `auto_retry_end` failure, or the `agent_end` of the attempt that is not retried. Ending at the
// first one reported a failure for a turn whose retry succeeded (its answer was in the session).
// Any `auto_retry_end` with success false ends the turn (out of attempts, or cancelled in the
// backoff). Known limit: with Pi's retries switched off (`retry.enabled: false`) an error it would
// otherwise retry is followed by nothing but the end of the stream, which is a disconnect, never a
// turn end (R-S5): such a turn is unconfirmed. The pinned image keeps Pi's default (retries on).

import type { TransportKind, TurnEndEvidence } from '../evidence.ts';
import { MAX_ERROR_CHARS } from '../evidence.ts';
import { TurnTracker, type DetectorOptions, type TurnEndDetector } from './detector.ts';
import { BoundedText, bool, errorText, field, id, isRec, rec, str, type Rec } from './shape.ts';

/** stopReasons of a turn that finished normally (`length`: output cut at max tokens, still an end). */
const OK_STOP = new Set(['stop', 'toolUse', 'length']);
/** stopReasons of a failed turn. */
const FAILED_STOP = new Set(['error', 'aborted']);
/**
 * The errors Pi retries by itself: its own test (`_isRetryableError` in agent-session.js of the
 * pinned 0.73.1), copied so an `agent_end` it will retry is not read as the turn's end.
 */
/** Context overflow: Pi compacts instead of retrying, even when the text matches PI_RETRIES (e.g. a token count holding "429"). */
const CONTEXT_OVERFLOW = /prompt is too long|context.?(?:length|window)|maximum context|too many (?:input )?tokens|exceeds? the (?:model's )?context/i;
const PI_RETRIES = /overloaded|provider.?returned.?error|rate.?limit|too many requests|429|500|502|503|504|service.?unavailable|server.?error|internal.?error|network.?error|connection.?error|connection.?refused|connection.?lost|websocket.?closed|websocket.?error|other side closed|fetch failed|upstream.?connect|reset before headers|socket hang up|ended without|http2 request did not get a response|timed? out|timeout|terminated|retry delay/i;

class PiDetector implements TurnEndDetector {
  readonly cli = 'pi' as const;
  private readonly t: TurnTracker;
  /** Last assistant message seen in `message_end`: fallback when `agent_end` carries no messages. */
  private lastAssistant: Rec | undefined;
  /** `auto_retry_end` with success false: the retries ran out on an API error. */
  private retryFailure: string | undefined;
  /** A failed `agent_end` Pi may still retry: the turn's end if `auto_retry_end` fails next. */
  private provisionalFailure: string | undefined;
  private text: string | undefined;

  constructor(options: DetectorOptions) {
    this.t = new TurnTracker(this.cli, options);
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
      case 'session': {
        const sid = id(event, 'id');
        if (sid === undefined) t.invalid += 1;
        else t.noteLocator(sid);
        return;
      }
      case 'response':
        this.onRpcResponse(event);
        return;
      case 'message_end': {
        const message = rec(event, 'message');
        if (str(message, 'role') === 'assistant') this.lastAssistant = message;
        return;
      }
      case 'auto_retry_start':
        // The failed attempt was not the turn's end: Pi runs the turn again.
        this.provisionalFailure = undefined;
        this.lastAssistant = undefined;
        return;
      case 'auto_retry_end':
        if (bool(event, 'success') === false) {
          // Pi gave up (out of attempts, or the retry was cancelled in its backoff): no agent_end may
          // follow, so this is the turn's end, a failure.
          this.retryFailure = errorText(field(event, 'finalError'), MAX_ERROR_CHARS) ?? 'auto-retry failed';
          this.t.endNative('agent_end', false, this.provisionalFailure !== undefined ? `${this.provisionalFailure} (retries exhausted)` : `error: ${this.retryFailure}`);
        }
        return;
      case 'agent_end':
        this.onAgentEnd(event);
        return;
      default:
        return;
    }
  }

  onTransport(kind: TransportKind, detail?: string): void {
    this.t.transport(kind, detail);
  }

  result(): TurnEndEvidence {
    return this.t.evidence(this.text);
  }

  /** RPC mode: a refused command is a rejection (never a turn end); `get_state` names the session. */
  private onRpcResponse(event: Rec): void {
    if (bool(event, 'success') === false) {
      const command = str(event, 'command') ?? 'command';
      const reason = errorText(field(event, 'error'), MAX_ERROR_CHARS) ?? 'refused';
      if (command === 'prompt' || command === 'steer' || command === 'follow_up') this.t.transport('rejected', `${command}: ${reason}`);
      else this.t.ignored += 1;
      return;
    }
    const sid = id(rec(event, 'data'), 'sessionId');
    if (str(event, 'command') === 'get_state' && sid !== undefined) this.t.noteLocator(sid);
  }

  private onAgentEnd(event: Rec): void {
    const messages = field(event, 'messages');
    let last: Rec | undefined;
    if (Array.isArray(messages)) {
      for (let i = messages.length - 1; i >= 0; i -= 1) {
        const m: unknown = messages[i];
        if (isRec(m) && str(m, 'role') === 'assistant') {
          last = m;
          break;
        }
      }
    }
    last ??= this.lastAssistant;
    if (last === undefined) {
      this.t.endNative('agent_end', false, this.retryFailure ?? 'agent_end without an assistant message');
      return;
    }
    const text = assistantText(last, this.t.maxTextChars);
    if (text.length > 0) this.text = text;
    const stopReason = str(last, 'stopReason');
    const errorMessage = errorText(field(last, 'errorMessage'), MAX_ERROR_CHARS);
    if (stopReason !== undefined && FAILED_STOP.has(stopReason)) {
      const failure = `${stopReason}: ${errorMessage ?? this.retryFailure ?? 'no error message'}`;
      // Pi will retry this one (or say it gave up): wait for auto_retry_start / auto_retry_end.
      const piRetries = stopReason === 'error' && errorMessage !== undefined && PI_RETRIES.test(errorMessage) && !CONTEXT_OVERFLOW.test(errorMessage);
      if (piRetries && this.retryFailure === undefined) this.provisionalFailure = failure;
      else this.t.endNative('agent_end', false, failure);
    } else if (stopReason !== undefined && OK_STOP.has(stopReason)) {
      // An empty answer that carries an error is the terminal API error, not an empty success.
      const hiddenError = text.length === 0 ? errorMessage ?? this.retryFailure : undefined;
      if (hiddenError !== undefined) this.t.endNative('agent_end', false, `error: ${hiddenError}`);
      else this.t.endNative('agent_end', true);
    } else {
      this.t.endNative('agent_end', false, `unknown stopReason ${JSON.stringify(stopReason ?? null).slice(0, 64)}${errorMessage !== undefined ? `: ${errorMessage}` : ''}`);
    }
  }
}

/** Text blocks of an assistant message, bounded. */
function assistantText(message: Rec, max: number): string {
  const content = field(message, 'content');
  const text = new BoundedText(max);
  if (typeof content === 'string') text.append(content);
  else if (Array.isArray(content)) {
    for (const block of content) {
      if (str(block, 'type') === 'text') text.append(str(block, 'text') ?? '');
    }
  }
  return text.toString();
}

/** Detector for one Pi turn (`--mode json` or `--mode rpc` events). */
export function createPiDetector(options: DetectorOptions = {}): TurnEndDetector {
  return new PiDetector(options);
}
