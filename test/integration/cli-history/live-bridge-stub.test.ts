// The live bridge v4 (bridge/live-bridge.ts, R-S7) against a STUB CLI server — a named seam: the
// failures the real OpenCode/Kilo cannot be made to produce on demand (a permission reply the CLI
// rejects, an event stream that breaks mid-turn) are played by a small HTTP server that speaks the
// parts of their server API the bridge uses. The bridge itself runs for real, as a process, from the
// same transpiled script the sandbox image ships. (The real CLIs behind the bridge:
// opencode.test.ts, kilo.test.ts.) Checked:
//   - a one-shot permission reply that fails is retried once; failing again, the turn is aborted and
//     settles `aborted` with the error — it never hangs; failing once then answered, the turn goes on;
//   - a permission request of a session that is not the turn's (nor a child of it) is not answered;
//     events of other sessions are not forwarded; a Task child's are;
//   - the event subscription breaking mid-turn aborts the native turn, which settles `aborted` once
//     the session is idle; the next turn is attached to the new subscription;
//   - a prompt the CLI accepted but never ran settles `aborted` after the start timeout;
//   - no turn starts without a session the CLI knows; `--version` prints `http-agent-live-bridge=4`;
//     SIGTERM stops the bridge with exit 0.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { transpiledBridge } from '../../support/live-bridge-image.ts';

const ROOT = 'ses_stubroot0000000000000001';
const CHILD = 'ses_stubchild000000000000001';
const OTHER = 'ses_stubother000000000000001';

/** The stub: a scripted subset of OpenCode's server API. */
class StubCli {
  server!: Server;
  url = '';
  streams: ServerResponse[] = [];
  prompts: Array<{ session: string; body: unknown }> = [];
  aborts: string[] = [];
  replies: Array<{ id: string; body: unknown }> = [];
  /** Status codes the next permission replies answer with (then 200). */
  replyStatuses: number[] = [];
  busy = new Set<string>();

  async start(): Promise<void> {
    this.server = createServer((req, res) => void this.#handle(req, res));
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', r));
    const a = this.server.address();
    this.url = `http://127.0.0.1:${typeof a === 'object' && a !== null ? a.port : 0}`;
  }

  emit(type: string, properties: Record<string, unknown>): void {
    for (const s of this.streams) s.write(`data: ${JSON.stringify({ id: `evt_${Math.random()}`, type, properties })}\n\n`);
  }

  /** Break every event stream (the CLI's end of the subscription goes away). */
  dropStreams(): void {
    for (const s of this.streams.splice(0)) s.destroy();
  }

  async #handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const body: unknown = chunks.length > 0 ? JSON.parse(Buffer.concat(chunks).toString('utf8')) : undefined;
    const url = req.url ?? '';
    const json = (status: number, value: unknown): void => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(value));
    };
    let m: RegExpExecArray | null;
    if (url === '/event') {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(`data: ${JSON.stringify({ type: 'server.connected', properties: {} })}\n\n`);
      this.streams.push(res);
      return;
    }
    if (req.method === 'GET' && url === '/session/status') return json(200, Object.fromEntries([...this.busy].map((s) => [s, { type: 'busy' }])));
    if (req.method === 'GET' && (m = /^\/session\/([^/]+)$/.exec(url))) return [ROOT, OTHER].includes(m[1]!) ? json(200, { id: m[1] }) : json(404, { name: 'NotFoundError' });
    if (req.method === 'POST' && (m = /^\/session\/([^/]+)\/prompt_async$/.exec(url))) {
      this.prompts.push({ session: m[1]!, body });
      res.writeHead(204);
      return void res.end();
    }
    if (req.method === 'POST' && (m = /^\/session\/([^/]+)\/abort$/.exec(url))) {
      this.aborts.push(m[1]!);
      return json(200, true);
    }
    if (req.method === 'POST' && (m = /^\/permission\/([^/]+)\/reply$/.exec(url))) {
      this.replies.push({ id: m[1]!, body });
      const status = this.replyStatuses.shift() ?? 200;
      return json(status, status === 200 ? true : { name: 'NotFoundError', data: { message: 'no such permission request' } });
    }
    if (req.method === 'GET' && url === '/session') return json(200, [{ id: ROOT }]);
    json(404, { name: 'NotFoundError', data: { message: `stub: ${req.method} ${url}` } });
  }
}

let stub: StubCli;
let bridge: ChildProcess;
let dir: string;
let script: string;
let socket: string;
let bridgeExit: Promise<number | null>;

beforeAll(async () => {
  stub = new StubCli();
  await stub.start();
  dir = mkdtempSync(join(tmpdir(), 'sf-bridge-stub-'));
  socket = join(dir, 'bridge.sock');
  script = transpiledBridge();
  bridge = spawn(process.execPath, [script, 'serve', '--cli', 'opencode', '--attach', stub.url, '--socket', socket, '--start-timeout-ms', '1500'], { stdio: ['ignore', 'ignore', 'pipe'] });
  bridge.stderr!.resume();
  bridgeExit = new Promise((r) => bridge.on('exit', (code) => r(code)));
  await waitFor('the bridge subscribed', () => stub.streams.length === 1);
});

afterAll(async () => {
  if (bridge.exitCode === null) bridge.kill('SIGKILL');
  await new Promise<void>((r) => stub.server.close(() => r()));
  stub.server.closeAllConnections();
  rmSync(dir, { recursive: true, force: true });
});

async function waitFor(what: string, probe: () => boolean, timeoutMs = 20_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!probe()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** `live-bridge turn` as a process: its output lines so far, and its exit. */
function startTurn(turnId: string, session?: string): { lines: () => Array<{ turnId: string; type: string; properties: Record<string, unknown> }>; exit: Promise<number | null>; stderr: () => string } {
  const p = spawn(process.execPath, [script, 'turn', '--socket', socket, '--turn-id', turnId, ...(session !== undefined ? ['--session', session] : []), '--', 'do it'], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  p.stdout.on('data', (c: Buffer) => (out += c.toString('utf8')));
  p.stderr.on('data', (c: Buffer) => (err += c.toString('utf8')));
  return {
    lines: () => out.split('\n').filter(Boolean).map((l) => JSON.parse(l) as { turnId: string; type: string; properties: Record<string, unknown> }),
    exit: new Promise((r) => p.on('exit', (code) => r(code))),
    stderr: () => err,
  };
}

/** The turn is running in the stub: its prompt arrived, the session reports busy. */
async function running(n: number): Promise<void> {
  await waitFor('the prompt reached the CLI', () => stub.prompts.length === n);
  stub.busy.add(ROOT);
  stub.emit('session.status', { sessionID: ROOT, status: { type: 'busy' } });
}

function idle(): void {
  stub.busy.delete(ROOT);
  stub.emit('session.status', { sessionID: ROOT, status: { type: 'idle' } });
  stub.emit('session.idle', { sessionID: ROOT });
}

describe('live bridge v4 against a stub CLI server (named seam)', () => {
  it('--version prints the attested line', async () => {
    const p = spawn(process.execPath, [script, '--version'], { stdio: ['ignore', 'pipe', 'ignore'] });
    let out = '';
    p.stdout.on('data', (c: Buffer) => (out += c.toString('utf8')));
    expect(await new Promise((r) => p.on('exit', r))).toBe(0);
    expect(out).toBe('http-agent-live-bridge=4\n');
  });

  it('forwards the turn\'s own and its Task children\'s events only, answers the child\'s permission once, settles when the root is idle', async () => {
    const t = startTurn('turn-1', ROOT);
    await running(1);
    stub.emit('message.updated', { sessionID: OTHER, info: { id: 'msg_o', sessionID: OTHER, role: 'assistant' } });
    stub.emit('permission.asked', { id: 'per_other', sessionID: OTHER, permission: 'bash', patterns: [], metadata: {}, always: [] });
    stub.emit('session.created', { sessionID: CHILD, info: { id: CHILD, parentID: ROOT } });
    stub.emit('permission.asked', { id: 'per_child', sessionID: CHILD, permission: 'bash', patterns: [], metadata: {}, always: [] });
    await waitFor('the child\'s permission answered', () => stub.replies.length === 1);
    expect(stub.replies).toEqual([{ id: 'per_child', body: { reply: 'once' } }]);
    idle();
    expect(await t.exit).toBe(0);
    const lines = t.lines();
    expect(lines.every((l) => l.turnId === 'turn-1')).toBe(true);
    expect(lines.some((l) => JSON.stringify(l).includes(OTHER))).toBe(false);
    expect(lines.map((l) => l.type)).toEqual(['bridge.turn', 'session.status', 'session.created', 'permission.asked', 'bridge.permission.replied', 'session.status', 'settled']);
    expect(lines.at(-1)).toEqual({ turnId: 'turn-1', type: 'settled', properties: { sessionID: ROOT } });
    expect(stub.prompts[0]).toEqual({ session: ROOT, body: { parts: [{ type: 'text', text: 'do it' }] } });
  });

  it('retries a failed one-shot permission reply once; answered then, the turn goes on', async () => {
    stub.replies = [];
    stub.replyStatuses = [500];
    const t = startTurn('turn-2', ROOT);
    await running(2);
    stub.emit('permission.asked', { id: 'per_2', sessionID: ROOT, permission: 'edit', patterns: [], metadata: {}, always: [] });
    await waitFor('two reply attempts', () => stub.replies.length === 2);
    idle();
    expect(await t.exit).toBe(0);
    expect(stub.aborts).toEqual([]);
    expect(t.lines().filter((l) => l.type.startsWith('bridge.permission')).map((l) => [l.type, l.properties.attempt])).toEqual([['bridge.permission.reply_failed', 1], ['bridge.permission.replied', 2]]);
    expect(t.lines().at(-1)?.properties).toEqual({ sessionID: ROOT });
  });

  it('a reply that fails twice aborts the native turn, which settles aborted with the error instead of hanging', async () => {
    stub.replies = [];
    stub.replyStatuses = [404, 404];
    const t = startTurn('turn-3', ROOT);
    await running(3);
    stub.emit('permission.asked', { id: 'per_3', sessionID: ROOT, permission: 'edit', patterns: [], metadata: {}, always: [] });
    await waitFor('the abort', () => stub.aborts.length === 1);
    expect(stub.aborts).toEqual([ROOT]);
    expect(stub.replies.map((r) => r.id)).toEqual(['per_3', 'per_3']);
    idle();
    expect(await t.exit).toBe(0);
    const settled = t.lines().at(-1)!;
    expect(settled.type).toBe('settled');
    expect(settled.properties).toMatchObject({ sessionID: ROOT, aborted: true });
    expect(String(settled.properties.error)).toMatch(/^permission reply failed twice \(HTTP 404: .*\); turn aborted$/);
  });

  it('a subscription that breaks mid-turn aborts the native turn; it settles aborted once idle, and the next turn rides the new subscription', async () => {
    stub.aborts = [];
    const t = startTurn('turn-4', ROOT);
    await running(4);
    stub.dropStreams();
    await waitFor('the abort', () => stub.aborts.length === 1);
    await waitFor('a new subscription', () => stub.streams.length === 1);
    // The old stream is gone, so the idle is seen by the bridge's status poll, not an event.
    stub.busy.delete(ROOT);
    expect(await t.exit).toBe(0);
    const settled = t.lines().at(-1)!;
    expect(settled).toMatchObject({ type: 'settled', properties: { sessionID: ROOT, aborted: true } });
    expect(String(settled.properties.error)).toContain('event subscription lost');
    const next = startTurn('turn-5', ROOT);
    await running(5);
    await waitFor('the turn\'s first line', () => next.lines().length > 0);
    expect(next.lines()[0]?.properties).toMatchObject({ sessionID: ROOT, subscription: 2 });
    idle();
    expect(await next.exit).toBe(0);
  });

  it('a prompt the CLI accepted but never became busy with settles aborted after the start timeout, never hangs', async () => {
    const t = startTurn('turn-lazy', ROOT);
    await waitFor('the prompt reached the CLI', () => stub.prompts.length === 6);
    expect(await t.exit).toBe(0);
    expect(t.lines().at(-1)).toEqual({ turnId: 'turn-lazy', type: 'settled', properties: { sessionID: ROOT, aborted: true, error: 'the CLI accepted the prompt but never started the turn' } });
  });

  it('refuses a session the CLI does not know and a replayed turn id; SIGTERM stops it with exit 0', async () => {
    const unknown = startTurn('turn-6', 'ses_nosuchsession00000000001');
    expect(await unknown.exit).toBe(1);
    expect(unknown.stderr()).toContain('session_not_found');
    const replay = startTurn('turn-5', ROOT);
    expect(await replay.exit).toBe(1);
    expect(replay.stderr()).toContain('turn_replayed');
    expect(stub.prompts).toHaveLength(6);
    bridge.kill('SIGTERM');
    expect(await bridgeExit).toBe(0);
  });
});
