// The pure half of `sandboxctl preflight` (R-P3): the case definitions, the SSE parsing of an
// Anthropic Messages stream into a result, and the verdict rules. No I/O, no clock, no randomness
// of its own (random bytes and timings are passed in), so every rule is unit-tested without a
// network; the HTTP driver is src/cli/preflight.ts.

export type CaseKind = 'greeting' | 'repeated_question' | 'task' | 'fact_update' | 'no_history';
export const CASE_KINDS: readonly CaseKind[] = ['greeting', 'repeated_question', 'task', 'fact_update', 'no_history'];

export interface ChatMessage {
  readonly role: 'user' | 'assistant';
  readonly content: string;
}

export interface PreflightCase {
  readonly kind: CaseKind;
  /** 1-based. */
  readonly repetition: number;
  /** The whole conversation sent, history first; the last message is the user's question. */
  readonly messages: readonly ChatMessage[];
  /** Whether the answer depends on earlier messages (these count for `recall_passed`). */
  readonly historyDependent: boolean;
  /** Facts the reply must contain (case-insensitive). */
  readonly required: readonly string[];
  /** Superseded values: named in the failure detail when the reply gives one instead of the required fact. */
  readonly stale: readonly string[];
  /** Every marker this case introduced; the reply of any OTHER call must contain none of them. */
  readonly markers: readonly string[];
  /** No history at all: the reply must not produce a marker-shaped value (an invented fact). */
  readonly forbidsInvention: boolean;
}

const LETTERS = 'ABCDEFGHJKLMNPQRSTUVWXYZ'; // no I or O: never misread as 1 or 0
/** The shape of every marker: four capital letters, a hyphen, four digits (e.g. `KQVZ-3817`). */
export const MARKER_SHAPE = /\b[A-Z]{4}-\d{4}\b/g;
/** Random bytes needed per marker. */
export const MARKER_BYTES = 8;

/** A marker from 8 random bytes (24^4 · 10^4 ≈ 3.3·10^9 values; slight modulo bias is irrelevant here). */
export function markerFrom(bytes: Uint8Array): string {
  if (bytes.length < MARKER_BYTES) throw new Error(`markerFrom needs ${MARKER_BYTES} bytes`);
  let s = '';
  for (let i = 0; i < 4; i++) s += LETTERS[bytes[i]! % LETTERS.length];
  s += '-';
  for (let i = 4; i < 8; i++) s += String(bytes[i]! % 10);
  return s;
}

/**
 * The 5 case kinds × `repetitions` calls, each with its own fresh markers so no answer can be
 * cached or guessed. Facts a history-dependent case asks about live only in its history, never in
 * the final question, so a gateway that drops or trims history cannot pass by reading the question.
 */
export function buildCases(repetitions: number, randomBytes: (n: number) => Uint8Array): PreflightCase[] {
  if (!Number.isInteger(repetitions) || repetitions < 1) throw new Error('repetitions must be a positive integer');
  const used = new Set<string>();
  const marker = (): string => {
    for (let attempt = 0; attempt < 100; attempt++) {
      const m = markerFrom(randomBytes(MARKER_BYTES));
      if (!used.has(m)) {
        used.add(m);
        return m;
      }
    }
    throw new Error('could not draw a unique marker');
  };
  const cases: PreflightCase[] = [];
  for (let repetition = 1; repetition <= repetitions; repetition++) {
    cases.push({
      kind: 'greeting', repetition, historyDependent: false, required: [], stale: [], markers: [], forbidsInvention: false,
      messages: [{ role: 'user', content: 'Hello! Please greet me back in one short sentence.' }],
    });
    const word = marker();
    cases.push({
      kind: 'repeated_question', repetition, historyDependent: true, required: [word], stale: [], markers: [word], forbidsInvention: false,
      messages: [
        { role: 'user', content: `I picked a code word for today: ${word}. Which code word did I pick?` },
        { role: 'assistant', content: `You picked the code word ${word}.` },
        { role: 'user', content: 'Sorry, I missed your answer. Which code word did I pick? Reply with the code word only.' },
      ],
    });
    const token = marker();
    cases.push({
      kind: 'task', repetition, historyDependent: false, required: [token], stale: [], markers: [token], forbidsInvention: false,
      messages: [{ role: 'user', content: `Reply with exactly this token and nothing else: ${token}` }],
    });
    const oldCode = marker();
    const newCode = marker();
    cases.push({
      kind: 'fact_update', repetition, historyDependent: true, required: [newCode], stale: [oldCode], markers: [oldCode, newCode], forbidsInvention: false,
      messages: [
        { role: 'user', content: `Please note: my locker code is ${oldCode}.` },
        { role: 'assistant', content: `Noted: your locker code is ${oldCode}.` },
        { role: 'user', content: `Correction: my locker code has changed. It is now ${newCode}; ${oldCode} is no longer valid.` },
        { role: 'assistant', content: 'Understood, I have updated your locker code.' },
        { role: 'user', content: 'What is my current locker code? Reply with the code only.' },
      ],
    });
    cases.push({
      kind: 'no_history', repetition, historyDependent: false, required: [], stale: [], markers: [], forbidsInvention: true,
      messages: [{ role: 'user', content: 'What code word and which locker code did I tell you earlier in this conversation?' }],
    });
  }
  return cases;
}

/** A case's name in reports: `fact_update#2`. */
export const caseName = (c: { kind: CaseKind; repetition: number }): string => `${c.kind}#${c.repetition}`;

// ---------------------------------------------------------------------------------------------
// "Can't see history" phrasing.
//
// Why phrasing is checked at all: the failure this preflight exists to catch is a gateway (or a
// proxy, or a context trimmer in front of the model) that drops or cuts the message history. The
// model then says so — "I don't have access to our previous conversation" — and that sentence is
// exactly what an end user would see in a resumed conversation. The fact checks catch most such
// drops too, but a reply can mention the fact and still disown the history (e.g. guessing from the
// question), and the phrasing names the cause. Checked only in cases that HAVE history: with no
// history (`no_history`) saying so is the right answer. The list is deliberately small and bounded
// (anchored phrases, no open-ended wildcards) so a normal answer never matches by accident;
// extend it here, in one place, when a model phrases it differently.
export const HISTORY_BLINDNESS_PATTERNS: readonly RegExp[] = [
  /\bI (?:do not|don't|no longer) have (?:access to |any record of |a record of )?(?:our|the|any|your) (?:previous|prior|earlier|past) (?:conversations?|messages?|chats?|context|interactions?|exchanges?)\b/i,
  /\bI(?: cannot| can't| can not| am unable to|'m unable to| am not able to|'m not able to) (?:see|access|view|recall|remember|retrieve) (?:our|the|any|your) (?:previous|prior|earlier|past)\b/i,
  /\bno (?:prior|previous|earlier) (?:context|conversation|messages?|history|chat)\b/i,
  /\bI (?:have no|do not have|don't have) (?:memory|recollection|record) of (?:our|the|any|your) (?:previous|prior|earlier|past)\b/i,
  /\b(?:this is|this appears to be|this seems to be) the (?:start|beginning) of our conversation\b/i,
  /\bI (?:do not|don't) (?:retain|keep|store|remember) (?:information|memory|anything|context) (?:between|from|across) (?:conversations|sessions|chats)\b/i,
];

/** Curly apostrophes and unicode hyphens as plain ASCII, so patterns and markers match however typeset. */
export function normalizeReply(text: string): string {
  return text.replace(/[\u2018\u2019\u02bc]/g, "'").replace(/[\u2010-\u2015\u2212\ufe63\uff0d]/g, '-');
}

export function historyBlindness(text: string): RegExp | undefined {
  const t = normalizeReply(text);
  return HISTORY_BLINDNESS_PATTERNS.find((p) => p.test(t));
}

// ---------------------------------------------------------------------------------------------
// SSE → stream result.

export interface SseEvent {
  readonly event: string;
  readonly data: string;
}

/** Bound of one SSE line and of one event's data (a gateway answering garbage must not grow memory). */
export const MAX_SSE_LINE = 1024 * 1024;

/**
 * Incremental text/event-stream parser (WHATWG rules: LF, CRLF or CR line ends, `:` comments,
 * multi-line data joined by LF, a blank line dispatches, an event without a final blank line at the
 * end of the stream is dropped). Feed decoded text with `push`, in chunks split anywhere.
 */
export class SseParser {
  private buffer = '';
  private event = '';
  private data: string[] = [];
  private dataLength = 0;
  private pendingCr = false;
  /** Set when a line or an event exceeded MAX_SSE_LINE; nothing more is parsed after that. */
  overflow = false;

  push(text: string): SseEvent[] {
    if (this.overflow) return [];
    const out: SseEvent[] = [];
    let s = text;
    if (this.pendingCr) {
      // A CR ended the previous chunk: an LF right after it belongs to the same line end.
      if (s.startsWith('\n')) s = s.slice(1);
      this.pendingCr = false;
    }
    this.buffer += s;
    for (;;) {
      const m = /\r\n|\r|\n/.exec(this.buffer);
      if (m === null) break;
      if (m[0] === '\r' && m.index === this.buffer.length - 1) {
        this.pendingCr = true;
      }
      const line = this.buffer.slice(0, m.index);
      this.buffer = this.buffer.slice(m.index + m[0].length);
      const ev = this.line(line);
      if (ev !== undefined) out.push(ev);
      if (this.overflow) return out;
    }
    if (this.buffer.length > MAX_SSE_LINE) this.overflow = true;
    return out;
  }

  private line(line: string): SseEvent | undefined {
    if (line === '') {
      if (this.data.length === 0) {
        this.event = '';
        return undefined;
      }
      const ev = { event: this.event === '' ? 'message' : this.event, data: this.data.join('\n') };
      this.event = '';
      this.data = [];
      this.dataLength = 0;
      return ev;
    }
    if (line.startsWith(':')) return undefined;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'event') this.event = value;
    else if (field === 'data') {
      this.dataLength += value.length + 1;
      if (this.dataLength > MAX_SSE_LINE) this.overflow = true;
      else this.data.push(value);
    }
    return undefined;
  }
}

/** What one streamed Messages answer amounted to. */
export interface StreamResult {
  /** The assistant's text (text blocks concatenated), bounded by MAX_REPLY_CHARS. */
  readonly text: string;
  readonly thinking: boolean;
  readonly stopReason: string | null;
  readonly messageStart: boolean;
  readonly messageStop: boolean;
  /** An SSE `error` event. */
  readonly error: { readonly type: string; readonly message: string } | null;
  /** Why the stream could not be understood (not JSON, events out of order, oversized, ...). */
  readonly malformed: string | null;
  /** The body broke off with a transport error (not a clean end). */
  readonly interrupted: string | null;
}

export const MAX_REPLY_CHARS = 64 * 1024;

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);
const str = (v: unknown): string => (typeof v === 'string' ? v : '');

/**
 * Folds the events of one Messages stream (message_start, content_block_start/delta/stop,
 * message_delta, message_stop, ping, error) into a StreamResult. Unknown event types are ignored
 * (the API may add some); data that is not a JSON object, a `type` that contradicts the event
 * name, content events before message_start, or a delta for a block never started is malformed.
 */
export class MessageStreamReader {
  private readonly parser = new SseParser();
  private text = '';
  private thinking = false;
  private stopReason: string | null = null;
  private messageStart = false;
  private messageStop = false;
  private error: { type: string; message: string } | null = null;
  private malformed: string | null = null;
  private interrupted: string | null = null;
  private readonly blocks = new Map<number, string>();

  push(chunk: string): void {
    if (this.malformed !== null) return;
    for (const ev of this.parser.push(chunk)) {
      this.event(ev);
      if (this.malformed !== null) return;
    }
    if (this.parser.overflow) this.malformed = `an SSE line or event exceeds ${MAX_SSE_LINE} bytes`;
  }

  /** The body failed mid-way (connection reset, ...). */
  interrupt(message: string): void {
    this.interrupted = message;
  }

  /** Marks the stream malformed for a reason found outside the SSE text (e.g. an oversized body). */
  fail(reason: string): void {
    if (this.malformed === null) this.malformed = reason;
  }

  result(): StreamResult {
    return {
      text: this.text, thinking: this.thinking, stopReason: this.stopReason, messageStart: this.messageStart,
      messageStop: this.messageStop, error: this.error, malformed: this.malformed, interrupted: this.interrupted,
    };
  }

  private event(ev: SseEvent): void {
    let data: unknown;
    try {
      data = JSON.parse(ev.data);
    } catch {
      this.malformed = `event ${JSON.stringify(ev.event.slice(0, 40))}: data is not JSON`;
      return;
    }
    if (!isObject(data)) {
      this.malformed = `event ${JSON.stringify(ev.event.slice(0, 40))}: data is not a JSON object`;
      return;
    }
    const type = str(data.type);
    if (ev.event !== 'message' && type !== '' && type !== ev.event) {
      this.malformed = `event ${JSON.stringify(ev.event.slice(0, 40))} carries type ${JSON.stringify(type.slice(0, 40))}`;
      return;
    }
    const name = ev.event === 'message' ? type : ev.event;
    if (name === 'ping') return;
    if (name === 'error') {
      const e = isObject(data.error) ? data.error : {};
      this.error ??= { type: str(e.type) || 'error', message: str(e.message) };
      return;
    }
    const known = ['message_start', 'content_block_start', 'content_block_delta', 'content_block_stop', 'message_delta', 'message_stop'];
    if (!known.includes(name)) return;
    if (name !== 'message_start' && !this.messageStart) {
      this.malformed = `${name} before message_start`;
      return;
    }
    if (this.messageStop) return;
    switch (name) {
      case 'message_start': {
        if (this.messageStart) {
          this.malformed = 'a second message_start';
          return;
        }
        if (!isObject(data.message)) {
          this.malformed = 'message_start without a message';
          return;
        }
        this.messageStart = true;
        return;
      }
      case 'content_block_start': {
        const index = data.index;
        const block = data.content_block;
        if (typeof index !== 'number' || !isObject(block)) {
          this.malformed = 'content_block_start without index or content_block';
          return;
        }
        const blockType = str(block.type);
        this.blocks.set(index, blockType);
        if (blockType === 'thinking' || blockType === 'redacted_thinking') this.thinking = true;
        if (blockType === 'text') this.append(str(block.text));
        return;
      }
      case 'content_block_delta': {
        const index = data.index;
        const delta = data.delta;
        if (typeof index !== 'number' || !isObject(delta)) {
          this.malformed = 'content_block_delta without index or delta';
          return;
        }
        if (!this.blocks.has(index)) {
          this.malformed = `content_block_delta for block ${index} that was never started`;
          return;
        }
        const deltaType = str(delta.type);
        if (deltaType === 'text_delta') this.append(str(delta.text));
        if (deltaType === 'thinking_delta' || deltaType === 'signature_delta') this.thinking = true;
        return;
      }
      case 'content_block_stop':
        return;
      case 'message_delta': {
        const delta = isObject(data.delta) ? data.delta : {};
        if (typeof delta.stop_reason === 'string') this.stopReason = delta.stop_reason;
        return;
      }
      case 'message_stop':
        this.messageStop = true;
        return;
    }
  }

  private append(s: string): void {
    if (this.text.length < MAX_REPLY_CHARS) this.text = (this.text + s).slice(0, MAX_REPLY_CHARS);
  }
}

/** Parses a whole stream at once (tests, and any caller that already holds the body). */
export function parseMessageStream(body: string): StreamResult {
  const r = new MessageStreamReader();
  r.push(body);
  return r.result();
}

// ---------------------------------------------------------------------------------------------
// Verdict.

export type FailureReason =
  | 'transport' // no HTTP answer at all (refused, reset, DNS, TLS)
  | 'timeout' // the call did not finish within the per-call timeout
  | 'http_status' // an answer other than 200
  | 'stream_error' // an SSE `error` event
  | 'malformed_stream' // not an SSE Messages stream we can read
  | 'truncated' // no message_stop, a broken-off body, or stop_reason max_tokens
  | 'empty_reply' // a complete stream without any text
  | 'history_phrasing' // "can't see history" phrasing in a case that has history
  | 'missing_fact' // a required fact is not in the reply (e.g. the old value of an updated fact)
  | 'leaked_fact' // the reply contains a fact of another call of this run
  | 'invented_fact'; // with no history, the reply states a marker-shaped value anyway

/** How one call ended, as the driver saw it. */
export type CallOutcome =
  | { readonly kind: 'transport'; readonly message: string }
  | { readonly kind: 'timeout'; readonly afterMs: number }
  | { readonly kind: 'http'; readonly status: number; readonly body: string }
  | { readonly kind: 'stream'; readonly stream: StreamResult };

export interface Verdict {
  readonly passed: boolean;
  /** Every rule the call broke, most telling first; `reasons[0]` is the reported reason. */
  readonly reasons: readonly FailureReason[];
  /** One line for people: what was wrong (empty when passed). */
  readonly detail: string;
  readonly thinking: boolean;
  readonly stopReason: string | null;
  readonly status: number | null;
  /** The start of the reply text, one line. */
  readonly replyExcerpt: string;
}

/** One line, control characters replaced, at most `n` characters. */
export function excerpt(text: string, n = 120): string {
  // eslint-disable-next-line no-control-regex -- replacing control characters is the point
  const flat = text.replace(/[\u0000-\u001f\u007f-\u009f]+/g, ' ').replace(/\s+/g, ' ').trim();
  return flat.length > n ? `${flat.slice(0, n - 1)}…` : flat;
}

const contains = (haystack: string, needle: string): boolean => haystack.toLowerCase().includes(needle.toLowerCase());

/** The error message inside an API error body, if it is one, else the body itself. */
function errorBodyText(body: string): string {
  try {
    const j: unknown = JSON.parse(body);
    if (isObject(j) && isObject(j.error)) return `${str(j.error.type)}: ${str(j.error.message)}`;
  } catch {
    // not JSON: show it as it is
  }
  return body;
}

/**
 * The verdict on one call. `otherMarkers` are the markers of every OTHER call of the run (a reply
 * containing one leaked it from elsewhere: a shared cache or session in the gateway).
 *
 * Rules, in order: transport/timeout/HTTP status/stream error/malformed/truncated end the judgement
 * (no reply to judge). Then on the text: empty reply; "can't see history" phrasing when the case
 * has history; each required fact must appear — an updated fact is judged by its NEW value only
 * (a reply giving only the old value is `missing_fact`; one that names both, e.g. "now X, was Y",
 * passes); no other call's marker; and with no history, no marker-shaped value at all.
 */
export function judge(c: PreflightCase, outcome: CallOutcome, otherMarkers: ReadonlySet<string>): Verdict {
  const fail = (reason: FailureReason, detail: string, extra: Partial<Verdict> = {}): Verdict => ({
    passed: false, reasons: [reason], detail, thinking: false, stopReason: null, status: null, replyExcerpt: '', ...extra,
  });
  switch (outcome.kind) {
    case 'transport':
      return fail('transport', `no answer: ${excerpt(outcome.message, 200)}`);
    case 'timeout':
      return fail('timeout', `no complete answer within ${outcome.afterMs} ms`);
    case 'http':
      return fail('http_status', `HTTP ${outcome.status}${outcome.body === '' ? '' : `: ${excerpt(errorBodyText(outcome.body), 200)}`}`, { status: outcome.status });
  }
  const s = outcome.stream;
  const base = { thinking: s.thinking, stopReason: s.stopReason, status: 200, replyExcerpt: excerpt(s.text) };
  if (s.error !== null) return fail('stream_error', `error event ${s.error.type}${s.error.message === '' ? '' : `: ${excerpt(s.error.message, 200)}`}`, base);
  if (s.malformed !== null) return fail('malformed_stream', s.malformed, base);
  if (s.interrupted !== null) return fail('truncated', `the stream broke off: ${excerpt(s.interrupted, 200)}`, base);
  if (!s.messageStart) return fail('truncated', 'the stream ended before message_start', base);
  if (!s.messageStop) return fail('truncated', 'the stream ended without message_stop', base);
  if (s.stopReason === 'max_tokens') return fail('truncated', 'stop_reason max_tokens: the answer was cut off (raise --max-tokens?)', base);

  const text = normalizeReply(s.text);
  const reasons: FailureReason[] = [];
  const details: string[] = [];
  if (text.trim() === '') {
    reasons.push('empty_reply');
    details.push('the reply has no text');
  }
  if (c.messages.length > 1) {
    const p = historyBlindness(text);
    if (p !== undefined) {
      reasons.push('history_phrasing');
      details.push(`the reply disowns the conversation history (matches ${p.source.slice(0, 60)}…)`);
    }
  }
  const missing = c.required.filter((f) => !contains(text, f));
  if (missing.length > 0 && text.trim() !== '') {
    reasons.push('missing_fact');
    const staleGiven = c.stale.filter((f) => contains(text, f));
    details.push(`expected ${missing.join(', ')}${staleGiven.length > 0 ? `; the reply gave the old value ${staleGiven.join(', ')}` : ''}`);
  }
  const leaked = [...otherMarkers].filter((m) => contains(text, m));
  if (leaked.length > 0) {
    reasons.push('leaked_fact');
    details.push(`the reply contains ${leaked.slice(0, 3).join(', ')} from another call`);
  }
  if (c.forbidsInvention && leaked.length === 0) {
    const invented = text.match(MARKER_SHAPE) ?? [];
    if (invented.length > 0) {
      reasons.push('invented_fact');
      details.push(`no history was sent, yet the reply states ${invented.slice(0, 3).join(', ')}`);
    }
  }
  if (reasons.length === 0) return { passed: true, reasons: [], detail: '', ...base };
  return { passed: false, reasons, detail: `${details.join('; ')}: "${excerpt(s.text, 100)}"`, ...base };
}

// ---------------------------------------------------------------------------------------------
// Report.

export interface CallReport {
  readonly case: CaseKind;
  readonly repetition: number;
  readonly passed: boolean;
  readonly reason: FailureReason | null;
  readonly reasons: readonly FailureReason[];
  readonly detail: string;
  readonly status: number | null;
  readonly stop_reason: string | null;
  readonly thinking: boolean;
  readonly latency_ms: number;
  readonly reply_excerpt: string;
  /** The gateway's id of this request (`request-id`, else `x-request-id`), as answered; null without one. */
  readonly request_id: string | null;
}

export interface CaseSummary {
  readonly case: CaseKind;
  readonly calls: number;
  readonly passed: number;
  readonly failed: number;
  /** Distinct reasons of the failed calls. */
  readonly reasons: readonly FailureReason[];
}

export interface PreflightSummary {
  /** Every call passed: the exit status is 0 only then. */
  readonly ok: boolean;
  /** Every history-dependent call (repeated_question, fact_update) passed: the history reached the model and was used. */
  readonly recall_passed: boolean;
  /** Any thinking block was seen in any stream. Informational, never a failure. */
  readonly thinking_observed: boolean;
  readonly total: { readonly calls: number; readonly passed: number; readonly failed: number };
  readonly cases: readonly CaseSummary[];
}

export function callReport(c: PreflightCase, v: Verdict, latencyMs: number, requestId: string | null = null): CallReport {
  return {
    case: c.kind, repetition: c.repetition, passed: v.passed, reason: v.reasons[0] ?? null, reasons: v.reasons, detail: v.detail,
    status: v.status, stop_reason: v.stopReason, thinking: v.thinking, latency_ms: Math.max(0, Math.round(latencyMs)), reply_excerpt: v.replyExcerpt,
    request_id: requestId,
  };
}

const HISTORY_DEPENDENT: ReadonlySet<CaseKind> = new Set(['repeated_question', 'fact_update']);

export function summarize(calls: readonly CallReport[]): PreflightSummary {
  const cases = CASE_KINDS.map((kind): CaseSummary => {
    const mine = calls.filter((c) => c.case === kind);
    const failed = mine.filter((c) => !c.passed);
    return { case: kind, calls: mine.length, passed: mine.length - failed.length, failed: failed.length, reasons: [...new Set(failed.flatMap((c) => (c.reason === null ? [] : [c.reason])))] };
  }).filter((c) => c.calls > 0);
  const passed = calls.filter((c) => c.passed).length;
  const recall = calls.filter((c) => HISTORY_DEPENDENT.has(c.case));
  return {
    ok: calls.length > 0 && passed === calls.length,
    recall_passed: recall.length > 0 && recall.every((c) => c.passed),
    thinking_observed: calls.some((c) => c.thinking),
    total: { calls: calls.length, passed, failed: calls.length - passed },
    cases,
  };
}
