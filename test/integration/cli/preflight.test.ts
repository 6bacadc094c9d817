// END TO END for `sandboxctl preflight` (R-P3): the real binary (child process through the
// launcher cmd/sandboxctl/sandboxctl.mjs) against the loopback fake Messages API
// (test/support/fake-model-api.ts) over real HTTP, nothing mocked. The fake answers from the whole
// message list, like a model that reads its history: a correct gateway passes all 15 calls with
// recall_passed and thinking_observed as scripted; each failure kind (HTTP 500, SSE error event,
// stream cut before message_stop, stop_reason max_tokens, malformed event, the OLD value of an
// updated fact, "I don't have access to our previous conversation", a cached answer leaking into the
// no-history case, a call timeout, no listener) exits 1 naming the call and the reason. The key is
// sent as x-api-key and never appears in stdout/stderr — not even when the gateway echoes it in an
// error body — and a key passed any other way (argv, env, the admin --key, a readable file) is refused.
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve as resolvePath } from 'node:path';
import { parse as parseYaml } from 'yaml';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { startFakeModelApi, type FakeMessage, type FakeModelApi, type ScriptedReply } from '../../support/fake-model-api.ts';

const LAUNCHER = resolvePath('cmd/sandboxctl/sandboxctl.mjs');
const KEY = `sk-test-${randomBytes(24).toString('hex')}`;
const MODEL = 'claude-fake-preflight';
const MARK = /[A-Z]{4}-\d{4}/;

type Kind = 'greeting' | 'repeated_question' | 'task' | 'fact_update' | 'no_history';
type Script = (kind: Kind, last: string, messages: readonly FakeMessage[]) => string | ScriptedReply;

/** Which case a request is, read from its messages the way a test of a gateway would. */
function kindOf(last: string, messages: readonly FakeMessage[]): Kind {
  if (last.includes('Reply with exactly this token')) return 'task';
  if (last.includes('Which code word did I pick')) return 'repeated_question';
  if (last.includes('current locker code')) return 'fact_update';
  if (last.includes('tell you earlier')) return 'no_history';
  expect(messages).toHaveLength(1);
  return 'greeting';
}

/** A model that reads its history correctly. */
function correct(kind: Kind, last: string, messages: readonly FakeMessage[]): string {
  switch (kind) {
    case 'task':
      return MARK.exec(last)![0];
    case 'repeated_question':
      return `You picked ${MARK.exec(messages[0]!.text)![0]}.`;
    case 'fact_update':
      return /It is now ([A-Z]{4}-\d{4})/.exec(messages.find((m) => m.role === 'user' && m.text.includes('It is now'))!.text)![1]!;
    case 'no_history':
      return "You haven't told me anything earlier in this conversation.";
    case 'greeting':
      return 'Hello! Nice to meet you.';
  }
}

let api: FakeModelApi;
let script: Script = correct;
let dir = '';
let keyFile = '';

interface Run {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

function sandboxctl(args: string[], env: NodeJS.ProcessEnv = process.env): Promise<Run> {
  return new Promise((resolve) => {
    execFile(process.execPath, [LAUNCHER, ...args], { cwd: tmpdir(), env, timeout: 120_000, maxBuffer: 16 * 1024 * 1024 }, (error, stdout, stderr) => {
      const code = error === null ? 0 : typeof (error as { code?: unknown }).code === 'number' ? (error as { code: number }).code : -1;
      resolve({ code, stdout, stderr });
    });
  });
}

const preflight = (...extra: string[]): Promise<Run> => sandboxctl(['preflight', '--gateway', api.url, '--model', MODEL, '--key-file', keyFile, ...extra]);

function expectNoKey(run: Run): void {
  expect(run.stdout).not.toContain(KEY);
  expect(run.stderr).not.toContain(KEY);
  // Not even a prefix long enough to matter.
  expect(`${run.stdout}${run.stderr}`).not.toContain(KEY.slice(0, 16));
}

interface JsonCall { case: Kind; repetition: number; passed: boolean; reason: string | null; reasons: string[]; detail: string; thinking: boolean; status: number | null }
interface JsonReport { ok: boolean; recall_passed: boolean; thinking_observed: boolean; total: { calls: number; passed: number; failed: number }; calls: JsonCall[]; cases: Array<{ case: Kind; passed: number; failed: number; reasons: string[] }> }

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'sf-preflight-'));
  keyFile = join(dir, 'gateway.key');
  await writeFile(keyFile, `${KEY}\n`, { mode: 0o600 });
  await chmod(keyFile, 0o600);
  api = await startFakeModelApi((last, messages) => script(kindOf(last, messages), last, messages));
});

afterAll(async () => {
  await api?.close();
  if (dir !== '') await rm(dir, { recursive: true, force: true });
});

beforeEach(() => {
  script = correct;
  api.requests.length = 0;
});

describe('sandboxctl preflight against a correct gateway', () => {
  it('15 calls pass by default: table with recall_passed and thinking_observed, exit 0, key sent only as x-api-key', async () => {
    const run = await preflight();
    expect(run.stderr).toBe('');
    expect(run.code).toBe(0);
    expect(run.stdout).toMatch(/^total:\s+15\/15 calls passed, 0 failed$/m);
    expect(run.stdout).toMatch(/^recall_passed:\s+true$/m);
    expect(run.stdout).toMatch(/^thinking_observed: false \(informational\)$/m);
    expect(run.stdout).toMatch(/^preflight: OK$/m);
    for (const kind of ['greeting', 'repeated_question', 'task', 'fact_update', 'no_history']) expect(run.stdout).toMatch(new RegExp(`^${kind}\\s+3/3\\s+0\\s+-$`, 'm'));
    expectNoKey(run);

    expect(api.requests).toHaveLength(15);
    for (const r of api.requests) {
      expect(r.path).toBe('/v1/messages');
      expect(r.headers?.['x-api-key']).toBe(KEY);
      expect(r.headers?.['anthropic-version']).toBe('2023-06-01');
      expect(r.headers?.authorization).toBeUndefined();
      expect(r.body).toMatchObject({ model: MODEL, stream: true, max_tokens: 1024 });
    }
    // Fresh markers per call: no two calls share one, and a second run shares none with the first.
    const markersOf = (reqs: typeof api.requests) => reqs.map((r) => new Set(JSON.stringify(r.body.messages).match(/[A-Z]{4}-\d{4}/g) ?? []));
    const first = markersOf(api.requests);
    const all = first.flatMap((s) => [...s]);
    expect(new Set(all).size).toBe(all.length);
    api.requests.length = 0;
    expect((await preflight('--repetitions', '1')).code).toBe(0);
    expect(markersOf(api.requests).flatMap((s) => [...s]).some((m) => all.includes(m))).toBe(false);
  });

  it('-o json: thinking_observed when the model thinks, still every call passed', async () => {
    script = (kind, last, messages) => ({ text: correct(kind, last, messages), thinking: 'Let me look at the conversation.' });
    const run = await preflight('-o', 'json', '--max-tokens', '200');
    expect(run.code).toBe(0);
    const report = JSON.parse(run.stdout) as JsonReport;
    expect(report).toMatchObject({ ok: true, recall_passed: true, thinking_observed: true, total: { calls: 15, passed: 15, failed: 0 } });
    expect(report.calls.every((c) => c.passed && c.thinking && c.status === 200)).toBe(true);
    expect(api.requests.every((r) => r.body.max_tokens === 200)).toBe(true);
    expectNoKey(run);
  });

  it('-o yaml with --repetitions 1: 5 calls', async () => {
    const run = await preflight('-o', 'yaml', '--repetitions', '1');
    expect(run.code).toBe(0);
    const report = parseYaml(run.stdout) as JsonReport;
    expect(report).toMatchObject({ ok: true, recall_passed: true, thinking_observed: false, total: { calls: 5, passed: 5 } });
    expect(api.requests).toHaveLength(5);
  });
});

describe('sandboxctl preflight failure kinds: exit 1 naming the call and the reason', () => {
  const old = (messages: readonly FakeMessage[]) => MARK.exec(messages[0]!.text)![0];
  let lastToken = '';
  const cases: Array<{ name: string; kind: Kind; reason: string; recall: boolean; reply: Script; detail?: RegExp }> = [
    { name: 'HTTP 500', kind: 'task', reason: 'http_status', recall: true, reply: () => ({ status: 500 }), detail: /HTTP 500: api_error: scripted failure/ },
    { name: 'an SSE error event', kind: 'greeting', reason: 'stream_error', recall: true, reply: () => ({ text: 'Hel', errorEvent: { type: 'overloaded_error', message: 'Overloaded' } }), detail: /overloaded_error: Overloaded/ },
    { name: 'a stream cut before message_stop', kind: 'repeated_question', reason: 'truncated', recall: false, reply: (k, l, m) => ({ text: correct(k, l, m), truncate: true }), detail: /without message_stop/ },
    { name: 'stop_reason max_tokens', kind: 'task', reason: 'truncated', recall: true, reply: (k, l, m) => ({ text: correct(k, l, m), stopReason: 'max_tokens' }), detail: /max_tokens/ },
    { name: 'a malformed event', kind: 'greeting', reason: 'malformed_stream', recall: true, reply: () => ({ text: 'Hello!', malformed: true }), detail: /not JSON/ },
    { name: 'the old value of an updated fact', kind: 'fact_update', reason: 'missing_fact', recall: false, reply: (_k, _l, m) => `Your locker code is ${old(m)}.`, detail: /old value [A-Z]{4}-\d{4}/ },
    { name: '"I don\'t have access to our previous conversation"', kind: 'repeated_question', reason: 'history_phrasing', recall: false, reply: () => "I'm sorry, I don't have access to our previous conversation." },
    { name: 'a cached answer leaking into the no-history case', kind: 'no_history', reason: 'leaked_fact', recall: true, reply: () => `You told me ${lastToken}.` },
  ];

  it.each(cases)('$name → $reason on $kind', async ({ kind, reason, recall, reply, detail }) => {
    script = (k, last, messages) => {
      if (k === 'task') lastToken = MARK.exec(last)![0];
      return k === kind ? reply(k, last, messages) : correct(k, last, messages);
    };
    const run = await preflight('-o', 'json', '--repetitions', '1');
    expect(run.code).toBe(1);
    const report = JSON.parse(run.stdout) as JsonReport;
    expect(report).toMatchObject({ ok: false, recall_passed: recall, total: { calls: 5, passed: 4, failed: 1 } });
    const bad = report.calls.filter((c) => !c.passed);
    expect(bad).toHaveLength(1);
    expect(bad[0]).toMatchObject({ case: kind, reason });
    if (detail !== undefined) expect(bad[0]!.detail).toMatch(detail);
    expect(report.cases.find((c) => c.case === kind)).toMatchObject({ failed: 1, reasons: [reason] });
    expectNoKey(run);
  });

  it('the table names the failed call and its reason', async () => {
    script = (k, last, messages) => (k === 'fact_update' ? `Your locker code is ${MARK.exec(messages[0]!.text)![0]}.` : correct(k, last, messages));
    const run = await preflight('--repetitions', '2');
    expect(run.code).toBe(1);
    expect(run.stdout).toMatch(/^fact_update#1\s+FAIL\s+missing_fact\s+200\s+end_turn/m);
    expect(run.stdout).toMatch(/^fact_update#2: missing_fact: expected [A-Z]{4}-\d{4}; the reply gave the old value [A-Z]{4}-\d{4}/m);
    expect(run.stdout).toMatch(/^fact_update\s+0\/2\s+2\s+missing_fact$/m);
    expect(run.stdout).toMatch(/^recall_passed:\s+false$/m);
    expect(run.stdout).toMatch(/^preflight: FAILED$/m);
  });

  it('a call that outlives --timeout is a timeout; the others still run', async () => {
    const release = api.holdRequestsWith('greet me back');
    try {
      const run = await preflight('-o', 'json', '--repetitions', '1', '--timeout', '1000');
      expect(run.code).toBe(1);
      const report = JSON.parse(run.stdout) as JsonReport;
      expect(report.calls.filter((c) => !c.passed).map((c) => [c.case, c.reason])).toEqual([['greeting', 'timeout']]);
    } finally {
      release();
    }
  });

  it('no listener at the gateway: every call fails as transport', async () => {
    const port = await new Promise<number>((resolve) => {
      const s = createServer();
      s.listen(0, '127.0.0.1', () => {
        const p = (s.address() as { port: number }).port;
        s.close(() => resolve(p));
      });
    });
    const run = await sandboxctl(['-o', 'json', 'preflight', '--gateway', `http://127.0.0.1:${port}`, '--model', MODEL, '--key-file', keyFile, '--repetitions', '1']);
    expect(run.code).toBe(1);
    const report = JSON.parse(run.stdout) as JsonReport;
    expect(report.calls.map((c) => c.reason)).toEqual(Array(5).fill('transport'));
    expect(report.calls[0]!.detail).toMatch(/ECONNREFUSED/);
    expect(report.recall_passed).toBe(false);
  });
});

describe('sandboxctl preflight keeps the key secret', () => {
  it('a gateway echoing the key in its error body or an error event: redacted in the table and in JSON', async () => {
    script = () => ({ status: 401, body: JSON.stringify({ type: 'error', error: { type: 'authentication_error', message: `invalid x-api-key: ${KEY}` } }) });
    for (const output of ['table', 'json']) {
      const run = await preflight('-o', output, '--repetitions', '1');
      expect(run.code).toBe(1);
      expectNoKey(run);
      expect(run.stdout).toContain('authentication_error: invalid x-api-key: <redacted>');
    }
    script = () => ({ text: `echo ${KEY}`, errorEvent: { type: 'proxy_error', message: `upstream refused ${KEY}` } });
    const run = await preflight('-o', 'json', '--repetitions', '1');
    expect(run.code).toBe(1);
    expectNoKey(run);
    expect((JSON.parse(run.stdout) as JsonReport).calls[0]).toMatchObject({ reason: 'stream_error', detail: 'error event proxy_error: upstream refused <redacted>' });
  });

  it('a key passed any other way is refused (exit 2), never echoed, and nothing is sent', async () => {
    const base = ['preflight', '--gateway', api.url, '--model', MODEL];
    const refusals: Array<[string, string[], NodeJS.ProcessEnv?]> = [
      ['--api-key VALUE', [...base, '--key-file', keyFile, '--api-key', KEY]],
      ['--api-key=VALUE', [...base, '--key-file', keyFile, `--api-key=${KEY}`]],
      ['the admin --key', ['--key', KEY, ...base, '--key-file', keyFile]],
      ['an unknown --token=VALUE', [...base, '--key-file', keyFile, `--token=${KEY}`]],
      ['an unknown --token=VALUE before the command', [`--token=${KEY}`, ...base, '--key-file', keyFile]],
      ['a positional argument', [...base, '--key-file', keyFile, KEY]],
      ['the environment only', base, { ...process.env, ANTHROPIC_API_KEY: KEY, SANDBOXFLEET_GATEWAY_KEY: KEY }],
      ['the key as --key-file', [...base, '--key-file', KEY]],
    ];
    for (const [what, args, env] of refusals) {
      const run = await sandboxctl(args, env);
      expect(run.code, what).toBe(2);
      expectNoKey(run);
    }
    expect(api.requests).toHaveLength(0);
  });

  it('a key file readable by group or others is refused', async () => {
    const loose = join(dir, 'loose.key');
    await writeFile(loose, KEY);
    await chmod(loose, 0o644);
    const run = await sandboxctl(['preflight', '--gateway', api.url, '--model', MODEL, '--key-file', loose]);
    expect(run.code).toBe(2);
    expect(run.stderr).toMatch(/accessible by group or others \(mode 0644\); chmod 600/);
    expectNoKey(run);
    expect(api.requests).toHaveLength(0);
  });

  it('an empty file, a directory or a key with spaces is refused', async () => {
    const empty = join(dir, 'empty.key');
    const spaced = join(dir, 'spaced.key');
    await writeFile(empty, '\n', { mode: 0o600 });
    await writeFile(spaced, `Bearer ${KEY}`, { mode: 0o600 });
    for (const [file, msg] of [[empty, /is empty/], [dir, /not a regular file|accessible by group/], [spaced, /one line of printable ASCII/]] as const) {
      const run = await sandboxctl(['preflight', '--gateway', api.url, '--model', MODEL, '--key-file', file]);
      expect(run.code, file).toBe(2);
      expect(run.stderr).toMatch(msg);
      expectNoKey(run);
    }
  });
});

describe('sandboxctl preflight input validation (exit 2, nothing sent)', () => {
  it.each([
    ['a non-http gateway', ['--gateway', 'ftp://127.0.0.1/', '--model', MODEL], /http or https/],
    ['a gateway with credentials', ['--gateway', 'https://user:hunter2secret@gw.example', '--model', MODEL], /must not carry credentials/],
    ['a gateway with a query', ['--gateway', 'https://gw.example/?key=abc', '--model', MODEL], /query/],
    ['no model', ['--gateway', 'http://127.0.0.1:9'], /--model/],
    ['a bad model id', ['--gateway', 'http://127.0.0.1:9', '--model', 'a b'], /--model must be/],
    ['--repetitions 0', ['--gateway', 'http://127.0.0.1:9', '--model', MODEL, '--repetitions', '0'], /--repetitions must be an integer from 1 to 10/],
    ['--repetitions 11', ['--gateway', 'http://127.0.0.1:9', '--model', MODEL, '--repetitions', '11'], /from 1 to 10/],
    ['--max-tokens 1e6', ['--gateway', 'http://127.0.0.1:9', '--model', MODEL, '--max-tokens', '1000000'], /--max-tokens must be/],
    ['a plain-http gateway off loopback', ['--gateway', 'http://gw.example', '--model', MODEL], /plain http: the key would cross the network unencrypted; use https, or --allow-plain-http/],
  ])('%s', async (_what, args, msg) => {
    const run = await sandboxctl(['preflight', '--key-file', keyFile, ...args]);
    expect(run.code).toBe(2);
    expect(run.stderr).toMatch(msg);
    expect(run.stderr).not.toContain('hunter2secret');
  });

  it('--timeout outside 1000..600000 ms', async () => {
    const run = await sandboxctl(['--timeout', '10', 'preflight', '--gateway', api.url, '--model', MODEL, '--key-file', keyFile]);
    expect(run.code).toBe(2);
    expect(run.stderr).toMatch(/--timeout must be an integer from 1000 to 600000/);
    expect(api.requests).toHaveLength(0);
  });
});
