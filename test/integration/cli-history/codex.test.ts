// Request-history regression with the PINNED Codex CLI (SPEC §7.1, R-S1..R-S3, R-G3, R-G5): the real
// statically linked Codex 0.171.0 binary runs in member containers (`codex exec --json`, resumed
// with `codex exec resume <thread id>`), reaching the loopback fake's Responses API through a
// custom provider, against the real control plane, NATS, agents and dockerd hosts over the runner
// gRPC API. Checked on what the model API receives: a resumed follow-up sends the history once,
// and after a drain moves the writable layer to another host (the checkpoint finds and proves the
// rollout file `~/.codex/sessions/YYYY/MM/DD/rollout-<time>-<thread id>.jsonl`), the resumed Codex
// there sends the same history under the same thread id.
// Seam, named: the turn end is read from `codex exec --json` (`turn.completed`) by this test, not by
// the runner SDK's Codex detector, which reads the app-server protocol (`turn/completed`) that a
// runner drives over JSON-RPC (that detector meets the real app-server in codex-app-server.test.ts);
// the evidence sent is the wire form of that end.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { BeginTurnResponse } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { ContextState } from '../../../src/gen/sandboxfleet/v1/common.ts';
import { CODEX_PATH, CODEX_VERSION, codexConfigToml, codexImageFiles, readCodexExec } from '../../support/codex-cli.ts';
import { successEvidence } from '../../support/evidence.ts';
import { history, promptRequest, type RecordedRequest } from '../../support/fake-model-api.ts';
import { startHistoryFleet, type HistoryFleet } from './history-fleet.ts';

let h: HistoryFleet;
let groupId = '';

beforeAll(async () => {
  h = await startHistoryFleet({ bridgeVersion: 4, extraFiles: codexImageFiles(), tagSuffix: `codex-${CODEX_VERSION}` });
}, 600_000);

afterAll(async () => {
  await h?.cleanup();
});

// Codex also sends user-role messages of its own (environment context); they carry no marker and
// are left out of the comparisons (`user:`).
async function turn(marker: string): Promise<{ begun: BeginTurnResponse; threadId: string | undefined; agentText: string; requests: RecordedRequest[] }> {
  const begun = await h.runner.beginTurn({ groupId, memberId: 'codex' });
  const before = h.api.requests.length;
  const rt = h.runtimeOf(begun.hostId);
  const setup = await rt.exec(begun.containerId, ['/bin/sh', '-c', 'mkdir -p /root/.codex && printf "%s" "$1" > /root/.codex/config.toml', 'sh', codexConfigToml(h.api.url)]);
  expect(setup.exitCode, setup.stderr).toBe(0);
  const prompt = `Please remember ${marker}.`;
  const args = ['exec', '--json', '--skip-git-repo-check', ...(begun.locator !== '' ? ['resume', begun.locator, prompt] : [prompt])];
  const run = await rt.exec(begun.containerId, [CODEX_PATH, ...args], { env: { HOME: '/root' }, timeoutMs: 120_000, maxOutputBytes: 8 * 1024 * 1024 });
  const seen = readCodexExec(run.stdout);
  expect(seen.completed, `${run.stderr}\n${run.stdout}`.slice(0, 2000)).toBe(true);
  await h.runner.completeTurn({ groupId, memberId: 'codex', turnId: begun.turnId, observedLocator: seen.threadId ?? '', evidence: successEvidence() });
  return { begun, threadId: seen.threadId, agentText: seen.agentText, requests: h.api.requests.slice(before) };
}

describe(`pinned Codex ${CODEX_VERSION} against a loopback model API`, () => {
  it('NEW, then a resumed follow-up that sends the history once', async () => {
    const opened = await h.runner.openGroup({ conversationId: 'history-codex', members: [{ memberId: 'codex', cli: 'codex' }] });
    groupId = opened.group?.groupId ?? '';
    const t1 = await turn('MARK-ONE');
    expect(t1.begun.contextState).toBe(ContextState.NEW);
    expect(t1.threadId).toMatch(/^[0-9a-f-]{36}$/);
    expect(t1.agentText).toBe('ack MARK-ONE');
    expect(history(promptRequest(t1.requests, 'MARK-ONE')).filter((h) => h !== 'user:')).toEqual(['user:MARK-ONE']);
    const t2 = await turn('MARK-TWO');
    expect(t2.begun.locator).toBe(t1.threadId);
    expect(t2.threadId).toBe(t1.threadId);
    expect(history(promptRequest(t2.requests, 'MARK-TWO')).filter((h) => h !== 'user:')).toEqual(['user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO']);
  });

  it('after a drain moves the writable layer to another host, the resumed Codex there sends the same history under the same thread id', async () => {
    const locator = (await h.runner.getGroupState({ groupId })).group?.members[0]?.savedLocator;
    await h.drainToHostB(groupId);
    const t3 = await turn('MARK-THREE');
    expect(t3.begun).toMatchObject({ contextState: ContextState.RESTORED, hostId: 'host-b', locator });
    expect(t3.threadId).toBe(locator);
    expect(history(promptRequest(t3.requests, 'MARK-THREE')).filter((h) => h !== 'user:')).toEqual(['user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO', 'assistant:MARK-TWO', 'user:MARK-THREE']);
  });
});
