// The pure half of `sandboxctl preflight` (R-P3): case definitions (fresh markers, facts only
// in history), the SSE reader of a Messages stream (chunking anywhere, CRLF, comments, thinking,
// truncation, error events, malformed data) and the verdict rules (old fact → missing_fact,
// "can't see history" phrasing only where there is history, leaks, inventions, thinking never a
// failure, recall_passed apart from the total).
import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  buildCases, CASE_KINDS, callReport, historyBlindness, judge, markerFrom, MessageStreamReader, parseMessageStream, SseParser, summarize,
  type CallOutcome, type PreflightCase, type StreamResult,
} from '../../../src/cli/preflight-cases.ts';

const rnd = (n: number): Uint8Array => randomBytes(n);

function sse(events: Array<[string, unknown]>, eol = '\n'): string {
  return events.map(([e, d]) => `event: ${e}${eol}data: ${typeof d === 'string' ? d : JSON.stringify(d)}${eol}${eol}`).join('');
}

function answer(text: string, opts: { thinking?: boolean; stop?: string; end?: boolean } = {}): Array<[string, unknown]> {
  const ev: Array<[string, unknown]> = [['message_start', { type: 'message_start', message: { id: 'm', content: [] } }]];
  let i = 0;
  if (opts.thinking) {
    ev.push(['content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'thinking', thinking: '' } }]);
    ev.push(['content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'thinking_delta', thinking: 'hmm' } }]);
    ev.push(['content_block_stop', { type: 'content_block_stop', index: 0 }]);
    i = 1;
  }
  ev.push(['content_block_start', { type: 'content_block_start', index: i, content_block: { type: 'text', text: '' } }]);
  ev.push(['ping', { type: 'ping' }]);
  ev.push(['content_block_delta', { type: 'content_block_delta', index: i, delta: { type: 'text_delta', text: text.slice(0, 3) } }]);
  ev.push(['content_block_delta', { type: 'content_block_delta', index: i, delta: { type: 'text_delta', text: text.slice(3) } }]);
  ev.push(['content_block_stop', { type: 'content_block_stop', index: i }]);
  if (opts.end === false) return ev;
  ev.push(['message_delta', { type: 'message_delta', delta: { stop_reason: opts.stop ?? 'end_turn' } }]);
  ev.push(['message_stop', { type: 'message_stop' }]);
  return ev;
}

const stream = (text: string, opts: Parameters<typeof answer>[1] = {}): CallOutcome => ({ kind: 'stream', stream: parseMessageStream(sse(answer(text, opts))) });
const byKind = (cases: PreflightCase[], kind: PreflightCase['kind']): PreflightCase => cases.find((c) => c.kind === kind)!;

describe('cases', () => {
  it('5 kinds × repetitions, every marker unique, history facts absent from the final question', () => {
    const cases = buildCases(3, rnd);
    expect(cases).toHaveLength(15);
    for (const k of CASE_KINDS) expect(cases.filter((c) => c.kind === k).map((c) => c.repetition)).toEqual([1, 2, 3]);
    const markers = cases.flatMap((c) => c.markers);
    expect(new Set(markers).size).toBe(markers.length);
    for (const m of markers) expect(m).toMatch(/^[A-Z]{4}-\d{4}$/);
    for (const c of cases) {
      expect(c.messages.at(-1)!.role).toBe('user');
      c.messages.forEach((m, i) => expect(m.role).toBe(i % 2 === 0 ? 'user' : 'assistant'));
      if (c.historyDependent) {
        expect(c.messages.length).toBeGreaterThan(1);
        for (const f of [...c.required, ...c.stale]) expect(c.messages.at(-1)!.content).not.toContain(f);
        for (const f of c.required) expect(c.messages.slice(0, -1).some((m) => m.content.includes(f))).toBe(true);
      }
    }
    expect(byKind(cases, 'no_history').messages).toHaveLength(1);
    expect(byKind(cases, 'greeting').messages).toHaveLength(1);
    const upd = byKind(cases, 'fact_update');
    expect(upd.messages.map((m) => m.content).join('\n')).toContain(`It is now ${upd.required[0]}`);
  });

  it('two runs share no marker; a repeated draw is redrawn', () => {
    const a = new Set(buildCases(3, rnd).flatMap((c) => c.markers));
    expect(buildCases(3, rnd).flatMap((c) => c.markers).some((m) => a.has(m))).toBe(false);
    let calls = 0;
    const stuck = (n: number) => new Uint8Array(n).fill(calls++ < 3 ? 0 : calls);
    const markers = buildCases(1, stuck).flatMap((c) => c.markers);
    expect(new Set(markers).size).toBe(markers.length);
    expect(markerFrom(new Uint8Array(8))).toBe('AAAA-0000');
  });
});

describe('SSE reader', () => {
  it('reads text split at every byte, with CRLF line ends and comments', () => {
    const body = `: keep-alive\r\n\r\n${sse(answer('Hello there, KQVZ-3817!'), '\r\n')}`;
    for (let cut = 0; cut <= body.length; cut += 1) {
      const r = new MessageStreamReader();
      r.push(body.slice(0, cut));
      r.push(body.slice(cut));
      const res = r.result();
      expect(res.text, `cut at ${cut}`).toBe('Hello there, KQVZ-3817!');
      expect(res.messageStop).toBe(true);
      expect(res.malformed).toBeNull();
    }
  });

  it('a lone CR at the end of a chunk followed by LF is one line end', () => {
    const p = new SseParser();
    expect(p.push('event: ping\r')).toEqual([]);
    expect(p.push('\ndata: {"type":"ping"}\r')).toEqual([]);
    expect(p.push('\n\r\n')).toEqual([{ event: 'ping', data: '{"type":"ping"}' }]);
  });

  it('multi-line data joins with LF; an unterminated last event is dropped', () => {
    const p = new SseParser();
    expect(p.push('data: a\ndata: b\n\nevent: x\ndata: y')).toEqual([{ event: 'message', data: 'a\nb' }]);
  });

  it('observes thinking (thinking and redacted_thinking blocks)', () => {
    expect(parseMessageStream(sse(answer('hi', { thinking: true }))).thinking).toBe(true);
    expect(parseMessageStream(sse(answer('hi'))).thinking).toBe(false);
    const redacted = answer('hi');
    redacted.splice(1, 0, ['content_block_start', { type: 'content_block_start', index: 5, content_block: { type: 'redacted_thinking', data: 'x' } }]);
    expect(parseMessageStream(sse(redacted)).thinking).toBe(true);
  });

  it('stop reason, missing message_stop, error event', () => {
    expect(parseMessageStream(sse(answer('hi', { stop: 'max_tokens' }))).stopReason).toBe('max_tokens');
    const cut = parseMessageStream(sse(answer('hi', { end: false })));
    expect(cut.messageStop).toBe(false);
    const err = parseMessageStream(sse([...answer('hi', { end: false }), ['error', { type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } }]]));
    expect(err.error).toEqual({ type: 'overloaded_error', message: 'Overloaded' });
  });

  it('malformed: not JSON, type contradicting the event, delta of an unknown block, content before message_start', () => {
    expect(parseMessageStream(`${sse(answer('hi').slice(0, 2))}event: content_block_delta\ndata: {oops\n\n`).malformed).toMatch(/not JSON/);
    expect(parseMessageStream(sse([['message_start', { type: 'message_stop' }]])).malformed).toMatch(/carries type/);
    expect(parseMessageStream(sse([answer('hi')[0]!, ['content_block_delta', { type: 'content_block_delta', index: 7, delta: { type: 'text_delta', text: 'x' } }]])).malformed).toMatch(/never started/);
    expect(parseMessageStream(sse(answer('hi').slice(1))).malformed).toMatch(/before message_start/);
    expect(parseMessageStream('data: [1,2]\n\n').malformed).toMatch(/not a JSON object/);
  });

  it('unknown event types are ignored (the API may add some)', () => {
    const ev = answer('hi');
    ev.splice(2, 0, ['brand_new_event', { type: 'brand_new_event' }]);
    const r = parseMessageStream(sse(ev));
    expect(r.malformed).toBeNull();
    expect(r.text).toBe('hi');
  });

  it('an oversized line is malformed, not memory', () => {
    const r = new MessageStreamReader();
    r.push(`data: ${'x'.repeat(1024 * 1024 + 10)}`);
    expect(r.result().malformed).toMatch(/exceeds/);
  });
});

describe('verdict', () => {
  const cases = buildCases(1, rnd);
  const others = (c: PreflightCase) => new Set(cases.filter((o) => o !== c).flatMap((o) => o.markers));
  const verdict = (kind: PreflightCase['kind'], o: CallOutcome) => judge(byKind(cases, kind), o, others(byKind(cases, kind)));

  it('passes correct answers; thinking is reported, never a failure', () => {
    expect(verdict('greeting', stream('Hello! Nice to meet you.', { thinking: true }))).toMatchObject({ passed: true, thinking: true, reasons: [] });
    expect(verdict('repeated_question', stream(byKind(cases, 'repeated_question').required[0]!)).passed).toBe(true);
    expect(verdict('task', stream(`**${byKind(cases, 'task').required[0]!.toLowerCase()}**`)).passed).toBe(true);
    expect(verdict('fact_update', stream(byKind(cases, 'fact_update').required[0]!.replace('-', '\u2011'))).passed).toBe(true);
    expect(verdict('no_history', stream("I don't have access to our previous conversation; you haven't told me anything yet."))).toMatchObject({ passed: true });
  });

  it('the old value of an updated fact is missing_fact, naming the old value; both values pass', () => {
    const c = byKind(cases, 'fact_update');
    const v = verdict('fact_update', stream(`Your locker code is ${c.stale[0]}.`));
    expect(v).toMatchObject({ passed: false, reasons: ['missing_fact'] });
    expect(v.detail).toContain(`expected ${c.required[0]}`);
    expect(v.detail).toContain(`old value ${c.stale[0]}`);
    expect(verdict('fact_update', stream(`It is now ${c.required[0]} (it was ${c.stale[0]}).`)).passed).toBe(true);
  });

  it('"can\'t see history" phrasing fails a case with history, first among its reasons', () => {
    for (const text of [
      "I don't have access to our previous conversation.",
      'I’m unable to see our earlier messages.',
      'There is no prior context for me to use.',
      'I do not have any record of our previous chats.',
      'This is the beginning of our conversation, so I cannot say.',
    ]) {
      const v = verdict('repeated_question', stream(text));
      expect(v.passed, text).toBe(false);
      expect(v.reasons[0], text).toBe('history_phrasing');
    }
    const withFact = verdict('fact_update', stream(`I can't see the previous messages, but maybe ${byKind(cases, 'fact_update').required[0]}?`));
    expect(withFact.reasons).toEqual(['history_phrasing']);
    expect(historyBlindness('Your code word is KQVZ-3817. I can see the previous message where you said it.')).toBeUndefined();
  });

  it('no history: a fact of another call is leaked_fact, a marker-shaped value is invented_fact', () => {
    expect(verdict('no_history', stream(`You told me ${byKind(cases, 'repeated_question').required[0]}.`)).reasons).toEqual(['leaked_fact']);
    expect(verdict('no_history', stream('Your code word was ZZZZ-1234.')).reasons).toEqual(['invented_fact']);
    expect(verdict('greeting', stream(`Hi! ${byKind(cases, 'task').required[0]}`)).reasons).toEqual(['leaked_fact']);
  });

  it('transport, timeout, HTTP status, stream error, malformed, truncation, empty', () => {
    expect(verdict('task', { kind: 'transport', message: 'ECONNREFUSED' }).reasons).toEqual(['transport']);
    expect(verdict('task', { kind: 'timeout', afterMs: 5 }).reasons).toEqual(['timeout']);
    const http = verdict('task', { kind: 'http', status: 500, body: '{"type":"error","error":{"type":"api_error","message":"boom"}}' });
    expect(http).toMatchObject({ reasons: ['http_status'], status: 500 });
    expect(http.detail).toBe('HTTP 500: api_error: boom');
    const s = (over: Partial<StreamResult>): CallOutcome => ({ kind: 'stream', stream: { ...parseMessageStream(sse(answer(byKind(cases, 'task').required[0]!))), ...over } });
    expect(verdict('task', s({ error: { type: 'overloaded_error', message: 'x' } })).reasons).toEqual(['stream_error']);
    expect(verdict('task', s({ malformed: 'bad' })).reasons).toEqual(['malformed_stream']);
    expect(verdict('task', s({ messageStop: false })).reasons).toEqual(['truncated']);
    expect(verdict('task', s({ stopReason: 'max_tokens' })).reasons).toEqual(['truncated']);
    expect(verdict('task', s({ interrupted: 'terminated' })).reasons).toEqual(['truncated']);
    expect(verdict('greeting', s({ text: '  ' })).reasons).toEqual(['empty_reply']);
  });
});

describe('summary', () => {
  const cases = buildCases(2, rnd);
  const pass = (c: PreflightCase, thinking = false) => callReport(c, { passed: true, reasons: [], detail: '', thinking, stopReason: 'end_turn', status: 200, replyExcerpt: '' }, 10);
  const failed = (c: PreflightCase) => callReport(c, { passed: false, reasons: ['missing_fact'], detail: 'x', thinking: false, stopReason: 'end_turn', status: 200, replyExcerpt: '' }, 10);

  it('all passed: ok, recall_passed; thinking_observed separately', () => {
    const s = summarize(cases.map((c, i) => pass(c, i === 3)));
    expect(s).toMatchObject({ ok: true, recall_passed: true, thinking_observed: true, total: { calls: 10, passed: 10, failed: 0 } });
    expect(s.cases.map((k) => [k.case, k.passed, k.calls])).toEqual(CASE_KINDS.map((k) => [k, 2, 2]));
  });

  it('a failed history case clears recall_passed; a failed non-history case does not', () => {
    const upd = summarize(cases.map((c) => (c.kind === 'fact_update' && c.repetition === 2 ? failed(c) : pass(c))));
    expect(upd).toMatchObject({ ok: false, recall_passed: false, thinking_observed: false, total: { failed: 1 } });
    expect(upd.cases.find((k) => k.case === 'fact_update')).toMatchObject({ passed: 1, failed: 1, reasons: ['missing_fact'] });
    expect(summarize(cases.map((c) => (c.kind === 'task' ? failed(c) : pass(c))))).toMatchObject({ ok: false, recall_passed: true });
  });
});
