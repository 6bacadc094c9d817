// LIVE turns with the pinned Pi coding agent kept running between turns (R-S1, R-I9): the runner holds
// only the gRPC address and its certificate — no Docker socket — and calls RunTurn; the fleet starts
// `pi --mode rpc --provider fake --model fake-model [--session <id>]` in the member container as the
// member's turn process and writes each turn to its stdin as `get_state` (whose answer names the
// session) and `prompt`; the turn ends on Pi's own `agent_end`, and the process is kept. Pi is pointed
// at the loopback fake Messages API by ~/.pi/agent/models.json, which the runner writes through the
// fleet's Exec (no Docker access either). Checked against what the model API received:
//   1. NEW, then LIVE twice on the very same process, the history sent once and in order;
//   2. a clean stop between turns ends the process: the next turn is RESTORED (a new process resuming
//      the saved session) with the whole history, and the turn after it is LIVE again.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ContextState, StopOutcome } from '../../../src/gen/sandboxfleet/v1/common.ts';
import { ExecEnd } from '../../../src/gen/sandboxfleet/v1/exec.ts';
import type { BeginTurnResponse, RunTurnEnd, RunTurnResponse } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { history, promptRequest, type RecordedRequest } from '../../support/fake-model-api.ts';
import { PI_PATH, PI_VERSION, piImageContent, piModelsJson } from '../../support/pi-cli.ts';
import { startHistoryFleet, type HistoryFleet } from './history-fleet.ts';

let h: HistoryFleet;
let groupId = '';
const launcherDir = mkdtempSync(join(tmpdir(), 'sf-pi-launcher-'));

beforeAll(async () => {
  const content = piImageContent(launcherDir);
  h = await startHistoryFleet({ bridgeVersion: 4, extraFiles: content.files, extraTrees: content.trees, tagSuffix: `pi-${PI_VERSION}` }, {
    config: () => ({ cliProfiles: { pi: { binary: PI_PATH, env: { HOME: '/root' }, args: ['--provider', 'fake', '--model', 'fake-model'] } } }),
  });
}, 600_000);

afterAll(async () => {
  await h?.cleanup();
  rmSync(launcherDir, { recursive: true, force: true });
});

interface Ran {
  readonly begun: BeginTurnResponse;
  readonly end: RunTurnEnd;
  readonly requests: RecordedRequest[];
}

async function runTurn(marker: string): Promise<Ran> {
  const before = h.api.requests.length;
  let begun: BeginTurnResponse | undefined;
  let end: RunTurnEnd | undefined;
  for await (const e of h.runner.runTurn({ groupId, memberId: 'pi', prompt: `Please remember ${marker}.` }, { timeoutMs: 120_000 }) as AsyncIterable<RunTurnResponse>) {
    if (e.event?.$case === 'begun') begun = e.event.value;
    else if (e.event?.$case === 'end') end = e.event.value;
  }
  expect(begun).toBeDefined();
  expect(end).toBeDefined();
  return { begun: begun!, end: end!, requests: h.api.requests.slice(before) };
}

/** Point Pi at the fake, through the fleet's Exec (the runner has no Docker socket). */
async function writeModelsJson(): Promise<void> {
  const x = await h.runner.exec({ groupId, memberId: 'pi', argv: ['/bin/sh', '-c', 'mkdir -p /root/.pi/agent && printf "%s" "$1" > /root/.pi/agent/models.json', 'sh', piModelsJson(h.api.url)] });
  for await (const e of x.output()) if (e.kind === 'exit') expect(e.exit.exitCode).toBe(0);
}

/** The pids of the Pi processes in the member's container (read through the host's engine by the harness). */
async function piPids(begun: { hostId: string; containerId: string }): Promise<string[]> {
  const ps = await h.runtimeOf(begun.hostId).exec(begun.containerId, ['ps', '-o', 'pid,args']);
  // Pi sets its process title to `pi`.
  return ps.stdout.split('\n').filter((l) => /^\s*\d+\s+pi(\s|$)/.test(l)).map((l) => l.trim().split(/\s+/)[0]!);
}

describe(`RunTurn keeps the pinned Pi ${PI_VERSION} running between turns (--mode rpc)`, () => {
  it('NEW, then LIVE twice on the very same process; the model API sees the history once, in order', async () => {
    const opened = await h.runner.openGroup({ conversationId: 'turn-process-pi', members: [{ memberId: 'pi', cli: 'pi' }] });
    groupId = opened.group!.groupId;
    await writeModelsJson();
    const t1 = await runTurn('MARK-ONE');
    expect(t1.begun.contextState).toBe(ContextState.NEW);
    expect(t1.end.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true, processExited: false });
    expect(t1.end.exit?.end).toBe(ExecEnd.DETACHED);
    expect(t1.end.observedLocator).toMatch(/^[0-9a-f-]{36}$/);
    expect(t1.end.completion).toMatchObject({ sessionKept: true, savedLocator: t1.end.observedLocator, nextContextState: ContextState.LIVE });
    expect(history(promptRequest(t1.requests, 'MARK-ONE'))).toEqual(['user:MARK-ONE']);
    const pids = await piPids(t1.begun);
    expect(pids).toHaveLength(1);

    const t2 = await runTurn('MARK-TWO');
    expect(t2.begun).toMatchObject({ contextState: ContextState.LIVE, locator: t1.end.observedLocator });
    expect(t2.end.observedLocator).toBe(t1.end.observedLocator);
    expect(history(promptRequest(t2.requests, 'MARK-TWO'))).toEqual(['user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO']);
    const t3 = await runTurn('MARK-THREE');
    expect(t3.begun.contextState).toBe(ContextState.LIVE);
    expect(history(promptRequest(t3.requests, 'MARK-THREE'))).toEqual(['user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO', 'assistant:MARK-TWO', 'user:MARK-THREE']);
    expect(await piPids(t3.begun)).toEqual(pids);
  });

  it('a clean stop between turns ends the process: RESTORED with the whole history, then LIVE again', async () => {
    const saved = (await h.runner.getGroupState({ groupId })).group?.members[0]?.savedLocator;
    const stopped = await h.runner.stopGroup({ groupId });
    expect(stopped.outcome).toBe(StopOutcome.CLEAN);
    const t4 = await runTurn('MARK-FOUR');
    expect(t4.begun).toMatchObject({ contextState: ContextState.RESTORED, locator: saved, slotReclaimed: false });
    expect(t4.end.observedLocator).toBe(saved);
    expect(history(promptRequest(t4.requests, 'MARK-FOUR'))).toEqual(['user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO', 'assistant:MARK-TWO', 'user:MARK-THREE', 'assistant:MARK-THREE', 'user:MARK-FOUR']);
    const t5 = await runTurn('MARK-FIVE');
    expect(t5.begun.contextState).toBe(ContextState.LIVE);
    expect(history(promptRequest(t5.requests, 'MARK-FIVE')).slice(-3)).toEqual(['user:MARK-FOUR', 'assistant:MARK-FOUR', 'user:MARK-FIVE']);
    expect(await piPids(t5.begun)).toHaveLength(1);
  });
});
