// RunTurn's driver rules (turn-runner.ts) over two named seams: a fake runner backend (BeginTurn's
// stored answers, the member record, CompleteTurn) and a fake exec relay whose sessions the test
// scripts. The real stack runs the same rules in test/integration/cli-history/claude-run-turn-
// driver.test.ts; here each race is made deterministic:
// - exactly one call drives a turn: two calls with one key on one replica, and a repeat whose begin
//   replays another call's answer stamped later than the repeat was called (a slow begin, or a
//   replica whose clock is ahead), never both run the CLI;
// - a caller that leaves during the begin does not leave the turn without a driver, and one that
//   leaves mid-turn is let go at once while the turn runs on;
// - a repeat completes a turn whose driver's lease lapsed at once, stops waiting when its own caller
//   leaves, and the turn's deadline is capped at the fleet's longest turn;
// - memory: output is credited to the host only for complete lines the caller took, and a caller
//   that does not read stops the drive after about a window's worth of events;
// - Codex, one `codex exec --json` process per turn: the prompt goes to stdin as the host grants
//   credit and stdin is closed only once all of it is written; the end is read by the `codex exec`
//   detector (not the app-server's); a profile asking to keep Codex running is refused before any
//   begin. The real Codex does the same in test/integration/cli-history/codex-run-turn.test.ts.
import { describe, expect, it } from 'vitest';
import type { ExecRelay } from '../../../src/control-plane/exec-relay.ts';
import { encodeTurnFlags, type GroupRecord, type MemberRecord } from '../../../src/control-plane/records.ts';
import type { FleetCompletion, FleetTurn } from '../../../src/control-plane/runner-backend.ts';
import { TurnRunner, type TurnRunnerDeps } from '../../../src/control-plane/turn-runner.ts';
import type { ExecEvent, ExecSession, ExecStartInput, RunTurnEvent, RunTurnInput } from '../../../src/core/exec-port.ts';
import type { BeginTurnInput, BeginTurnView, CompleteTurnInput, CompleteTurnView } from '../../../src/core/runner-port.ts';

const SID = '8f14e45f-ceea-467f-a0e6-0b1c7e5d2a01';
const INIT = `${JSON.stringify({ type: 'system', subtype: 'init', session_id: SID, uuid: 'u-1' })}\n`;
const RESULT = `${JSON.stringify({ type: 'result', subtype: 'success', is_error: false, result: 'ok', session_id: SID, uuid: 'u-2' })}\n`;
const MAX_MS = 60_000;

const tick = (ms = 20): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Rejects if `p` has not settled within `ms` (the bugs these tests catch are hangs and long waits). */
function within<T>(ms: number, p: Promise<T>, what: string): Promise<T> {
  return Promise.race([p, new Promise<never>((_r, reject) => setTimeout(() => reject(new Error(`${what}: nothing after ${ms} ms`)), ms).unref())]);
}

/** SEAM: one exec the test scripts (output, exit) and watches (credit, events the drive pulled). */
class ScriptedSession implements ExecSession {
  readonly started = { execId: 'x-test-0001', hostId: 'host-a', hostEpoch: 1, generation: 1, containerId: 'c'.repeat(64), incarnation: '1000' };
  consumedBytes = 0;
  pulled = 0;
  /** What the drive wrote to stdin, frame by frame, and whether it closed stdin. */
  readonly stdinFrames: string[] = [];
  stdinClosed = false;
  readonly #queue: ExecEvent[] = [];
  #wake: (() => void) | undefined;

  stdout(text: string | Buffer): void {
    this.#push({ kind: 'output', stream: 'stdout', data: Buffer.isBuffer(text) ? text : Buffer.from(text) });
  }

  exit(exitCode = 0): void {
    this.#push({ kind: 'exit', exit: { end: 'exited', exitCode, stdoutBytes: 0, stderrBytes: 0, durationMs: 1 } });
  }

  /** The host grants `bytes` of stdin credit. */
  credit(bytes: number): void {
    this.#push({ kind: 'stdin_credit', bytes });
  }

  /** A whole turn of Claude's: init, result, exit. */
  playTurn(): void {
    this.stdout(INIT);
    this.stdout(RESULT);
    this.exit();
  }

  #push(e: ExecEvent): void {
    this.#queue.push(e);
    this.#wake?.();
  }

  async *events(): AsyncIterable<ExecEvent> {
    for (;;) {
      const e = this.#queue.shift();
      if (e !== undefined) {
        this.pulled += 1;
        yield e;
        if (e.kind === 'exit') return;
        continue;
      }
      await new Promise<void>((r) => (this.#wake = r));
      this.#wake = undefined;
    }
  }

  consumed(bytes: number): void {
    this.consumedBytes += bytes;
  }

  writeStdin(bytes: Uint8Array): void {
    this.stdinFrames.push(Buffer.from(bytes).toString('utf8'));
  }

  closeStdin(): void {
    this.stdinClosed = true;
  }
  cancel(): void {}
  abandon(): void {}
  detach(): void {}
}

/** SEAM: the exec relay: records each start and hands out a scripted session (played at once unless `hold`). */
class ScriptedRelay {
  readonly starts: ExecStartInput[] = [];
  readonly sessions: ScriptedSession[] = [];
  hold = false;

  async exec(input: ExecStartInput): Promise<ExecSession> {
    this.starts.push(input);
    const s = new ScriptedSession();
    this.sessions.push(s);
    if (!this.hold) setTimeout(() => s.playTurn(), 5);
    return s;
  }
}

/**
 * SEAM: the runner backend over one member record: BeginTurn stores its answer per key (a repeat gets
 * it back) and writes the driver it was given; CompleteTurn ends the turn and records it.
 */
class FakeBackend {
  member: MemberRecord = { session: { memberId: 'claude', cli: 'claude_code', phase: 'FRESH', completedTurns: 0 } };
  readonly answers = new Map<string, BeginTurnView>();
  readonly completions: { input: CompleteTurnInput; fleet: FleetCompletion | undefined }[] = [];
  requires = 0;
  /** Resolved before a begin that creates a turn writes it (a slow begin). */
  beginGate: Promise<void> = Promise.resolve();
  /** The writing replica's clock minus ours. */
  clockAheadMs = 0;

  readonly groups = {
    require: async (): Promise<{ value: GroupRecord; revision: number }> => {
      this.requires += 1;
      return { value: { groupId: 'g-1', members: [this.member] } as unknown as GroupRecord, revision: 1 };
    },
  };

  async beginTurn(input: BeginTurnInput, fleet?: FleetTurn): Promise<BeginTurnView> {
    const stored = this.answers.get(input.idempotencyKey);
    if (stored !== undefined) return stored;
    await this.beginGate;
    const again = this.answers.get(input.idempotencyKey);
    if (again !== undefined) return again;
    const now = Date.now() + this.clockAheadMs;
    const turnId = `t-${input.idempotencyKey}`;
    const token = (fleet as { driver?: { token: string } } | undefined)?.driver?.token;
    const view: BeginTurnView = { turnId, contextState: 'NEW', hostId: 'host-a', hostEpoch: 1, generation: 1, containerId: 'c'.repeat(64), startedAtMs: now, ...(token !== undefined ? { driverToken: token } : {}) };
    this.answers.set(input.idempotencyKey, view);
    this.member = {
      ...this.member,
      session: { ...this.member.session, phase: 'IN_TURN', inFlight: { turnId, contextState: 'NEW', startedAtMs: now } },
      ...(token !== undefined ? { turnDriver: { turnId, token, replicaId: 'cp-test', leaseUntilMs: now + 30_000 } } : {}),
    };
    return view;
  }

  async completeTurn(input: CompleteTurnInput, fleet?: FleetCompletion): Promise<CompleteTurnView> {
    this.completions.push({ input, fleet });
    const e = input.evidence;
    const outcome = e.nativeTurnEnded ? 'completed' : 'unconfirmed';
    const began = this.member.session.inFlight?.startedAtMs ?? 0;
    this.member = {
      session: { memberId: 'claude', cli: 'claude_code', phase: e.nativeTurnEnded ? 'RETAINED' : 'UNCONFIRMED', completedTurns: 1, lastTurn: { turnId: input.turnId, outcome } },
      turns: [{ turnId: input.turnId, contextState: 'NEW', generation: 1, beganAtMs: began, durationMs: 0, kind: e.kind, flags: encodeTurnFlags(e), outcome }],
    };
    return { outcome, sessionKept: e.nativeTurnEnded, nextContextState: e.nativeTurnEnded ? 'RESTORED' : 'LOST' };
  }

  async renewTurnDriver(): Promise<boolean> {
    return true;
  }

  async openGroup(): Promise<never> {
    throw new Error('not used');
  }

  async stopGroup(): Promise<never> {
    throw new Error('not used');
  }

  async getGroupState(): Promise<never> {
    throw new Error('not used');
  }
}

function setUp(cliProfiles: Record<string, unknown> = { claude_code: { binary: '/usr/local/bin/claude', env: {}, keepProcess: false } }): { backend: FakeBackend; relay: ScriptedRelay; turns: TurnRunner } {
  const backend = new FakeBackend();
  const relay = new ScriptedRelay();
  const quiet = { warn: () => undefined, info: () => undefined, debug: () => undefined, error: () => undefined };
  const deps = {
    config: { cliProfiles, runTurnMaxMs: MAX_MS },
    groups: backend.groups,
    metrics: { runTurns: { inc: () => undefined } },
    logger: quiet,
    now: () => Date.now(),
  } as unknown as TurnRunnerDeps;
  return { backend, relay, turns: new TurnRunner(deps, backend as never, relay as unknown as ExecRelay) };
}

function request(key: string, more: Partial<RunTurnInput> = {}): RunTurnInput {
  return { idempotencyKey: key, groupId: 'g-1', memberId: 'claude', prompt: 'hello', model: '', timeoutMs: 0, ...more };
}

/** Consume a call as the API server does: stop at the first event after the caller left. */
async function consume(turns: AsyncIterable<RunTurnEvent>, signal: AbortSignal = new AbortController().signal): Promise<RunTurnEvent[]> {
  const got: RunTurnEvent[] = [];
  for await (const e of turns) {
    if (signal.aborted) break;
    got.push(e);
  }
  return got;
}

const endOf = (events: RunTurnEvent[]) => events.find((e): e is Extract<RunTurnEvent, { kind: 'end' }> => e.kind === 'end')?.end;

describe('RunTurn over a fake runner backend and a scripted exec relay (seams)', () => {
  it('two calls with one key on one replica: one begin creates the turn, the CLI runs once, both get its end', async () => {
    const { backend, relay, turns } = setUp();
    let open!: () => void;
    backend.beginGate = new Promise((r) => (open = r));
    const a = consume(turns.runTurn(request('k-1'), new AbortController().signal));
    const b = consume(turns.runTurn(request('k-1'), new AbortController().signal));
    await tick();
    open();
    const [ea, eb] = await within(5_000, Promise.all([a, b]), 'both calls');
    expect(relay.starts).toHaveLength(1);
    expect(endOf(ea)?.completion).toMatchObject({ outcome: 'completed' });
    expect(endOf(eb)?.completion).toEqual(endOf(ea)?.completion);
    expect(backend.completions).toHaveLength(1);
  });

  it('a repeat whose begin replays another call\'s answer, stamped later than the repeat was called, does not drive', async () => {
    const { backend, relay, turns } = setUp();
    // Another replica (clock 10 s ahead) began the turn for key k-2 with its own driver token.
    backend.clockAheadMs = 10_000;
    await backend.beginTurn({ idempotencyKey: 'k-2', groupId: 'g-1', memberId: 'claude' }, { commandDigest: undefined, driver: { token: 'other-replica-token', leaseMs: 30_000 } } as FleetTurn);
    const repeat = consume(turns.runTurn(request('k-2'), new AbortController().signal));
    await tick(700);
    expect(relay.starts).toHaveLength(0);
    // The other driver ends the turn; the repeat answers that end.
    await backend.completeTurn({ idempotencyKey: 'k-2:complete', groupId: 'g-1', memberId: 'claude', turnId: 't-k-2', evidence: { kind: 'result', nativeTurnEnded: true, succeeded: true, cleanupFinished: true, transportUsable: true, locatorUsable: true, processExited: true, exitConfirmed: true } });
    const events = await within(5_000, repeat, 'the repeat');
    expect(endOf(events)?.completion).toMatchObject({ outcome: 'completed', sessionKept: true });
    expect(relay.starts).toHaveLength(0);
  });

  it('a caller that leaves during the begin does not leave the turn without a driver', async () => {
    const { backend, relay, turns } = setUp();
    let open!: () => void;
    backend.beginGate = new Promise((r) => (open = r));
    const leave = new AbortController();
    const call = consume(turns.runTurn(request('k-3'), leave.signal), leave.signal);
    await tick();
    leave.abort();
    open();
    expect(await within(5_000, call, 'the call')).toEqual([]);
    await within(5_000, (async () => {
      while (backend.completions.length === 0) await tick();
    })(), 'the turn\'s completion');
    expect(relay.starts).toHaveLength(1);
    expect(backend.completions[0]!.input.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true });
  });

  it('a caller that leaves mid-turn is let go at once; the turn runs on to the CLI\'s end and is completed', async () => {
    const { backend, relay, turns } = setUp();
    relay.hold = true;
    const leave = new AbortController();
    const it = turns.runTurn(request('k-9'), leave.signal)[Symbol.asyncIterator]();
    expect((await it.next()).value).toMatchObject({ kind: 'begun' });
    while (relay.sessions.length === 0) await tick();
    const s = relay.sessions[0]!;
    s.stdout(INIT);
    expect((await it.next()).value).toMatchObject({ kind: 'cli_event' });
    const pending = it.next();
    leave.abort();
    expect(await within(2_000, pending, 'the call of a caller that left')).toMatchObject({ done: true });
    expect(backend.completions).toHaveLength(0);
    s.stdout(RESULT);
    s.exit();
    await within(5_000, (async () => {
      while (backend.completions.length === 0) await tick();
    })(), 'the turn\'s completion');
    expect(backend.completions[0]!.input.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true });
  });

  it('a repeat completes a turn whose driver\'s lease lapsed as not ended, at once', async () => {
    const { backend, relay, turns } = setUp();
    await backend.beginTurn({ idempotencyKey: 'k-4', groupId: 'g-1', memberId: 'claude' }, { commandDigest: undefined, driver: { token: 'dead-driver-token', leaseMs: 30_000 } } as FleetTurn);
    backend.member = { ...backend.member, turnDriver: { ...backend.member.turnDriver!, leaseUntilMs: Date.now() - 6_000 } };
    const events = await within(5_000, consume(turns.runTurn(request('k-4'), new AbortController().signal)), 'the repeat');
    expect(endOf(events)?.evidence).toMatchObject({ nativeTurnEnded: false, kind: 'disconnect' });
    expect(backend.completions).toHaveLength(1);
    expect(backend.completions[0]!.fleet).toEqual({ takeOverFrom: 'dead-driver-token' });
    expect(relay.starts).toHaveLength(0);
  });

  it('a repeat waiting for another driver stops polling when its caller leaves', async () => {
    const { backend, turns } = setUp();
    await backend.beginTurn({ idempotencyKey: 'k-5', groupId: 'g-1', memberId: 'claude' }, { commandDigest: undefined, driver: { token: 'live-driver-token', leaseMs: 30_000 } } as FleetTurn);
    backend.member = { ...backend.member, session: { ...backend.member.session, inFlight: { ...backend.member.session.inFlight!, startedAtMs: Date.now() - 5_000 } } };
    const leave = new AbortController();
    const call = consume(turns.runTurn(request('k-5'), leave.signal), leave.signal);
    await tick(1_200);
    leave.abort();
    await within(2_000, call, 'the call after its caller left');
    const reads = backend.requires;
    await tick(1_500);
    expect(backend.requires).toBe(reads);
  });

  it('the turn\'s deadline is capped at the fleet\'s longest turn', async () => {
    const { relay, turns } = setUp();
    await within(5_000, consume(turns.runTurn(request('k-6', { timeoutMs: 0 }), new AbortController().signal)), 'turn without a timeout');
    expect(relay.starts[0]!.timeoutMs).toBe(MAX_MS);
    const second = setUp();
    await within(5_000, consume(second.turns.runTurn(request('k-7', { timeoutMs: 24 * 3_600_000 }), new AbortController().signal)), 'turn with a day\'s timeout');
    expect(second.relay.starts[0]!.timeoutMs).toBe(MAX_MS);
  });

  it('output is credited only for complete lines the caller took; a caller that does not read stops the drive', async () => {
    const { relay, turns } = setUp();
    relay.hold = true;
    const it = turns.runTurn(request('k-8'), new AbortController().signal)[Symbol.asyncIterator]();
    expect((await it.next()).value).toMatchObject({ kind: 'begun' });
    while (relay.sessions.length === 0) await tick();
    const s = relay.sessions[0]!;
    s.stdout(INIT);
    // 2 MiB of an unfinished line: held until its newline, never credited before it is passed on.
    s.stdout(Buffer.alloc(2 * 1024 * 1024, 120));
    await tick(50);
    expect(s.consumedBytes).toBe(0);
    expect((await it.next()).value).toMatchObject({ kind: 'cli_event' });
    expect(s.consumedBytes).toBe(INIT.length);
    s.stdout('\n');
    expect((await it.next()).value).toMatchObject({ kind: 'cli_event' });
    expect(s.consumedBytes).toBe(INIT.length + 2 * 1024 * 1024 + 1);
    // Eight lines of 512 KiB the caller does not read: the drive stops pulling after about 1 MiB.
    const pulledBefore = s.pulled;
    for (let i = 0; i < 8; i++) s.stdout(Buffer.concat([Buffer.alloc(512 * 1024, 121), Buffer.from('\n')]));
    await tick(100);
    expect(s.pulled - pulledBefore).toBeLessThanOrEqual(3);
    expect(s.consumedBytes).toBe(INIT.length + 2 * 1024 * 1024 + 1);
    s.stdout(RESULT);
    s.exit();
    const rest: RunTurnEvent[] = [];
    for (let r = await it.next(); r.done !== true; r = await it.next()) rest.push(r.value);
    expect(rest.filter((e) => e.kind === 'cli_event')).toHaveLength(9);
    expect(endOf(rest)?.evidence).toMatchObject({ nativeTurnEnded: true });
  });

  describe('Codex: one `codex exec --json` process per turn', () => {
    const THREAD = '01a23312-7f7b-7421-852d-0a55b8a2905d';
    const line = (e: unknown): string => `${JSON.stringify(e)}\n`;
    const codexSetUp = (profile: Record<string, unknown> = { binary: '/usr/local/bin/codex', env: { HOME: '/root' } }) => {
      const t = setUp({ codex: profile });
      t.backend.member = { session: { memberId: 'claude', cli: 'codex', phase: 'FRESH', completedTurns: 0 } };
      t.relay.hold = true;
      return t;
    };

    it('writes the prompt to stdin as credit comes, closes stdin once it is all written, and ends on turn.completed', async () => {
      const { backend, relay, turns } = codexSetUp();
      const call = consume(turns.runTurn(request('k-c1', { prompt: 'resume --last' }), new AbortController().signal));
      while (relay.sessions.length === 0) await tick();
      expect(relay.starts[0]).toMatchObject({ argv: ['/usr/local/bin/codex', 'exec', '--json', '--skip-git-repo-check', '-'], stdin: true });
      const s = relay.sessions[0]!;
      s.credit(4);
      await tick();
      expect([s.stdinFrames, s.stdinClosed]).toEqual([['resu'], false]);
      s.credit(1_000);
      await tick();
      expect([s.stdinFrames, s.stdinClosed]).toEqual([['resu', 'me --last'], true]);
      s.stdout(line({ type: 'thread.started', thread_id: THREAD }));
      s.stdout(line({ type: 'turn.started' }));
      s.stdout(line({ type: 'item.completed', item: { id: 'item_1', type: 'agent_message', text: 'ack' } }));
      s.stdout(line({ type: 'turn.completed', usage: { input_tokens: 10, output_tokens: 5 } }));
      s.exit();
      const end = endOf(await within(5_000, call, 'the Codex turn'));
      expect(end).toMatchObject({ observedLocator: THREAD, evidence: { kind: 'turn_completed', nativeTurnEnded: true, succeeded: true, processExited: true, exitConfirmed: true, exitCode: 0 } });
      expect(backend.completions[0]!.input).toMatchObject({ observedLocator: THREAD, evidence: { nativeTurnEnded: true, succeeded: true } });
    });

    it('a turn.failed is a failed native end; stdout that is not Codex\'s end (an app-server turn/completed) is not one', async () => {
      const { relay, turns } = codexSetUp();
      const failed = consume(turns.runTurn(request('k-c2'), new AbortController().signal));
      while (relay.sessions.length === 0) await tick();
      const s = relay.sessions[0]!;
      s.credit(1_000);
      s.stdout(line({ type: 'thread.started', thread_id: THREAD }));
      s.stdout(line({ type: 'turn.failed', error: { message: 'model unavailable' } }));
      s.exit(1);
      expect(endOf(await within(5_000, failed, 'the failed turn'))?.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false, exitCode: 1, errorMessage: 'model unavailable' });

      const other = codexSetUp();
      const notCodex = consume(other.turns.runTurn(request('k-c3'), new AbortController().signal));
      while (other.relay.sessions.length === 0) await tick();
      const s2 = other.relay.sessions[0]!;
      s2.stdout(line({ method: 'turn/completed', params: { threadId: THREAD, turn: { id: 'turn-1', status: 'completed' } } }));
      s2.exit();
      expect(endOf(await within(5_000, notCodex, 'the turn without an end'))?.evidence).toMatchObject({ nativeTurnEnded: false });
    });

    it('a Codex profile asking to keep the process is refused cli_unsupported before any begin', async () => {
      const { backend, relay, turns } = codexSetUp({ binary: 'codex', env: {}, keepProcess: true });
      const refused = await consume(turns.runTurn(request('k-c4'), new AbortController().signal)).then(() => undefined, (e: unknown) => e);
      expect(refused).toMatchObject({ reason: 'cli_unsupported', message: expect.stringContaining('one `codex exec` process per turn') });
      expect(backend.answers.size).toBe(0);
      expect(relay.starts).toHaveLength(0);
    });
  });
});
