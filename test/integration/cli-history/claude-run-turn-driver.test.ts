// Exactly one driver per RunTurn turn, with the pinned Claude Code binary kept between turns (R-I9,
// R-S5): the runner holds only the gRPC address; the fleet runs Claude in the member container
// against the loopback fake Messages API, whose recorded requests show how often the CLI ran a turn.
//   1. two RunTurn calls with one idempotency key on two control-plane replicas (a retry that went to
//      another replica), the second sent while the first one's begin is still under way (a stop is
//      under way: each begin waits for it and starts the group again): Claude runs the turn once, both calls get its end,
//      the next turn is LIVE. (Decided by the begin's driver token, never by time stamps: the first
//      begin is stamped after the retry was called.)
//   2. a caller that goes away while its begin waits for a stop and starts the group again: the turn
//      is still driven to Claude's own end and completed — never left begun with nobody driving it —
//      and a repeat of the call answers that end. (Whether the cancel lands before the begin answers
//      depends on timing here; test/unit/control-plane/turn-runner-seams.test.ts makes it certain.)
// The driver's lease (a driver that died) is covered without a CLI in test/integration/api/
// run-turn-driver.test.ts.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiServer } from '../../../src/api/runner-server.ts';
import { Keys } from '../../../src/control-plane/state.ts';
import { ContextState } from '../../../src/gen/sandboxfleet/v1/common.ts';
import type { BeginTurnResponse, RunTurnEnd, RunTurnResponse } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { RunnerClient, RunnerError } from '../../../src/runner-sdk/index.ts';
import { createTestPki, type TestPki } from '../../support/certs.ts';
import { CLAUDE_CODE_VERSION, CLAUDE_PATH, claudeCodeEnv, claudeCodeImageFiles } from '../../support/claude-code.ts';
import { history, type RecordedRequest } from '../../support/fake-model-api.ts';
import { startHistoryFleet, type HistoryFleet } from './history-fleet.ts';

let h: HistoryFleet;
let groupId = '';
/** A second control-plane replica with its own runner API. */
let pki: TestPki | undefined;
let server2: ApiServer | undefined;
let runner2: RunnerClient | undefined;

beforeAll(async () => {
  h = await startHistoryFleet({ bridgeVersion: 4, extraFiles: claudeCodeImageFiles(), tagSuffix: `claude-code-${CLAUDE_CODE_VERSION}` }, {
    config: (apiUrl) => ({ cliProfiles: { claude_code: { binary: CLAUDE_PATH, env: claudeCodeEnv(apiUrl) } } }),
  });
  groupId = (await h.runner.openGroup({ conversationId: 'run-turn-driver-claude', members: [{ memberId: 'claude', cli: 'claude-code' }] })).group!.groupId;
}, 600_000);

afterAll(async () => {
  runner2?.close();
  await server2?.shutdown(1_000);
  await pki?.cleanup();
  await h?.cleanup();
});

interface Ran {
  readonly begun: BeginTurnResponse;
  readonly end: RunTurnEnd;
}

async function runTurn(marker: string, options: { idempotencyKey?: string; signal?: AbortSignal; via?: RunnerClient } = {}): Promise<Ran> {
  let begun: BeginTurnResponse | undefined;
  let end: RunTurnEnd | undefined;
  for await (const e of (options.via ?? h.runner).runTurn({ groupId, memberId: 'claude', prompt: `Please remember ${marker}.` }, { timeoutMs: 120_000, ...(options.idempotencyKey !== undefined ? { idempotencyKey: options.idempotencyKey } : {}), ...(options.signal !== undefined ? { signal: options.signal } : {}) }) as AsyncIterable<RunTurnResponse>) {
    const ev = e.event;
    if (ev?.$case === 'begun') begun = ev.value;
    else if (ev?.$case === 'end') end = ev.value;
  }
  expect(begun).toBeDefined();
  expect(end).toBeDefined();
  return { begun: begun!, end: end! };
}

/** The model calls whose newest user message carries `marker`: one per time the CLI ran that turn. */
const callsFor = (marker: string): RecordedRequest[] => h.api.requests.filter((r) => history(r).at(-1)?.includes(marker) === true);

async function member() {
  return (await h.fleet.group(groupId)).members.find((m) => m.session.memberId === 'claude')!;
}

async function until<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 90_000, everyMs = 200): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

describe(`RunTurn has exactly one driver per turn (pinned Claude Code ${CLAUDE_CODE_VERSION})`, () => {
  it('two calls with one idempotency key on two replicas, the second during the first one\'s begin: Claude runs the turn once', async () => {
    await runTurn('MARK-FIRST');
    pki = await createTestPki();
    const plane2 = await h.fleet.startPlane({ replicaId: 'cp-second' });
    server2 = await ApiServer.start({ runner: plane2.runner, exec: plane2.exec, address: '127.0.0.1:0', security: { mode: 'mtls', mtls: { ca: pki.ca, cert: pki.server.cert, key: pki.server.key } } });
    runner2 = new RunnerClient({ address: `127.0.0.1:${server2.port}`, tls: { ca: pki.ca, cert: pki.runner.cert, key: pki.runner.key }, deadlineMs: 120_000 });
    // A stop under way: each begin waits for it to end and starts the group again before it can
    // begin the turn, so the second call comes while the first one's begin is still under way.
    const stopped = h.runner.stopGroup({ groupId });
    await until('the stop is under way', async () => (h.plane.ctx.fleet.group(Keys.group(groupId))?.value.lifecycle.state === 'STOPPING' ? true : undefined), 60_000, 5);
    const key = 'driver-twin-1';
    const a = runTurn('MARK-TWIN', { idempotencyKey: key });
    await new Promise((r) => setTimeout(r, 100));
    const b = runTurn('MARK-TWIN', { idempotencyKey: key, via: runner2 });
    await stopped;
    const [ra, rb] = await Promise.all([a, b]);
    expect(ra.begun.turnId).toBe(rb.begun.turnId);
    for (const r of [ra, rb]) {
      expect(r.end.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true });
      expect(r.end.completion).toMatchObject({ sessionKept: true, nextContextState: ContextState.LIVE });
    }
    // As many model calls as one turn makes (MARK-FIRST's): the CLI ran the turn once.
    expect(callsFor('MARK-FIRST').length).toBeGreaterThan(0);
    expect(callsFor('MARK-TWIN')).toHaveLength(callsFor('MARK-FIRST').length);
    const next = await runTurn('MARK-AFTERTWIN');
    expect(next.begun.contextState).toBe(ContextState.LIVE);
    expect(history(callsFor('MARK-AFTERTWIN').at(-1)!).filter((m) => m === 'user:MARK-TWIN')).toHaveLength(1);
  });

  it('a caller that goes away during the begin: the turn is still driven to Claude\'s end, and a repeat answers it', async () => {
    // A stop under way: the begin waits for it to end, then starts the group again, then begins.
    const stopped = h.runner.stopGroup({ groupId });
    await until('the stop is under way', async () => (h.plane.ctx.fleet.group(Keys.group(groupId))?.value.lifecycle.state === 'STOPPING' ? true : undefined), 60_000, 5);
    const key = 'driver-leave-1';
    const leave = new AbortController();
    const call = runTurn('MARK-LEAVE', { idempotencyKey: key, signal: leave.signal }).then(() => undefined, (e: unknown) => e);
    await new Promise((r) => setTimeout(r, 150));
    leave.abort();
    await stopped;
    const err = await call;
    expect(err).toBeInstanceOf(RunnerError);
    expect((err as RunnerError).reason).toBe('cancelled');
    // The turn was begun and is driven: Claude gets it and the turn is completed as Claude ended it.
    await until('Claude ran the left turn', async () => (callsFor('MARK-LEAVE').length > 0 ? true : undefined));
    await until('the left turn completed', async () => ((await member()).session.phase !== 'IN_TURN' ? true : undefined));
    expect((await member()).session).toMatchObject({ phase: 'RETAINED', lastTurn: { outcome: 'completed' } });
    const again = await runTurn('MARK-LEAVE', { idempotencyKey: key });
    expect(again.end.completion).toMatchObject({ sessionKept: true });
    expect(callsFor('MARK-LEAVE')).toHaveLength(callsFor('MARK-FIRST').length);
  });
});
