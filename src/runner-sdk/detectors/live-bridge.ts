// Turn-end detector for OpenCode and Kilo behind the live bridge v4 (R-S5, R-S7). The bridge tags
// every SSE event with its bridge turn id; the turn ends on the bridge's `settled` for the CURRENT
// turn (emitted once the native session is idle). Events of earlier bridge turns are ignored. Text
// is collected only from the root session's assistant messages, decided by role metadata: a part
// whose message role is not known yet is held, and resolved when the role arrives (late metadata)
// or at turn end, where a part still without a role is dropped rather than guessed.

import type { CliKind, TransportKind, TurnEndEvidence } from '../evidence.ts';
import { MAX_ERROR_CHARS } from '../evidence.ts';
import { DetectorOptionError, TurnTracker, type DetectorOptions, type TurnEndDetector } from './detector.ts';
import { BoundedText, bool, clip, errorText, field, id, isRec, rec, str, type Rec } from './shape.ts';

/** Most messages / text parts one turn tracks; beyond that they are counted and dropped. */
const MAX_MESSAGES = 4096;
const MAX_PARTS = 16384;

export interface LiveBridgeDetectorOptions extends DetectorOptions {
  /** The bridge turn id of this turn (required: it is what tells this turn's events apart). */
  readonly turnId: string | number;
}

interface MessageMeta {
  role?: string;
  sessionID?: string;
  error?: string;
}

interface TextPart {
  readonly messageID: string;
  sessionID: string | undefined;
  text: string;
}

class LiveBridgeDetector implements TurnEndDetector {
  private readonly t: TurnTracker;
  private readonly turnId: string;
  private readonly expectedSession: string | undefined;
  private readonly messages = new Map<string, MessageMeta>();
  private readonly parts = new Map<string, TextPart>();
  private readonly sessionErrors: { sessionID: string | undefined; error: string }[] = [];
  private settledSession: string | undefined;
  private firstUserSession: string | undefined;

  constructor(readonly cli: Extract<CliKind, 'opencode' | 'kilo'>, options: LiveBridgeDetectorOptions) {
    this.t = new TurnTracker(cli, options);
    const turnId = id(options, 'turnId');
    if (turnId === undefined) throw new DetectorOptionError(`${cli} detector needs a valid bridge turnId`);
    this.turnId = turnId;
    this.expectedSession = id(options, 'expectedLocator');
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
    const props = rec(event, 'properties') ?? event;
    const turnId = id(event, 'turnId') ?? id(props, 'turnId');
    // No turn id, or another one (an earlier turn's late events): not this turn's (R-S5, R-S7).
    if (turnId !== this.turnId) {
      t.ignored += 1;
      return;
    }
    if (!t.open) {
      // Role metadata that trails `settled` still resolves held parts; nothing else changes the end.
      if (t.nativeTurnEnded && type === 'message.updated') this.onMessage(rec(props, 'info'));
      else t.ignored += 1;
      return;
    }
    switch (type) {
      case 'message.updated':
        this.onMessage(rec(props, 'info'));
        return;
      case 'message.part.updated':
        this.onPart(rec(props, 'part'), str(props, 'delta'));
        return;
      case 'message.part.delta':
        this.onPartDelta(props);
        return;
      case 'session.error': {
        const error = errorText(field(props, 'error'), MAX_ERROR_CHARS) ?? 'session error';
        if (this.sessionErrors.length < 64) this.sessionErrors.push({ sessionID: id(props, 'sessionID'), error });
        return;
      }
      case 'settled':
        this.onSettled(props);
        return;
      default:
        return;
    }
  }

  onTransport(kind: TransportKind, detail?: string): void {
    this.t.transport(kind, detail);
  }

  result(): TurnEndEvidence {
    const root = this.rootSession();
    const text = new BoundedText(this.t.maxTextChars);
    let first = true;
    for (const part of this.parts.values()) {
      const meta = this.messages.get(part.messageID);
      // Late metadata is resolved here; a part whose role never arrived is not the assistant's.
      if (meta?.role !== 'assistant' || part.text.length === 0) continue;
      const session = meta.sessionID ?? part.sessionID;
      if (root !== undefined && session !== root) continue;
      if (!first) text.append('\n');
      text.append(part.text);
      first = false;
    }
    return this.t.evidence(text.empty ? undefined : text.toString());
  }

  /**
   * Root session: the one the bridge settled (the session the turn ran in), else the resumed one,
   * else the first prompt's. A turn that ran in another session than the resumed one is flagged as a
   * locator conflict (R-S2) and judged by what happened in the session it ran in.
   */
  private rootSession(): string | undefined {
    return this.settledSession ?? this.expectedSession ?? this.firstUserSession;
  }

  private onMessage(info: Rec | undefined): void {
    const messageID = id(info, 'id');
    if (messageID === undefined) {
      this.t.invalid += 1;
      return;
    }
    let meta = this.messages.get(messageID);
    if (meta === undefined) {
      if (this.messages.size >= MAX_MESSAGES) {
        this.t.ignored += 1;
        return;
      }
      meta = {};
      this.messages.set(messageID, meta);
    }
    const role = str(info, 'role');
    if (role === 'user' || role === 'assistant') meta.role ??= role;
    meta.sessionID ??= id(info, 'sessionID');
    const error = errorText(field(info, 'error'), MAX_ERROR_CHARS);
    if (error !== undefined) meta.error = error;
    // The prompt's user message comes first; Task child sessions start only after it.
    if (role === 'user' && this.firstUserSession === undefined && meta.sessionID !== undefined) {
      this.firstUserSession = meta.sessionID;
      this.t.noteLocator(meta.sessionID);
    }
  }

  private onPart(part: Rec | undefined, delta: string | undefined): void {
    const messageID = id(part, 'messageID');
    if (part === undefined || messageID === undefined) {
      this.t.invalid += 1;
      return;
    }
    // Only plain text counts; synthetic/ignored parts were injected, not said by the assistant.
    if (str(part, 'type') !== 'text' || bool(part, 'synthetic') === true || bool(part, 'ignored') === true) return;
    const partID = id(part, 'id') ?? `${messageID}#${this.parts.size}`;
    const text = str(part, 'text');
    const existing = this.parts.get(partID);
    if (existing !== undefined) {
      // Part updates carry the full text so far; a bare delta extends it.
      existing.text = clip(text ?? existing.text + (delta ?? ''), this.t.maxTextChars);
      existing.sessionID ??= id(part, 'sessionID');
      return;
    }
    if (this.parts.size >= MAX_PARTS) {
      this.t.ignored += 1;
      return;
    }
    this.parts.set(partID, { messageID, sessionID: id(part, 'sessionID'), text: clip(text ?? delta ?? '', this.t.maxTextChars) });
  }

  private onPartDelta(props: Rec): void {
    const partID = id(props, 'partID');
    const messageID = id(props, 'messageID');
    const delta = str(props, 'delta');
    const fieldName = str(props, 'field') ?? 'text';
    if (partID === undefined || messageID === undefined || delta === undefined) {
      this.t.invalid += 1;
      return;
    }
    if (fieldName !== 'text') return;
    const existing = this.parts.get(partID);
    if (existing !== undefined) existing.text = clip(existing.text + delta, this.t.maxTextChars);
    else if (this.parts.size < MAX_PARTS) this.parts.set(partID, { messageID, sessionID: id(props, 'sessionID'), text: clip(delta, this.t.maxTextChars) });
    else this.t.ignored += 1;
  }

  private onSettled(props: Rec): void {
    const sessionID = id(props, 'sessionID');
    if (sessionID !== undefined) {
      this.settledSession = sessionID;
      this.t.noteLocator(sessionID);
    }
    const root = this.rootSession();
    const settledError = errorText(field(props, 'error'), MAX_ERROR_CHARS) ?? (bool(props, 'aborted') === true ? 'turn aborted by the bridge' : undefined);
    const sessionError = this.sessionErrors.find((e) => e.sessionID === undefined || root === undefined || e.sessionID === root)?.error;
    let messageError: string | undefined;
    for (const meta of this.messages.values()) {
      if (meta.role === 'assistant' && meta.error !== undefined && (root === undefined || meta.sessionID === root)) messageError = meta.error;
    }
    const error = settledError ?? sessionError ?? messageError;
    this.t.endNative('settled', error === undefined, error, this.turnId);
  }
}

/** Detector for one OpenCode turn through the live bridge v4. */
export function createOpenCodeDetector(options: LiveBridgeDetectorOptions): TurnEndDetector {
  return new LiveBridgeDetector('opencode', options);
}

/** Detector for one Kilo turn through the live bridge v4 (same bridge contract as OpenCode). */
export function createKiloDetector(options: LiveBridgeDetectorOptions): TurnEndDetector {
  return new LiveBridgeDetector('kilo', options);
}
