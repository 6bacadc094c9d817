// The full-text history checker (test/support/history-checker.ts) on request bodies the five pinned
// CLIs really sent to the loopback fake (test/fixtures/cli-history/*.json, recorded by
// test/support/record-history-fixtures.ts: a new session, then a resumed one). Each recorded
// conversation passes; each negative control fails it: an injected continuation prompt, a duplicated
// fragment, a dropped assistant message, a reordered assistant message — and so do a changed word, a
// stray message in a fresh session and a second title request.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import type { RecordedRequest } from '../support/fake-model-api.ts';
import { SessionHistory, compareEntries, negativeControls, normalize, requestEntries, type HistoryProfile } from '../support/history-checker.ts';
import { CLAUDE_CODE_HISTORY, CODEX_HISTORY, KILO_HISTORY, OPENCODE_HISTORY, PI_HISTORY } from '../support/history-profiles.ts';

interface Recorded {
  readonly turns: Array<{ prompt: string; requests: RecordedRequest[] }>;
}

const load = (cli: string): Recorded => JSON.parse(readFileSync(new URL(`../fixtures/cli-history/${cli}.json`, import.meta.url), 'utf8')) as Recorded;
const ack = (prompt: string): string => `ack ${/MARK-[A-Z0-9]+/.exec(prompt)![0]}`;

const CASES: Array<[string, HistoryProfile]> = [
  ['claude-code', CLAUDE_CODE_HISTORY],
  ['pi', PI_HISTORY],
  ['codex', CODEX_HISTORY],
  ['opencode', OPENCODE_HISTORY],
  ['kilo', KILO_HISTORY],
];

/** Check the recorded first turn, then return the session and the second turn's conversation request. */
function firstTurn(cli: string, profile: HistoryProfile): { session: SessionHistory; second: { prompt: string; request: RecordedRequest; requests: RecordedRequest[] } } {
  const { turns } = load(cli);
  const session = new SessionHistory(profile);
  session.expectTurn(turns[0]!.requests, { prompt: turns[0]!.prompt, reply: ack(turns[0]!.prompt) });
  const second = turns[1]!;
  const request = second.requests.find((r) => requestEntries(r).some((e) => e.role === 'assistant'))!;
  return { session, second: { prompt: second.prompt, request, requests: second.requests } };
}

describe.each(CASES)('history checker on what %s really sent', (cli, profile) => {
  it('passes the recorded conversation, every request of both turns', () => {
    const { session, second } = firstTurn(cli, profile);
    session.expectTurn(second.requests, { prompt: second.prompt, reply: ack(second.prompt) });
    expect(session.turns).toHaveLength(2);
  });

  it('fails on each negative control', () => {
    const { session, second } = firstTurn(cli, profile);
    expect(session.problems(second.request, second.prompt)).toEqual([]);
    const controls = negativeControls(second.request);
    expect(Object.keys(controls)).toEqual(['an injected continuation prompt', 'a duplicated fragment', 'a dropped assistant message', 'a reordered assistant message']);
    for (const [name, altered] of Object.entries(controls)) {
      const problems = session.problems(altered, second.prompt);
      expect(problems, name).not.toEqual([]);
    }
  });

  it('fails when one word of an earlier message changed, or the previous answer is missing from the expectation', () => {
    const { session, second } = firstTurn(cli, profile);
    const raw = JSON.stringify(second.request.raw);
    const changed = { ...second.request, raw: JSON.parse(raw.replace('MARK-ONE.', 'MARK-0NE.')) as unknown };
    expect(session.problems(changed, second.prompt)).not.toEqual([]);
    // The same request checked as if the first turn had failed (no answer kept): it must not pass.
    const failedFirst = session.before(0);
    failedFirst.turns.push({ prompt: session.turns[0]!.prompt, reply: null });
    expect(failedFirst.problems(second.request, second.prompt)).not.toEqual([]);
  });

  it('fails a fresh session whose first request carries a message no framing pattern explains', () => {
    const { turns } = load(cli);
    const first = turns[0]!.requests.find((r) => !profile.auxiliary?.some((a) => a.matches(requestEntries(r))))!;
    const [injected] = Object.values(negativeControls({ ...first, raw: withAssistant(first) }));
    expect(new SessionHistory(profile).problems(injected!, turns[0]!.prompt)).not.toEqual([]);
  });
});

/** A copy of a first request with an assistant answer inserted before the prompt (what the controls need). */
function withAssistant(r: RecordedRequest): unknown {
  const raw = structuredClone(r.raw) as { messages?: unknown[]; input?: unknown[] };
  if (raw.input !== undefined) raw.input.splice(raw.input.length - 1, 0, { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'earlier' }] }, { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'earlier answer' }] });
  else raw.messages!.splice(raw.messages!.length - 1, 0, { role: 'user', content: 'earlier' }, { role: 'assistant', content: 'earlier answer' });
  return raw;
}

describe('history checker rules', () => {
  it('names what it normalizes and leaves the rest alone', () => {
    expect(normalize("Today's date is 2026-12-01. at 2026-12-01T17:11:39Z ses_dcd6c4beaffeH6Y7quukdlg68R 51f76131-e691-47dc-886d-08b7d16b0068 http://127.0.0.1:37551/v1"))
      .toBe("Today's date is <date>. at <timestamp> <ses-id> <uuid> http://127.0.0.1:<port>/v1");
    expect(normalize('Please remember MARK-ONE.')).toBe('Please remember MARK-ONE.');
  });

  it('reports the first difference and every count that differs', () => {
    const a = { role: 'user', blocks: ['a'] };
    const b = { role: 'assistant', blocks: ['b'] };
    expect(compareEntries([a, b], [a, b])).toEqual([]);
    const dup = compareEntries([a, b], [a, a, b]);
    expect(dup[0]).toContain('message 1');
    expect(dup).toContain('1 expected, 2 sent: user: "a"');
    expect(compareEntries([a, b], [b, a])).not.toEqual([]);
  });

  it('a kilo title request in a later turn must list every prompt so far', () => {
    const { session, second } = firstTurn('kilo', KILO_HISTORY);
    const title = second.requests.find((r) => KILO_HISTORY.auxiliary![0]!.matches(requestEntries(r)))!;
    expect(session.problems(title, second.prompt)).toEqual([]);
    expect(session.problems(title, 'Please remember MARK-THREE.')).not.toEqual([]);
  });

  it('an opencode title request after the first turn fails', () => {
    const { turns } = load('opencode');
    const title = turns[0]!.requests.find((r) => OPENCODE_HISTORY.auxiliary![0]!.matches(requestEntries(r)))!;
    const { session, second } = firstTurn('opencode', OPENCODE_HISTORY);
    expect(session.problems(title, second.prompt)[0]).toContain('first turn only');
  });
});
