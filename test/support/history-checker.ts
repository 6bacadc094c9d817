// The one full-text request-history checker of the pinned-CLI regression tests (R-P1):
// every request the model API receives is read in full — the system prompt, developer/system
// messages, every user and assistant message, tool blocks — as role + normalized text, and compared
// with the history the conversation must have: expected order and counts, nothing dropped, nothing
// added, nothing twice. Volatile parts (dates, timestamps, uuids, native ids, the fake's port) are
// replaced by NAMED rules (NORMALIZATION_RULES), never by skipping text.
//
// How the expectation is built, per native session (SessionHistory):
//   - the session's FIRST request teaches the frame: everything in it that is not the prompt (system
//     prompt, a date reminder before the prompt, developer messages, an environment context, an agent
//     list after it). Each framing part must match one of the CLI profile's named patterns: an
//     injected or unknown message in the first request fails;
//   - every later request of that session must be exactly: the frame with the first prompt, then for
//     each earlier turn its answer (when the session kept one) and the next prompt, in order;
//   - requests that are not conversation (OpenCode's title request) are recognised by a named
//     auxiliary rule of the profile and checked in full too; any other request fails.
// negativeControls() builds the mutations the suite uses to show the checker fails: an injected
// continuation prompt, a duplicated fragment, a dropped assistant message, a reordered one.
import { expect } from 'vitest';
import type { RecordedRequest } from './fake-model-api.ts';

/** One message of a request as the checker compares it: role and its blocks, each normalized text. */
export interface Entry {
  readonly role: string;
  readonly blocks: readonly string[];
}

/** A replacement of a volatile part, by name (the names are what a failure report cites). */
export interface NormalizationRule {
  readonly name: string;
  readonly pattern: RegExp;
  readonly replacement: string;
}

export const NORMALIZATION_RULES: readonly NormalizationRule[] = [
  { name: 'iso-timestamp', pattern: /\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?/g, replacement: '<timestamp>' },
  { name: 'iso-date', pattern: /\b\d{4}-\d{2}-\d{2}\b/g, replacement: '<date>' },
  { name: 'js-date', pattern: /\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{2} \d{4}\b/g, replacement: '<date>' },
  { name: 'uuid', pattern: /\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b/gi, replacement: '<uuid>' },
  // OpenCode/Kilo ids: a prefix and a time-ordered random tail (ses_, msg_, prt_, per_, call_, …).
  { name: 'native-id', pattern: /\b(ses|msg|prt|per|que|evt|call|toolu)_[0-9A-Za-z]{12,}\b/g, replacement: '<$1-id>' },
  { name: 'loopback-port', pattern: /\b127\.0\.0\.1:\d{2,5}\b/g, replacement: '127.0.0.1:<port>' },
];

export function normalize(text: string, rules: readonly NormalizationRule[] = NORMALIZATION_RULES): string {
  return rules.reduce((t, r) => t.replace(r.pattern, r.replacement), text);
}

type Json = Record<string, unknown>;
const isRec = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);
const str = (v: unknown): string => (typeof v === 'string' ? v : v === undefined ? '' : JSON.stringify(v));

/** A Messages API content block as text (tool and thinking blocks tagged, never dropped). */
function messagesBlock(b: unknown): string {
  if (typeof b === 'string') return b;
  if (!isRec(b)) return `[${typeof b}]`;
  switch (b.type) {
    case 'text':
      return str(b.text);
    case 'tool_use':
      return `[tool_use ${str(b.name)}] ${JSON.stringify(b.input ?? {})}`;
    case 'tool_result': {
      const content = Array.isArray(b.content) ? b.content.map(messagesBlock).join('\n') : str(b.content);
      return `[tool_result${b.is_error === true ? ' error' : ''}] ${content}`;
    }
    case 'thinking':
      return `[thinking] ${str(b.thinking)}`;
    case 'redacted_thinking':
      return '[redacted_thinking]';
    default:
      return `[${str(b.type)}] ${JSON.stringify({ ...b, cache_control: undefined })}`;
  }
}

/** A Responses API content part or input item as text. */
function responsesPart(p: unknown): string {
  if (typeof p === 'string') return p;
  if (!isRec(p)) return `[${typeof p}]`;
  if (p.type === 'input_text' || p.type === 'output_text' || p.type === 'text') return str(p.text);
  return `[${str(p.type)}] ${JSON.stringify(p)}`;
}

function responsesItem(i: unknown): Entry {
  if (!isRec(i)) return { role: '?', blocks: [JSON.stringify(i)] };
  if (i.type === 'message' || (i.type === undefined && i.role !== undefined)) {
    const content = Array.isArray(i.content) ? i.content.map(responsesPart) : [str(i.content)];
    return { role: str(i.role), blocks: content };
  }
  switch (i.type) {
    case 'function_call':
      return { role: 'assistant', blocks: [`[function_call ${str(i.name)}] ${str(i.arguments)}`] };
    case 'function_call_output':
      return { role: 'tool', blocks: [`[function_call_output] ${str(i.output)}`] };
    case 'reasoning': {
      const summary = Array.isArray(i.summary) ? i.summary.map(responsesPart).join('\n') : '';
      return { role: 'assistant', blocks: [`[reasoning] ${summary}`] };
    }
    default:
      return { role: str(i.role) || 'item', blocks: [`[${str(i.type)}] ${JSON.stringify(i)}`] };
  }
}

/**
 * Every message of a request, in order, normalized: the system prompt first (Messages `system`,
 * Responses `instructions`) as role `system`, then each message or input item.
 */
export function requestEntries(r: RecordedRequest, rules: readonly NormalizationRule[] = NORMALIZATION_RULES): Entry[] {
  const raw = (r.raw ?? r.body) as Json;
  const out: Entry[] = [];
  if (r.api === 'responses' || Array.isArray(raw.input)) {
    if (typeof raw.instructions === 'string' && raw.instructions !== '') out.push({ role: 'system', blocks: [raw.instructions] });
    for (const i of Array.isArray(raw.input) ? raw.input : []) out.push(responsesItem(i));
  } else {
    const system = raw.system;
    if (typeof system === 'string' && system !== '') out.push({ role: 'system', blocks: [system] });
    else if (Array.isArray(system) && system.length > 0) out.push({ role: 'system', blocks: system.map(messagesBlock) });
    for (const m of Array.isArray(raw.messages) ? raw.messages : []) {
      const msg = isRec(m) ? m : {};
      const content = Array.isArray(msg.content) ? msg.content.map(messagesBlock) : [str(msg.content)];
      out.push({ role: str(msg.role), blocks: content });
    }
  }
  return out.map((e) => ({ role: e.role, blocks: e.blocks.map((b) => normalize(b, rules)) }));
}

/** A named shape a framing part (a block or a whole message that is not the user's prompt) may have. */
export interface FramingPattern {
  readonly name: string;
  readonly role: string;
  /** Tested against one normalized block. */
  readonly block: RegExp;
  /** A block that comes with EVERY prompt of the session (in the prompt's message), not only the first. */
  readonly everyPrompt?: boolean;
}

/** A request that is not the conversation (e.g. a title request), recognised and checked in full. */
export interface AuxiliaryRequest {
  readonly name: string;
  matches(entries: readonly Entry[]): boolean;
  /**
   * The whole expected request, given every prompt of the session so far (the turn's own last); or
   * the alternatives it may be (a side request made in the background may not see the newest prompt).
   */
  expected(prompts: readonly string[], actual: readonly Entry[]): Entry[] | Entry[][];
  /** Only in the session's first turn (a title is made once). */
  readonly firstTurnOnly: boolean;
}

/** What the checker knows about one pinned CLI: how its framing may look, and its side requests. */
export interface HistoryProfile {
  readonly cli: string;
  /** Volatile parts of this CLI's requests, normalized after NORMALIZATION_RULES. */
  readonly rules?: readonly NormalizationRule[];
  /** Every non-prompt block / message of a session's first request must match one of these. */
  readonly framing: readonly FramingPattern[];
  readonly auxiliary?: readonly AuxiliaryRequest[];
  /**
   * Consecutive user turns reach the model as ONE user message: a prompt after a turn that kept no
   * answer is appended to the previous message (OpenCode/Kilo: the AI SDK's Anthropic provider;
   * Claude Code: with `appendToPrevious` added to the previous message's last block).
   */
  readonly mergesConsecutiveUser?: boolean | { readonly appendToPrevious: string };
  /**
   * Messages the CLI itself may add right after a prompt (e.g. Claude Code's mid-conversation system
   * reminders), each matching one of these; once sent they are part of the history at that place.
   */
  readonly reminders?: readonly FramingPattern[];
}

/** The frame of one native session: its first request with the first prompt cut out. */
interface Frame {
  /** Entries before the prompt's message. */
  readonly lead: readonly Entry[];
  /** Blocks of the prompt's message before the prompt (e.g. a date reminder). */
  readonly promptPrefix: readonly string[];
  /** Blocks of the prompt's message after the prompt (e.g. Kilo's environment details). */
  readonly promptSuffix: readonly string[];
  /** The prefix and suffix blocks every later prompt carries too (patterns marked everyPrompt). */
  readonly everyPrefix: readonly string[];
  readonly everySuffix: readonly string[];
  /** Entries after the prompt's message (e.g. an agent list sent as a system message). */
  readonly trail: readonly Entry[];
}

/** One turn of the conversation as the native session keeps it. */
export interface HistoryTurn {
  readonly prompt: string;
  /** The assistant's answer the session kept; null when the turn left only its prompt (it failed). */
  readonly reply: string | null;
  /**
   * A turn with tool calls: everything the session keeps after the prompt, in order (assistant text
   * and tool calls, the tool results, the final answer), instead of `reply`. The turn's own requests
   * carry it step by step: the k-th one has the prompt and the exchange up to its k-th tool result.
   */
  readonly exchange?: readonly Entry[];
  /** Reminders the CLI added right after this turn's prompt (profile `reminders`), learned by the checker. */
  readonly reminders?: readonly Entry[];
}

const assistant = (text: string): Entry => ({ role: 'assistant', blocks: [text] });

const show = (e: Entry | undefined): string => (e === undefined ? '(nothing)' : `${e.role}: ${JSON.stringify(e.blocks.join(' ¦ ').slice(0, 160))}`);
/** Where two entries of the same role first differ, with some context (long system prompts look alike at the start). */
function whereDiffer(a: Entry | undefined, b: Entry | undefined): string {
  if (a === undefined || b === undefined || a.role !== b.role) return '';
  const x = a.blocks.join(' ¦ ');
  const y = b.blocks.join(' ¦ ');
  let k = 0;
  while (k < x.length && x[k] === y[k]) k++;
  return ` — first difference at character ${k}: expected …${JSON.stringify(x.slice(Math.max(0, k - 60), k + 80))}, got …${JSON.stringify(y.slice(Math.max(0, k - 60), k + 80))}`;
}
const keyOf = (e: Entry): string => `${e.role}\u0000${e.blocks.join('\u0001')}`;

/**
 * Differences between what a request had to carry and what it carried: the first place they part,
 * every message whose count differs (duplicates, drops), and a length mismatch. Empty = identical.
 */
export function compareEntries(expected: readonly Entry[], actual: readonly Entry[]): string[] {
  const problems: string[] = [];
  const first = Array.from({ length: Math.max(expected.length, actual.length) }, (_, i) => i).find((i) => expected[i] === undefined || actual[i] === undefined || keyOf(expected[i]!) !== keyOf(actual[i]!));
  if (first === undefined) return problems;
  problems.push(`message ${first}: expected ${show(expected[first])}, got ${show(actual[first])}${whereDiffer(expected[first], actual[first])}`);
  const count = (list: readonly Entry[]): Map<string, { n: number; e: Entry }> => {
    const m = new Map<string, { n: number; e: Entry }>();
    for (const e of list) m.set(keyOf(e), { n: (m.get(keyOf(e))?.n ?? 0) + 1, e });
    return m;
  };
  const want = count(expected);
  const got = count(actual);
  for (const [k, { e }] of new Map([...want, ...got])) {
    const a = want.get(k)?.n ?? 0;
    const b = got.get(k)?.n ?? 0;
    if (a !== b) problems.push(`${a} expected, ${b} sent: ${show(e)}`);
  }
  if (expected.length !== actual.length) problems.push(`${expected.length} messages expected, ${actual.length} sent`);
  return problems;
}

/**
 * The history of ONE native session as the model API must see it, turn after turn. `expectTurn`
 * checks every request a turn made, then records the turn (its prompt and what the session kept).
 */
export class SessionHistory {
  readonly turns: HistoryTurn[] = [];
  #frame: Frame | undefined;
  #first: Entry[] | undefined;

  constructor(readonly profile: HistoryProfile, frame?: { frame: Frame; first: Entry[] }) {
    this.#frame = frame?.frame;
    this.#first = frame?.first;
  }

  /** Another native session of the same CLI (a fresh start): same frame, no turns. */
  newSession(): SessionHistory {
    return new SessionHistory(this.profile, this.#frame !== undefined ? { frame: this.#frame, first: this.#first! } : undefined);
  }

  /** This session as it was before its turn `n + 1`: the same frame and its first `n` turns. */
  before(n: number): SessionHistory {
    const s = this.newSession();
    s.turns.push(...this.turns.slice(0, n));
    return s;
  }

  /** The entries a conversation request of a turn with `prompt` must carry, after the recorded turns. */
  expected(prompt: string): Entry[] {
    const f = this.#frame;
    if (f === undefined) throw new Error('the session has no frame yet: its first request teaches it');
    const all: HistoryTurn[] = [...this.turns, { prompt, reply: null }];
    const out: Entry[] = [...f.lead, { role: 'user', blocks: [...f.promptPrefix, normalize(all[0]!.prompt), ...f.promptSuffix] }, ...f.trail];
    for (let i = 1; i < all.length; i++) {
      const before = all[i - 1]!;
      out.push(...(before.reminders ?? []));
      if (before.exchange !== undefined) out.push(...before.exchange);
      else if (before.reply !== null) out.push(assistant(normalize(before.reply)));
      const blocks = [...f.everyPrefix, normalize(all[i]!.prompt), ...f.everySuffix];
      const last = out[out.length - 1]!;
      const keptNothing = before.exchange === undefined && before.reply === null;
      const merge = this.profile.mergesConsecutiveUser;
      if (merge !== undefined && merge !== false && keptNothing && last.role === 'user') {
        const suffix = typeof merge === 'object' ? merge.appendToPrevious : '';
        out[out.length - 1] = { role: 'user', blocks: [...last.blocks.slice(0, -1), `${last.blocks[last.blocks.length - 1] ?? ''}${suffix}`, ...blocks] };
      }
      else out.push({ role: 'user', blocks });
    }
    return out;
  }

  /**
   * Problems with one request of a turn whose prompt is `prompt` (conversation or a known side
   * request); `exchange`: the turn's tool exchange, of which the request may carry a prefix that ends
   * with a tool result.
   */
  problems(r: RecordedRequest, prompt: string, exchange?: readonly Entry[]): string[] {
    const entries = this.entries(r);
    const aux = this.profile.auxiliary?.find((a) => a.matches(entries));
    if (aux !== undefined) {
      if (aux.firstTurnOnly && this.turns.length > 0) return [`${aux.name} request in turn ${this.turns.length + 1}; it is made in a session's first turn only`];
      const prompts = [...this.turns.map((t) => t.prompt), prompt].map((p) => normalize(p));
      const wanted = aux.expected(prompts, entries);
      const alternatives = Array.isArray(wanted[0]) ? (wanted as Entry[][]) : [wanted as Entry[]];
      if (alternatives.some((alt) => compareEntries(alt, entries).length === 0)) return [];
      return compareEntries(alternatives[0]!, entries).map((p) => `${aux.name} request: ${p}`);
    }
    if (this.#frame === undefined) {
      const learned = learnFrame(this.profile, entries, normalize(prompt));
      if (typeof learned === 'string') return [learned];
      return [];
    }
    const base = this.expected(prompt);
    if (exchange === undefined) return compareEntries(base, entries.slice(0, entries.length - this.#reminders(base, entries).length));
    // The longest step the request can be: the prompt, then the exchange up to a tool result.
    const steps = [0, ...exchange.flatMap((e, i) => (e.role === 'user' ? [i + 1] : []))];
    const step = steps.find((j) => compareEntries([...base, ...exchange.slice(0, j)], entries).length === 0);
    return step !== undefined ? [] : compareEntries([...base, ...exchange.slice(0, Math.max(0, entries.length - base.length))], entries);
  }

  /**
   * Check every request of a turn (at least one must carry the prompt), then record the turn.
   * `reply`: what the session keeps of the answer (null: nothing, the turn failed).
   */
  expectTurn(requests: readonly RecordedRequest[], turn: HistoryTurn): void {
    const report: string[] = [];
    let conversation = 0;
    for (const [i, r] of requests.entries()) {
      const entries = this.entries(r);
      const aux = this.profile.auxiliary?.some((a) => a.matches(entries)) ?? false;
      if (!aux) conversation++;
      const teach = this.#frame === undefined && !aux;
      const problems = this.problems(r, turn.prompt, turn.exchange);
      if (teach && problems.length === 0) this.#learn(entries, turn.prompt);
      for (const p of problems) report.push(`request ${i + 1}/${requests.length} (${r.path}): ${p}`);
    }
    if (conversation === 0) report.push(`no conversation request carried the prompt ${JSON.stringify(turn.prompt)}`);
    expect(report, `${this.profile.cli} history, turn ${this.turns.length + 1} (${JSON.stringify(turn.prompt)})`).toEqual([]);
    // Reminders the CLI added after this prompt stay in its history there (the last request has them all).
    const last = [...requests].reverse().find((r) => !(this.profile.auxiliary?.some((a) => a.matches(this.entries(r))) ?? false));
    const reminders = last !== undefined && this.#frame !== undefined && turn.exchange === undefined ? this.#reminders(this.expected(turn.prompt), this.entries(last)) : [];
    this.turns.push(reminders.length > 0 ? { ...turn, reminders } : turn);
  }

  /**
   * The CLI's own reminders a conversation request ends with after the expected entries (none unless
   * the request is exactly `base` followed by messages matching the profile's reminder patterns).
   */
  #reminders(base: readonly Entry[], entries: readonly Entry[]): Entry[] {
    const extra = entries.slice(base.length);
    const isReminder = (e: Entry): boolean => this.profile.reminders?.some((p) => p.role === e.role && e.blocks.every((b) => p.block.test(b))) === true;
    return extra.length > 0 && extra.every(isReminder) && compareEntries(base, entries.slice(0, base.length)).length === 0 ? extra : [];
  }

  /** A request's entries under the shared rules and this CLI's own. */
  entries(r: RecordedRequest): Entry[] {
    return requestEntries(r, [...NORMALIZATION_RULES, ...(this.profile.rules ?? [])]);
  }

  #learn(entries: Entry[], prompt: string): void {
    const learned = learnFrame(this.profile, entries, normalize(prompt));
    if (typeof learned === 'string') throw new Error(learned);
    this.#frame = learned;
    this.#first = entries;
  }
}

/**
 * The frame of a session's first request: the one user message holding the prompt as a block splits
 * it; every other message, and every other block of that message, must match a framing pattern.
 */
function learnFrame(profile: HistoryProfile, entries: readonly Entry[], prompt: string): Frame | string {
  const holding = entries.flatMap((e, i) => (e.role === 'user' && e.blocks.includes(prompt) ? [i] : []));
  if (holding.length === 0) return `first request of the session: no user message holds the prompt ${JSON.stringify(prompt)}; got ${entries.map(show).join(' | ')}`;
  if (holding.length > 1 || entries[holding[0]!]!.blocks.filter((b) => b === prompt).length > 1) return `first request of the session carries the prompt ${JSON.stringify(prompt)} more than once`;
  const at = holding[0]!;
  const unknown: string[] = [];
  const patternOf = (role: string, block: string): FramingPattern | undefined => {
    const found = profile.framing.find((p) => p.role === role && p.block.test(block));
    if (found === undefined) unknown.push(`${role}: ${JSON.stringify(block.slice(0, 160))}`);
    return found;
  };
  const prompted = entries[at]!;
  const p = prompted.blocks.indexOf(prompt);
  const prefix = prompted.blocks.slice(0, p);
  const suffix = prompted.blocks.slice(p + 1);
  const every = (blocks: readonly string[]): string[] => blocks.filter((b) => patternOf('user', b)?.everyPrompt === true);
  const everyPrefix = every(prefix);
  const everySuffix = every(suffix);
  for (const [i, e] of entries.entries()) if (i !== at) e.blocks.forEach((b) => patternOf(e.role, b));
  if (unknown.length > 0) return `first request of the session: parts no ${profile.cli} framing pattern explains (injected?): ${[...new Set(unknown)].join(' | ')}`;
  return { lead: entries.slice(0, at), promptPrefix: prefix, promptSuffix: suffix, everyPrefix, everySuffix, trail: entries.slice(at + 1) };
}

/** The raw body with one message list, whichever API it went to. */
function messageList(raw: Json): { list: Json[]; isUser: (m: Json) => boolean; isAssistant: (m: Json) => boolean; make: (text: string) => Json } {
  if (Array.isArray(raw.input)) {
    return {
      list: raw.input as Json[],
      isUser: (m) => m.role === 'user',
      isAssistant: (m) => m.role === 'assistant',
      make: (text) => ({ type: 'message', role: 'user', content: [{ type: 'input_text', text }] }),
    };
  }
  return { list: raw.messages as Json[], isUser: (m) => m.role === 'user', isAssistant: (m) => m.role === 'assistant', make: (text) => ({ role: 'user', content: [{ type: 'text', text }] }) };
}

/**
 * Negative controls: each returns a copy of a real request altered the way a broken fleet or
 * runner would alter a conversation. The request needs at least one assistant message.
 */
export function negativeControls(r: RecordedRequest): Record<string, RecordedRequest> {
  const variant = (change: (raw: Json) => void): RecordedRequest => {
    const raw = structuredClone((r.raw ?? r.body) as Json);
    change(raw);
    return { ...r, raw };
  };
  const firstAssistant = (raw: Json): number => {
    const m = messageList(raw);
    const i = m.list.findIndex(m.isAssistant);
    if (i < 1) throw new Error('a negative control needs a request with an assistant message after a user message');
    return i;
  };
  return {
    'an injected continuation prompt': variant((raw) => {
      const m = messageList(raw);
      const last = m.list.map(m.isUser).lastIndexOf(true);
      m.list.splice(last, 0, m.make('Please continue from where you left off.'));
    }),
    'a duplicated fragment': variant((raw) => {
      // The first message again, right after itself: what a replayed preamble or a second
      // environment context / AGENTS.md after a migration looks like.
      const m = messageList(raw);
      m.list.splice(1, 0, structuredClone(m.list[0]!));
    }),
    'a dropped assistant message': variant((raw) => {
      messageList(raw).list.splice(firstAssistant(raw), 1);
    }),
    'a reordered assistant message': variant((raw) => {
      const m = messageList(raw);
      const i = firstAssistant(raw);
      [m.list[i - 1], m.list[i]] = [m.list[i]!, m.list[i - 1]!];
    }),
  };
}

/** Every negative control of `r` (a request of this session's last checked turn) must fail the checker. */
export function expectNegativeControlsFail(session: SessionHistory, r: RecordedRequest): void {
  const last = session.turns.at(-1);
  if (last === undefined) throw new Error('check a turn first');
  const base = session.before(session.turns.length - 1);
  expect(base.problems(r, last.prompt), 'the unaltered request passes').toEqual([]);
  for (const [name, altered] of Object.entries(negativeControls(r))) {
    expect(base.problems(altered, last.prompt), `negative control "${name}" must fail the checker`).not.toEqual([]);
  }
}
