// The runner SDK's Codex turn-end detector (R-S5: `turn/completed` for the CURRENT turn only;
// locator = root thread id) against the REAL pinned Codex 0.171.0 app-server, driven over JSON-RPC
// on stdio the way a runner drives it, with the loopback fake Responses API as the model: a turn
// ends on its own `turn/completed` with the agent's text; a second turn on the same process ends on
// ITS completion and the model receives the history once; a new app-server process resuming the
// thread (`thread/resume`, what a RESTORED member's runner does) keeps the thread id and the
// history; a failing model API is a failed turn, never an empty success.
// Seam, named: the app-server runs as a process on this machine (not in a member container), since
// the runner talks to it over the process's stdin/stdout, which the fleet's containers do not
// expose to tests; the CLI, its protocol and its model traffic are all real.
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { JsonLineDecoder, createCodexDetector, driveDetector, readJsonLines, type TurnEndEvidence } from '../../../src/runner-sdk/index.ts';
import { CODEX_VERSION, codexConfigToml, codexImageFiles } from '../../support/codex-cli.ts';
import { ackMarker, startFakeModelApi, type FakeModelApi } from '../../support/fake-model-api.ts';
import { SessionHistory } from '../../support/history-checker.ts';
import { CODEX_HISTORY } from '../../support/history-profiles.ts';

let api: FakeModelApi;
let home: string;
let binary: string;
/** Every request of every turn checked in full (test/support/history-checker.ts). */
const session = new SessionHistory(CODEX_HISTORY);

beforeAll(async () => {
  api = await startFakeModelApi(ackMarker);
  binary = codexImageFiles()[0]!.source;
  home = mkdtempSync(join(tmpdir(), 'sf-codex-home-'));
  mkdirSync(join(home, '.codex'));
  // No retries of failed model calls: the failure case below ends at once.
  writeFileSync(join(home, '.codex', 'config.toml'), `${codexConfigToml(api.url)}request_max_retries = 0\nstream_max_retries = 0\n`);
}, 120_000);

afterAll(async () => {
  await api?.close();
  rmSync(home, { recursive: true, force: true });
});

/** A Codex app-server process and a JSON-RPC request helper (answers are read by the detector's stream). */
class AppServer {
  readonly child: ChildProcessWithoutNullStreams;
  readonly decoder = new JsonLineDecoder();
  #id = 0;

  constructor() {
    this.child = spawn(binary, ['app-server'], { env: { ...process.env, HOME: home, RUST_LOG: 'error' }, cwd: '/', stdio: ['pipe', 'pipe', 'pipe'] });
    this.child.stderr.resume();
  }

  send(method: string, params?: unknown): number {
    const id = ++this.#id;
    this.child.stdin.write(`${JSON.stringify({ id, method, ...(params !== undefined ? { params } : {}) })}\n`);
    return id;
  }

  notify(method: string): void {
    this.child.stdin.write(`${JSON.stringify({ method })}\n`);
  }

  /** Reads messages until the answer to request `id` (for set-up calls, before any turn). */
  async answer(id: number): Promise<{ result?: Record<string, unknown>; error?: unknown }> {
    let found: { result?: Record<string, unknown>; error?: unknown } | undefined;
    await readJsonLines(this.child.stdout, (m) => {
      if ((m as { id?: unknown }).id === id) found = m as typeof found;
    }, { stopWhen: () => found !== undefined, decoder: this.decoder, signal: AbortSignal.timeout(30_000) });
    expect(found, `answer to request ${id}`).toBeDefined();
    return found!;
  }

  async start(): Promise<void> {
    await this.answer(this.send('initialize', { clientInfo: { name: 'sandbox-fleet-test', version: '1.0.0' } }));
    this.notify('initialized');
  }

  /** One turn: `turn/start`, then the detector reads the stream until the native end; its requests checked in full. */
  async turn(threadId: string, marker: string, reply: string | null = `ack ${marker}`): Promise<TurnEndEvidence> {
    const before = api.requests.length;
    const requestId = this.send('turn/start', { threadId, input: [{ type: 'text', text: `Please remember ${marker}.` }] });
    const detector = createCodexDetector({ expectedLocator: threadId, turnStartRequestId: requestId });
    const { evidence } = await driveDetector(this.child.stdout, detector, { decoder: this.decoder, signal: AbortSignal.timeout(60_000) });
    session.expectTurn(api.requests.slice(before), { prompt: `Please remember ${marker}.`, reply });
    return evidence;
  }

  stop(): void {
    this.child.kill('SIGTERM');
  }
}

describe(`Codex ${CODEX_VERSION} app-server through the runner SDK's detector`, () => {
  let threadId = '';

  it('ends each turn on its own turn/completed, with the agent text, and sends the history once', async () => {
    const server = new AppServer();
    try {
      await server.start();
      const started = await server.answer(server.send('thread/start', {}));
      threadId = String((started.result?.thread as { id?: unknown } | undefined)?.id ?? '');
      expect(threadId).toMatch(/^[0-9a-f-]{36}$/);
      const first = await server.turn(threadId, 'MARK-ONE');
      expect(first).toMatchObject({ nativeTurnEnded: true, succeeded: true, endKind: 'turn_completed', observedLocator: threadId, assistantText: 'ack MARK-ONE' });
      const second = await server.turn(threadId, 'MARK-TWO');
      expect(second).toMatchObject({ nativeTurnEnded: true, succeeded: true, observedLocator: threadId, assistantText: 'ack MARK-TWO' });
      expect(second.nativeTurnId).not.toBe(first.nativeTurnId);
    } finally {
      server.stop();
    }
  });

  it('a new process resuming the thread keeps its id and history; a failing model API fails the turn', async () => {
    const server = new AppServer();
    try {
      await server.start();
      const resumed = await server.answer(server.send('thread/resume', { threadId }));
      expect((resumed.result?.thread as { id?: unknown } | undefined)?.id).toBe(threadId);
      const third = await server.turn(threadId, 'MARK-THREE');
      expect(third).toMatchObject({ nativeTurnEnded: true, succeeded: true, observedLocator: threadId });

      api.failNext(10, 500);
      const failed = await server.turn(threadId, 'MARK-FOUR', null);
      api.failNext(0, 500);
      expect(failed).toMatchObject({ nativeTurnEnded: true, succeeded: false, observedLocator: threadId });
      expect(failed.error ?? '').not.toBe('');
    } finally {
      server.stop();
    }
  });
});
