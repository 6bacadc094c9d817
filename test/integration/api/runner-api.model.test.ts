// MODEL-BASED test of the runner API over the wire (issue 5 "Tests"; R-S1..R-S3, R-S5, R-S6, R-S8,
// R-R2, R-I1). fast-check drives random command sequences through the runner SDK client over mTLS
// → ApiServer → the real ControlPlane's RunnerBackend → real NATS, a real host agent and a real
// dockerd host (fleet-harness.ts; nothing mocked): begin turn (no locator / the saved one / a wrong
// one), complete turn (right / new / missing observed locator × every kind of R-S5 evidence),
// stale completes, clean and unclean stops, resume by beginning a turn, re-open, concurrent
// duplicates (same call + same idempotency key twice at once), races of two begins with different
// keys (R-S8), begins on all members at once, and RESTARTS of the control plane and API server
// (a new ControlPlane + ApiServer on the same NATS and host; turns in flight must survive).
//
// A small model per member (phase, expected saved locator, completed turns, whether the process that
// ran the last turn is kept, the turn in flight) predicts every answer exactly, and each answer is
// also checked against the invariants, stated on what the system itself reported (its answers and
// the group read back via GetGroupState before and after each command), not on the model:
//   - a saved locator read back is never replaced by a different one once set, and every answer
//     that names the saved locator names that one;
//   - a turn is refused whenever the saved locator cannot be confirmed (mismatch, missing, LOST);
//   - NEW only while the system shows no completed turn; LIVE only after the system's own last
//     CompleteTurn answer promised LIVE (no stop since) and on the same container; RESTORED only on
//     retained state (completed turns and a saved locator shown) without such a promise; one turn
//     in flight per member; every LOST has a reason.
// Each run uses a fresh conversation; the fleet is shared across runs. Runs: MODEL_RUNS per seed
// (test/support/property-runs.ts; ARCHITECTURE.md "## Testing" states the CI budget) for each seed
// of a fixed list plus one random seed; every seed is printed before it runs. FC_SEED=<seed>
// replays one seed, MODEL_SHRINK=1 shrinks a failure.
import fc from 'fast-check';
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiServer } from '../../../src/api/runner-server.ts';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { ContextState, GroupState, MemberState, StopOutcome, TurnEndKind, type Member } from '../../../src/gen/sandboxfleet/v1/common.ts';
import type { BeginTurnResponse, CompleteTurnResponse, GetGroupStateResponse, TurnEndEvidence } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { RunnerClient, RunnerError, type CliKind } from '../../../src/runner-sdk/index.ts';
import { createTestPki, type TestPki } from '../../support/certs.ts';
import { MODEL_RUNS, modelSeeds } from '../../support/property-runs.ts';
import { startFleet, type Fleet } from '../control-plane/fleet-harness.ts';

const HOST = 'host-a';
const MAX_COMMANDS = 25;
/** Seeds every CI run replays (so what CI proves is the same every time), plus one random seed. */
const FIXED_SEEDS = [0x5eed0001, 0x5eed0002];
const SEEDS = modelSeeds(FIXED_SEEDS);
/** Per-run time allowance for the test timeout (a run of 25 commands takes a few seconds here). */
const RUN_BUDGET_MS = 45_000;

// ---------------------------------------------------------------------------------------------
// The model.

type Phase = 'FRESH' | 'IN_TURN' | 'RETAINED' | 'UNCONFIRMED' | 'LOST';
type Ctx = 'NEW' | 'LIVE' | 'RESTORED';
type Outcome = 'completed' | 'failed_kept' | 'failed_before_session' | 'unconfirmed' | 'locator_mismatch' | 'locator_missing';

interface MemberModel {
  readonly memberId: string;
  readonly cli: CliKind;
  phase: Phase;
  saved: string | undefined;
  completed: number;
  /** The process that ran the last completed turn is still running and may be reused (LIVE). */
  processKept: boolean;
  inFlight: { turnId: string; ctx: Ctx; locator: string | undefined } | undefined;
  lastTurn: { turnId: string; outcome: Outcome } | undefined;
}

interface Model {
  readonly conversationId: string;
  readonly members: MemberModel[];
  group: 'RUNNING' | 'STOPPED';
  lastStopClean: boolean | undefined;
}

/** What the system reported, kept to check it against itself across the run (not the model). */
interface Real {
  groupId: string;
  /** The first non-empty saved locator read back per member: it may never change (R-S2, R-R2). */
  readonly firstSaved: Map<string, string>;
  /** Each member as last read back via GetGroupState (or OpenGroup): the system's state before a command. */
  readonly lastRead: Map<string, Member>;
  /**
   * Members whose last CompleteTurn answer said the next turn is LIVE (the process was kept), with
   * no stop since. (GetGroupState's process_kept cannot serve here: it reads "the last begin was
   * LIVE", src/api/mapping.ts, not "the last turn's process was kept" as the proto says.)
   */
  readonly promisedLive: Set<string>;
  readonly log: string[];
}

// ---------------------------------------------------------------------------------------------
// The system under test, shared across runs; RestartCmd replaces plane, server and client.

let fleet: Fleet;
let pki: TestPki;
let plane: ControlPlane;
let server: ApiServer;
let client: RunnerClient;
let restarts = 0;
/** Commands executed per kind across all runs: printed, so a run that exercised little is visible. */
const tally = new Map<string, number>();
const count = (what: string): void => void tally.set(what, (tally.get(what) ?? 0) + 1);

/** `port`: reuse the previous server's port, so a client's retry reaches the new server. */
async function startApi(port = 0): Promise<void> {
  plane = await fleet.startPlane({ replicaId: `cp-model-${restarts}` });
  server = await ApiServer.start({ runner: plane.runner, address: `127.0.0.1:${port}`, security: { mode: 'mtls', mtls: { ca: pki.ca, cert: pki.server.cert, key: pki.server.key } } });
  client = new RunnerClient({ address: `127.0.0.1:${server.port}`, tls: { ca: pki.ca, cert: pki.runner.cert, key: pki.runner.key }, deadlineMs: 60_000 });
}

async function stopApi(graceMs = 1_000): Promise<void> {
  client.close();
  await server.shutdown(graceMs);
  await plane.stop();
}

type Answer<T> = { ok: true; value: T } | { ok: false; code: string; reason: string; metadata: Readonly<Record<string, string>> };

async function answer<T>(p: Promise<T>): Promise<Answer<T>> {
  try {
    return { ok: true, value: await p };
  } catch (e) {
    if (!(e instanceof RunnerError)) throw e;
    return { ok: false, code: e.codeName, reason: e.reason, metadata: e.metadata };
  }
}

const show = (a: Answer<unknown>): string => (a.ok ? `OK ${JSON.stringify(a.value)}` : `${a.code}/${a.reason} ${JSON.stringify(a.metadata)}`);

/** The same call with the same idempotency key twice at once (or once): both answers must agree. */
async function maybeTwice<T>(dup: boolean, call: (key: string) => Promise<T>): Promise<Answer<T>> {
  const key = randomUUID();
  if (!dup) return answer(call(key));
  const [a, b] = await Promise.all([answer(call(key)), answer(call(key))]);
  expect(show(b), 'concurrent duplicates (same idempotency key) must get the same answer').toBe(show(a));
  return a;
}

function expectRefused(a: Answer<unknown>, code: string, reason: string, what: string): void {
  expect(a.ok ? `OK ${JSON.stringify(a.value)}` : `${a.code}/${a.reason}`, what).toBe(`${code}/${reason}`);
}

const CTX: Record<Ctx, ContextState> = { NEW: ContextState.NEW, LIVE: ContextState.LIVE, RESTORED: ContextState.RESTORED };

function nextCtx(m: MemberModel): ContextState {
  if (m.phase === 'FRESH') return ContextState.NEW;
  if (m.phase === 'RETAINED') return m.processKept ? ContextState.LIVE : ContextState.RESTORED;
  if (m.phase === 'IN_TURN') return CTX[m.inFlight!.ctx];
  return ContextState.LOST;
}

/** The locator a first turn's CLI reports for this member in this run. */
const firstLocator = (model: Model, m: MemberModel) => `sess-${model.conversationId}-${m.memberId}`;

// ---------------------------------------------------------------------------------------------
// Begin: the model's prediction and the invariant checks on the answer.

type LocatorChoice = 'none' | 'saved' | 'wrong';

function locatorFor(model: Model, m: MemberModel, choice: LocatorChoice): string | undefined {
  if (choice === 'none') return undefined;
  if (choice === 'wrong') return `sess-wrong-${randomUUID().slice(0, 8)}`;
  return m.saved ?? firstLocator(model, m);
}

/**
 * Applies a begin to the model and checks the answer against it, and against the member as the
 * system showed it before the command (`before`).
 */
function applyBegin(model: Model, real: Real, m: MemberModel, before: Member | undefined, locator: string | undefined, a: Answer<BeginTurnResponse>, where: string): void {
  // Any begin on a stopped group restarts its containers first (resume on the same host).
  model.group = 'RUNNING';
  if (m.phase === 'LOST' || m.phase === 'UNCONFIRMED') {
    expectRefused(a, 'FAILED_PRECONDITION', 'context_lost', `${where}: a member whose last turn is unconfirmed or LOST is refused`);
    if (!a.ok) expect(a.metadata.lostReason ?? '', `${where}: every LOST has a reason`).not.toBe('');
    m.phase = 'LOST';
    m.inFlight = undefined;
    return;
  }
  if (m.phase === 'IN_TURN') {
    expectRefused(a, 'FAILED_PRECONDITION', 'turn_in_flight', `${where}: one turn in flight per member (R-S8)`);
    return;
  }
  if (locator !== undefined && locator !== m.saved) {
    expectRefused(a, 'FAILED_PRECONDITION', 'locator_mismatch', `${where}: a request locator other than the saved one is refused (R-S3)`);
    return;
  }
  const ctx: Ctx = m.phase === 'FRESH' ? 'NEW' : m.processKept ? 'LIVE' : 'RESTORED';
  expect(a.ok ? { ctx: ContextState[a.value.contextState], locator: a.value.locator, host: a.value.hostId } : show(a), where).toEqual({ ctx, locator: m.saved ?? '', host: HOST });
  if (!a.ok) return;
  // The invariants, stated on what the system itself showed before the begin (not on the model).
  expect(before, `${where}: ${m.memberId} was read back before the begin`).toBeDefined();
  const shown = { completed: before!.completedTurns, saved: before!.savedLocator, container: before!.containerId, promisedLive: real.promisedLive.has(m.memberId) };
  const retained = shown.completed > 0 && shown.saved !== '';
  if (a.value.contextState === ContextState.NEW) expect(shown, `${where}: NEW only while no turn has completed`).toMatchObject({ completed: 0, saved: '', promisedLive: false });
  if (a.value.contextState === ContextState.LIVE) expect({ retained, ...shown }, `${where}: LIVE only on the process the last turn end kept (same container)`).toMatchObject({ retained: true, promisedLive: true, container: a.value.containerId });
  if (a.value.contextState === ContextState.RESTORED) expect({ retained, ...shown }, `${where}: RESTORED only for a new process on retained state`).toMatchObject({ retained: true, promisedLive: false });
  expect(a.value.locator, `${where}: a begin resumes the locator the system had saved`).toBe(shown.saved);
  real.promisedLive.delete(m.memberId);
  expect(a.value.turnId).not.toBe('');
  m.phase = 'IN_TURN';
  m.inFlight = { turnId: a.value.turnId, ctx, locator: m.saved };
}

// ---------------------------------------------------------------------------------------------
// Complete: evidence kinds and the prediction (R-S2, R-S5, R-S6).

type EvidenceChoice =
  | 'success'
  | 'failed_confirmed'
  | 'failed_cleanup_unfinished'
  | 'failed_transport_unusable'
  | 'failed_locator_unusable'
  | 'disconnect'
  | 'timeout'
  | 'cancelled'
  | 'rejected'
  | 'process_exited'
  | 'api_retry_exit';
type ObservedChoice = 'right' | 'new' | 'missing';

const NATIVE_KIND: Record<CliKind, TurnEndKind> = {
  'claude-code': TurnEndKind.RESULT,
  codex: TurnEndKind.TURN_COMPLETED,
  pi: TurnEndKind.AGENT_END,
  opencode: TurnEndKind.SETTLED,
  kilo: TurnEndKind.SETTLED,
};
const TRANSPORT_KIND = { disconnect: TurnEndKind.DISCONNECT, timeout: TurnEndKind.TIMEOUT, cancelled: TurnEndKind.CANCELLED, rejected: TurnEndKind.REJECTED, process_exited: TurnEndKind.PROCESS_EXITED } as const;

function evidenceFor(cli: CliKind, choice: EvidenceChoice, lie: boolean, retrySucceeded: boolean): TurnEndEvidence {
  const base: TurnEndEvidence = {
    kind: NATIVE_KIND[cli], nativeTurnEnded: true, succeeded: true, cleanupFinished: true, transportUsable: true, locatorUsable: true,
    processExited: false, exitConfirmed: false, nativeTurnId: '', errorMessage: '',
  };
  switch (choice) {
    case 'success': return base;
    case 'failed_confirmed': return { ...base, succeeded: false, errorMessage: 'overloaded' };
    case 'failed_cleanup_unfinished': return { ...base, succeeded: false, cleanupFinished: false };
    case 'failed_transport_unusable': return { ...base, succeeded: false, transportUsable: false };
    case 'failed_locator_unusable': return { ...base, succeeded: false, locatorUsable: false };
    // Transport events are never turn ends (R-S5); `lie` claims an end anyway — it must not count.
    case 'disconnect': case 'timeout': case 'cancelled': case 'rejected': case 'process_exited':
      return { ...base, kind: TRANSPORT_KIND[choice], nativeTurnEnded: lie, succeeded: lie, transportUsable: choice !== 'disconnect', processExited: choice === 'process_exited' };
    // R-S6: Claude's api_retry ends the turn and the process exits; other CLIs: a native end after which the process exited.
    case 'api_retry_exit':
      return { ...base, kind: cli === 'claude-code' ? TurnEndKind.API_RETRY : NATIVE_KIND[cli], succeeded: retrySucceeded, processExited: true, exitConfirmed: true, exitCode: 0 };
  }
}

interface Expected {
  readonly refused?: string;
  readonly response?: CompleteTurnResponse;
}

/** Predicts the answer to completing m's turn in flight and applies it to the model. */
function applyComplete(model: Model, m: MemberModel, observed: string | undefined, e: TurnEndEvidence): Expected {
  const turn = m.inFlight!;
  const native = e.nativeTurnEnded && [TurnEndKind.RESULT, TurnEndKind.TURN_COMPLETED, TurnEndKind.AGENT_END, TurnEndKind.SETTLED, TurnEndKind.API_RETRY].includes(e.kind);
  const success = native && e.succeeded;
  const usable = e.transportUsable && e.locatorUsable;
  const exits = e.processExited || e.kind === TurnEndKind.API_RETRY;
  m.inFlight = undefined;
  const finish = (phase: Phase, outcome: Outcome): void => {
    m.phase = phase;
    m.lastTurn = { turnId: turn.turnId, outcome };
    if (phase !== 'RETAINED' || outcome === 'locator_mismatch') m.processKept = false;
  };
  const ok = (outcome: Outcome): Expected => ({
    response: { sessionKept: m.phase === 'RETAINED', savedLocator: m.saved ?? '', nextContextState: nextCtx(m), reason: outcome === 'completed' ? '' : outcome, groupProtected: false, protectionPending: false },
  });
  if (!native) {
    finish('UNCONFIRMED', 'unconfirmed');
    return ok('unconfirmed');
  }
  if (observed === undefined) {
    if (turn.locator === undefined && !success && e.cleanupFinished && usable) {
      finish('FRESH', 'failed_before_session');
      return ok('failed_before_session');
    }
    finish('UNCONFIRMED', 'locator_missing');
    return { refused: 'FAILED_PRECONDITION/locator_missing' };
  }
  if (turn.locator !== undefined && observed !== turn.locator) {
    finish('RETAINED', 'locator_mismatch');
    return { refused: 'FAILED_PRECONDITION/locator_mismatch' };
  }
  m.saved = turn.locator ?? observed;
  if (!success && !(e.cleanupFinished && usable)) {
    finish('UNCONFIRMED', 'unconfirmed');
    return ok('unconfirmed');
  }
  m.completed += 1;
  finish('RETAINED', success ? 'completed' : 'failed_kept');
  m.processKept = !exits && usable;
  return ok(success ? 'completed' : 'failed_kept');
}

/** Records what the system's CompleteTurn answer promised about the member's next turn. */
function notePromise(real: Real, m: MemberModel, a: Answer<CompleteTurnResponse>): void {
  if (!a.ok) return;
  if (a.value.nextContextState === ContextState.LIVE) real.promisedLive.add(m.memberId);
  else real.promisedLive.delete(m.memberId);
}

function checkComplete(expected: Expected, a: Answer<CompleteTurnResponse>, where: string): void {
  if (expected.refused !== undefined) {
    expect(a.ok ? `OK ${JSON.stringify(a.value)}` : `${a.code}/${a.reason}`, `${where}: the turn must be refused`).toBe(expected.refused);
  } else {
    expect(a.ok ? a.value : show(a), where).toEqual(expected.response);
  }
}

// ---------------------------------------------------------------------------------------------
// Read back and check the whole group after every command.

async function checkState(model: Model, real: Real, where: string): Promise<void> {
  const state: Answer<GetGroupStateResponse> = await answer(client.getGroupState({ groupId: real.groupId }));
  if (!state.ok) throw new Error(`${where}: GetGroupState failed: ${show(state)}`);
  const g = state.value.group!;
  expect(GroupState[g.state], `${where}: group state`).toBe(model.group);
  for (const m of model.members) {
    const w = g.members.find((x) => x.memberId === m.memberId)!;
    expect(w, `${where}: member ${m.memberId} present`).toBeDefined();
    real.lastRead.set(m.memberId, w);
    const first = real.firstSaved.get(m.memberId);
    if (first !== undefined) expect(w.savedLocator, `${where}: saved locator of ${m.memberId} never changes once set (R-S2)`).toBe(first);
    else if (w.savedLocator !== '') real.firstSaved.set(m.memberId, w.savedLocator);
    expect({
      saved: w.savedLocator, completed: w.completedTurns, inFlight: w.turnInFlightId, lost: w.state === MemberState.LOST,
    }, `${where}: member ${m.memberId} as read back`).toEqual({
      saved: m.saved ?? '', completed: m.completed, inFlight: m.inFlight?.turnId ?? '', lost: m.phase === 'LOST',
    });
    if (w.state === MemberState.LOST) expect(w.lossReason, `${where}: every LOST has a reason`).not.toBe('');
    if (m.phase === 'IN_TURN') expect(w.state, `${where}: ${m.memberId} in turn`).toBe(MemberState.IN_TURN);
  }
}

// ---------------------------------------------------------------------------------------------
// Commands.

type Cmd = fc.AsyncCommand<Model, Real, false>;
const memberOf = (model: Model, index: number): MemberModel => model.members[index % model.members.length]!;

class BeginCmd implements Cmd {
  constructor(readonly index: number, readonly choice: LocatorChoice, readonly dup: boolean) {}
  check = (): boolean => true;
  async run(model: Model, real: Real): Promise<void> {
    const m = memberOf(model, this.index);
    const before = real.lastRead.get(m.memberId);
    const locator = locatorFor(model, m, this.choice);
    const a = await maybeTwice(this.dup, (key) => client.beginTurn({ groupId: real.groupId, memberId: m.memberId, ...(locator !== undefined ? { locator } : {}) }, { idempotencyKey: key }));
    real.log.push(`${this.toString()} -> ${show(a)}`);
    count(a.ok ? `begin ${ContextState[a.value.contextState]}` : `begin refused ${a.reason}`);
    applyBegin(model, real, m, before, locator, a, this.toString());
    await checkState(model, real, this.toString());
  }
  toString = (): string => `begin(m${this.index}, locator=${this.choice}${this.dup ? ', dup' : ''})`;
}

class CompleteCmd implements Cmd {
  constructor(readonly index: number, readonly observed: ObservedChoice, readonly evidence: EvidenceChoice, readonly lie: boolean, readonly retrySucceeded: boolean, readonly dup: boolean) {}
  check = (model: Model): boolean => memberOf(model, this.index).phase === 'IN_TURN';
  async run(model: Model, real: Real): Promise<void> {
    const m = memberOf(model, this.index);
    const turn = m.inFlight!;
    const observed = this.observed === 'missing' ? undefined : this.observed === 'new' ? `sess-new-${randomUUID().slice(0, 8)}` : (turn.locator ?? firstLocator(model, m));
    const evidence = evidenceFor(m.cli, this.evidence, this.lie, this.retrySucceeded);
    const a = await maybeTwice(this.dup, (key) => client.completeTurn({ groupId: real.groupId, memberId: m.memberId, turnId: turn.turnId, observedLocator: observed, evidence }, { idempotencyKey: key }));
    real.log.push(`${this.toString()} -> ${show(a)}`);
    count(`${a.ok ? `complete ${a.value.reason || 'completed'}` : `complete refused ${a.reason}`}${this.dup ? ' (dup)' : ''}`);
    const savedBefore = real.lastRead.get(m.memberId)?.savedLocator ?? '';
    checkComplete(applyComplete(model, m, observed, evidence), a, this.toString());
    // The system's own answer never replaces the locator it had saved (R-S2), whatever it observed.
    if (a.ok && savedBefore !== '') expect(a.value.savedLocator, `${this.toString()}: the saved locator is never replaced`).toBe(savedBefore);
    notePromise(real, m, a);
    await checkState(model, real, this.toString());
  }
  toString = (): string => `complete(m${this.index}, observed=${this.observed}, ${this.evidence}${this.lie ? '+claims-end' : ''}${this.evidence === 'api_retry_exit' ? `, succeeded=${this.retrySucceeded}` : ''}${this.dup ? ', dup' : ''})`;
}

/** CompleteTurn for a turn that is not in flight, with a fresh key: the last turn's answer again, or NOT_FOUND; never a change. */
class StaleCompleteCmd implements Cmd {
  constructor(readonly index: number) {}
  check = (model: Model): boolean => memberOf(model, this.index).phase !== 'IN_TURN';
  async run(model: Model, real: Real): Promise<void> {
    const m = memberOf(model, this.index);
    const turnId = m.lastTurn?.turnId ?? 't-never-begun';
    const a = await answer(client.completeTurn({ groupId: real.groupId, memberId: m.memberId, turnId, observedLocator: `sess-late-${randomUUID().slice(0, 8)}`, evidence: evidenceFor(m.cli, 'success', false, true) }));
    real.log.push(`${this.toString()} -> ${show(a)}`);
    count(`stale complete of a ${m.lastTurn?.outcome ?? 'never begun'} turn: ${a.ok ? 'OK' : a.reason}`);
    if (m.lastTurn === undefined) {
      expectRefused(a, 'NOT_FOUND', 'turn_not_found', this.toString());
    } else if (a.ok) {
      // A repeat of a completed turn answers its recorded outcome and changes nothing.
      const reason = m.lastTurn.outcome === 'completed' ? '' : m.lastTurn.outcome;
      expect(a.value, this.toString()).toEqual({ sessionKept: m.phase === 'RETAINED', savedLocator: m.saved ?? '', nextContextState: nextCtx(m), reason, groupProtected: false, protectionPending: false });
    } else {
      // A refused turn end may be refused again; anything else is wrong.
      expect(`${a.code}/${a.reason}`, this.toString()).toBe(`FAILED_PRECONDITION/${m.lastTurn.outcome}`);
    }
    await checkState(model, real, this.toString());
  }
  toString = (): string => `staleComplete(m${this.index})`;
}

class StopCmd implements Cmd {
  /** `onlyIdle`: only when no turn is in flight (a clean stop); otherwise any time (maybe unclean). */
  constructor(readonly dup: boolean, readonly onlyIdle: boolean) {}
  check = (model: Model): boolean => !this.onlyIdle || model.members.every((m) => m.phase !== 'IN_TURN');
  async run(model: Model, real: Real): Promise<void> {
    const a = await maybeTwice(this.dup, (key) => client.stopGroup({ groupId: real.groupId }, { idempotencyKey: key }));
    real.log.push(`${this.toString()} -> ${a.ok ? `OK ${StopOutcome[a.value.outcome]}` : show(a)}`);
    count(a.ok ? `stop ${StopOutcome[a.value.outcome]}` : `stop refused ${a.reason}`);
    if (model.group === 'RUNNING') {
      // R-G2: a stop with a turn in flight is unclean, and that turn is unconfirmed (next begin LOST).
      const inFlight = model.members.filter((m) => m.phase === 'IN_TURN');
      model.lastStopClean = inFlight.length === 0;
      for (const m of inFlight) {
        m.phase = 'UNCONFIRMED';
        m.inFlight = undefined;
      }
      for (const m of model.members) m.processKept = false;
      model.group = 'STOPPED';
    }
    expect(a.ok ? StopOutcome[a.value.outcome] : show(a), this.toString()).toBe(model.lastStopClean ? 'CLEAN' : 'UNCLEAN');
    // A stop ends every member's process: no earlier LIVE promise holds.
    if (a.ok) real.promisedLive.clear();
    await checkState(model, real, this.toString());
  }
  toString = (): string => `stop(${this.onlyIdle ? 'idle' : 'any'}${this.dup ? ', dup' : ''})`;
}

/** R-S8 under contention: two begins with different keys at once; at most one turn starts. */
class RaceBeginsCmd implements Cmd {
  constructor(readonly index: number) {}
  check = (): boolean => true;
  async run(model: Model, real: Real): Promise<void> {
    const m = memberOf(model, this.index);
    const before = real.lastRead.get(m.memberId);
    const [a, b] = await Promise.all([0, 1].map(() => answer(client.beginTurn({ groupId: real.groupId, memberId: m.memberId }))));
    real.log.push(`${this.toString()} -> ${show(a!)} | ${show(b!)}`);
    const winners = [a!, b!].filter((x) => x.ok);
    if (m.phase === 'FRESH' || m.phase === 'RETAINED') {
      expect(winners.length, `${this.toString()}: exactly one of two racing begins starts a turn (R-S8)`).toBe(1);
      const loser = [a!, b!].find((x) => !x.ok)!;
      expectRefused(loser, 'FAILED_PRECONDITION', 'turn_in_flight', `${this.toString()}: the other is refused`);
      applyBegin(model, real, m, before, undefined, winners[0]!, this.toString());
    } else {
      expect(winners.length, `${this.toString()}: no turn may start`).toBe(0);
      applyBegin(model, real, m, before, undefined, a!, this.toString());
      applyBegin(model, real, m, before, undefined, b!, this.toString());
    }
    await checkState(model, real, this.toString());
  }
  toString = (): string => `raceBegins(m${this.index})`;
}

/** Begins on every member at once (one group record, concurrent CAS writers). */
class ParallelBeginsCmd implements Cmd {
  check = (model: Model): boolean => model.members.length > 1;
  async run(model: Model, real: Real): Promise<void> {
    const answers = await Promise.all(model.members.map((m) => answer(client.beginTurn({ groupId: real.groupId, memberId: m.memberId }))));
    real.log.push(`${this.toString()} -> ${answers.map(show).join(' | ')}`);
    model.members.forEach((m, i) => applyBegin(model, real, m, real.lastRead.get(m.memberId), undefined, answers[i]!, `${this.toString()}[${m.memberId}]`));
    await checkState(model, real, this.toString());
  }
  toString = (): string => 'parallelBegins';
}

/** Re-acquire the conversation's group: the same group, never a second one. */
class ReopenCmd implements Cmd {
  constructor(readonly dup: boolean) {}
  check = (): boolean => true;
  async run(model: Model, real: Real): Promise<void> {
    const a = await maybeTwice(this.dup, (key) => client.openGroup({ conversationId: model.conversationId, members: model.members.map((m) => ({ memberId: m.memberId, cli: m.cli })) }, { idempotencyKey: key }));
    real.log.push(`${this.toString()} -> ${a.ok ? `OK created=${a.value.created}` : show(a)}`);
    expect(a.ok ? { created: a.value.created, groupId: a.value.group?.groupId } : show(a), this.toString()).toEqual({ created: false, groupId: real.groupId });
    await checkState(model, real, this.toString());
  }
  toString = (): string => `reopen(${this.dup ? 'dup' : ''})`;
}

/** Crash-free restart of the control plane and API server: new processes, same NATS and host. */
class RestartCmd implements Cmd {
  check = (): boolean => true;
  async run(model: Model, real: Real): Promise<void> {
    await stopApi();
    restarts += 1;
    await startApi();
    real.log.push('restart');
    count('restart');
    if (model.members.some((m) => m.phase === 'IN_TURN')) count('restart with a turn in flight');
    await checkState(model, real, this.toString());
  }
  toString = (): string => 'restartControlPlane';
}

/**
 * A crash mid-call: a begin (or the completion of the turn in flight) is sent, and after a random
 * few milliseconds the API server is force-closed and its control plane stopped, whatever the call
 * was doing (the old plane's work may even finish later, like a zombie replica). A new plane and
 * server come up on the same port and the runner re-sends the call with the SAME idempotency key,
 * as it does after a lost answer: the result must be exactly the model's answer to one call, and
 * equal to the first answer if that one arrived.
 */
class CrashDuringCallCmd implements Cmd {
  constructor(readonly index: number, readonly delayMs: number) {}
  check = (): boolean => true;
  async run(model: Model, real: Real): Promise<void> {
    const m = memberOf(model, this.index);
    const before = real.lastRead.get(m.memberId);
    const key = randomUUID();
    const turn = m.inFlight;
    const evidence = evidenceFor(m.cli, 'success', false, true);
    const observed = turn?.locator ?? firstLocator(model, m);
    const call = (c: RunnerClient, deadlineMs: number) => turn === undefined
      ? c.beginTurn({ groupId: real.groupId, memberId: m.memberId }, { idempotencyKey: key, deadlineMs })
      : c.completeTurn({ groupId: real.groupId, memberId: m.memberId, turnId: turn.turnId, observedLocator: observed, evidence }, { idempotencyKey: key, deadlineMs });
    const port = server.port;
    const first = answer<BeginTurnResponse | CompleteTurnResponse>(call(client, 2_000));
    await new Promise((r) => setTimeout(r, this.delayMs));
    await stopApi(0);
    const firstAnswer = await first;
    restarts += 1;
    await startApi(port);
    const again = await answer<BeginTurnResponse | CompleteTurnResponse>(call(client, 60_000));
    real.log.push(`${this.toString()} first: ${show(firstAnswer)}; again with the same key: ${show(again)}`);
    count(`crash during ${turn === undefined ? 'begin' : 'complete'}${firstAnswer.ok ? ' (answer arrived)' : ''}`);
    if (firstAnswer.ok) expect(show(again), `${this.toString()}: a retry with the same key gets the first answer`).toBe(show(firstAnswer));
    if (turn === undefined) applyBegin(model, real, m, before, undefined, again as Answer<BeginTurnResponse>, this.toString());
    else {
      checkComplete(applyComplete(model, m, observed, evidence), again as Answer<CompleteTurnResponse>, this.toString());
      notePromise(real, m, again as Answer<CompleteTurnResponse>);
    }
    await checkState(model, real, this.toString());
  }
  toString = (): string => `crashDuringCall(m${this.index}, after ${this.delayMs} ms)`;
}

const member = fc.nat({ max: 1 });
// Random action lists (not fc.commands, whose sizes are biased towards very short runs): each run
// gets 10..MAX_COMMANDS actions; an action whose precondition fails in the current model is skipped.
// Arrays shrink like any value, and every run starts from a fresh conversation, so shrinking works.
const command: fc.Arbitrary<Cmd> = fc.oneof(
  { weight: 6, arbitrary: fc.tuple(member, fc.constantFrom<LocatorChoice>('none', 'none', 'saved', 'wrong'), fc.boolean()).map(([i, l, d]) => new BeginCmd(i, l, d)) },
  {
    weight: 4,
    arbitrary: fc.tuple(member, fc.constantFrom<ObservedChoice>('right', 'right', 'right', 'new', 'missing'),
      fc.constantFrom<EvidenceChoice>('success', 'success', 'success', 'failed_confirmed', 'failed_cleanup_unfinished', 'failed_transport_unusable', 'failed_locator_unusable', 'disconnect', 'timeout', 'cancelled', 'rejected', 'process_exited', 'api_retry_exit', 'api_retry_exit'),
      fc.boolean(), fc.boolean(), fc.boolean()).map(([i, o, e, lie, rs, d]) => new CompleteCmd(i, o, e, lie, rs, d)),
  },
  // Plain successful turns, so runs reach long retained histories (LIVE, RESTORED after stops).
  { weight: 8, arbitrary: fc.tuple(member, fc.boolean()).map(([i, d]) => new CompleteCmd(i, 'right', 'success', false, true, d)) },
  { weight: 1, arbitrary: member.map((i) => new StaleCompleteCmd(i)) },
  { weight: 2, arbitrary: fc.boolean().map((d) => new StopCmd(d, true)) },
  { weight: 1, arbitrary: fc.boolean().map((d) => new StopCmd(d, false)) },
  { weight: 2, arbitrary: member.map((i) => new RaceBeginsCmd(i)) },
  { weight: 2, arbitrary: fc.constant(new ParallelBeginsCmd()) },
  { weight: 1, arbitrary: fc.boolean().map((d) => new ReopenCmd(d)) },
  { weight: 1, arbitrary: fc.constant(new RestartCmd()) },
  { weight: 1, arbitrary: fc.tuple(member, fc.nat({ max: 40 })).map(([i, d]) => new CrashDuringCallCmd(i, d)) },
);
const commands = fc.array(command, { minLength: 10, maxLength: MAX_COMMANDS });

const CLIS: readonly CliKind[] = ['claude-code', 'codex', 'pi', 'opencode', 'kilo'];
const groupSpec = fc.uniqueArray(fc.constantFrom(...CLIS), { minLength: 1, maxLength: 2 });

beforeAll(async () => {
  const t0 = Date.now();
  [fleet, pki] = await Promise.all([startFleet(1), createTestPki()]);
  // The plane first: the host registers with it, so it is READY soon after the agent starts.
  await startApi();
  await fleet.startAgentOn(HOST, 0, { maxMembers: 256 });
  await fleet.waitFor(`${HOST} READY`, async () => ((await fleet.host(HOST)).lifecycle.state === 'READY' ? true : undefined));
  console.info(`runner-api model: fleet ready in ${Date.now() - t0} ms; ${MODEL_RUNS} runs per seed, seeds ${SEEDS.map((s) => `${s.seed} (${s.origin})`).join(', ')}`);
}, 240_000);

afterAll(async () => {
  await stopApi().catch(() => undefined);
  await fleet?.cleanup();
  await pki?.cleanup();
  console.info(`runner-api model: ${restarts} restarts; commands by kind: ${JSON.stringify(Object.fromEntries([...tally].sort()))}`);
});

describe('runner API model (real control plane, NATS, agent and dockerd)', () => {
  it.each(SEEDS)('keeps the session-identity invariants over the wire under random interleavings, restarts and duplicates (seed $seed, $origin)', async ({ seed, origin }) => {
    // Printed before the run, not only on failure: a hang or a timeout still names its seed.
    console.info(`runner-api model: seed ${seed} (${origin}), ${MODEL_RUNS} runs; replay with FC_SEED=${seed}`);
    let run = 0;
    let lastLog: string[] = [];
    const property = fc.asyncProperty(groupSpec, fc.boolean(), commands, async (clis, openTwice, cmds) => {
      run += 1;
      const conversationId = `model-${seed >>> 0}-${run}`;
      const model: Model = {
        conversationId,
        members: clis.map((cli, i) => ({ memberId: `m${i}`, cli, phase: 'FRESH', saved: undefined, completed: 0, processKept: false, inFlight: undefined, lastTurn: undefined })),
        group: 'RUNNING',
        lastStopClean: undefined,
      };
      // Half the runs create the group with two concurrent identical OpenGroup calls (same key).
      const open = await maybeTwice(openTwice, (key) => client.openGroup({ conversationId, members: model.members.map((m) => ({ memberId: m.memberId, cli: m.cli })) }, { idempotencyKey: key }));
      if (!open.ok) throw new Error(`OpenGroup failed: ${show(open)}`);
      expect(open.value.created).toBe(true);
      const group = open.value.group!;
      const real: Real = { groupId: group.groupId, firstSaved: new Map(), lastRead: new Map(group.members.map((w) => [w.memberId, w])), promisedLive: new Set(), log: [`open ${clis.join('+')}${openTwice ? ' (dup)' : ''} -> ${group.groupId}`] };
      lastLog = real.log;
      for (const cmd of cmds) if (cmd.check(model)) await cmd.run(model, real);
    });
    const shrink = process.env.MODEL_SHRINK === '1';
    try {
      const t0 = Date.now();
      await fc.assert(property, { numRuns: MODEL_RUNS, seed, endOnFailure: !shrink });
      console.info(`runner-api model: seed ${seed}: ${run} runs in ${Date.now() - t0} ms`);
    } catch (error) {
      console.error(`runner-api model test failed: replay with FC_SEED=${seed}\nlast run's calls:\n  ${lastLog.join('\n  ')}`);
      throw error;
    }
  }, Math.max(600_000, MODEL_RUNS * RUN_BUDGET_MS));
});
