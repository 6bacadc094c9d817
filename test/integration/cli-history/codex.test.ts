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
import { ApiServer } from '../../../src/api/runner-server.ts';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { DockerRuntime } from '../../../src/docker/runtime.ts';
import { ContextState } from '../../../src/gen/sandboxfleet/v1/common.ts';
import type { BeginTurnResponse } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { RunnerClient } from '../../../src/runner-sdk/index.ts';
import { createTestPki, type TestPki } from '../../support/certs.ts';
import { CODEX_PATH, CODEX_VERSION, codexConfigToml, codexImageFiles, readCodexExec } from '../../support/codex-cli.ts';
import { successEvidence } from '../../support/evidence.ts';
import { ackMarker, history, promptRequest, startFakeModelApi, type FakeModelApi, type RecordedRequest } from '../../support/fake-model-api.ts';
import { startFleet, type Fleet } from '../control-plane/fleet-harness.ts';

let fleet: Fleet;
let plane: ControlPlane;
let pki: TestPki;
let server: ApiServer;
let runner: RunnerClient;
let api: FakeModelApi;
let groupId = '';
const AGENT = { memberNetworkMode: 'host' };

beforeAll(async () => {
  api = await startFakeModelApi(ackMarker);
  [fleet, pki] = await Promise.all([startFleet(2, {}, { image: { bridgeVersion: 4, extraFiles: codexImageFiles(), tagSuffix: `codex-${CODEX_VERSION}` } }), createTestPki()]);
  plane = await fleet.startPlane();
  await fleet.startAgentOn('host-a', 0, AGENT);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
  server = await ApiServer.start({ runner: plane.runner, address: '127.0.0.1:0', security: { mode: 'mtls', mtls: { ca: pki.ca, cert: pki.server.cert, key: pki.server.key } } });
  runner = new RunnerClient({ address: `127.0.0.1:${server.port}`, tls: { ca: pki.ca, cert: pki.runner.cert, key: pki.runner.key }, deadlineMs: 120_000 });
}, 600_000);

afterAll(async () => {
  runner?.close();
  await server?.shutdown(1_000);
  await fleet?.cleanup();
  await pki?.cleanup();
  await api?.close();
});

// Codex also sends user-role messages of its own (environment context); they carry no marker and
// are left out of the comparisons (`user:`).
async function turn(marker: string): Promise<{ begun: BeginTurnResponse; threadId: string | undefined; agentText: string; requests: RecordedRequest[] }> {
  const begun = await runner.beginTurn({ groupId, memberId: 'codex' });
  const before = api.requests.length;
  const rt = new DockerRuntime(fleet.hosts.find((h) => h.name === begun.hostId)!.docker);
  const setup = await rt.exec(begun.containerId, ['/bin/sh', '-c', 'mkdir -p /root/.codex && printf "%s" "$1" > /root/.codex/config.toml', 'sh', codexConfigToml(api.url)]);
  expect(setup.exitCode, setup.stderr).toBe(0);
  const prompt = `Please remember ${marker}.`;
  const args = ['exec', '--json', '--skip-git-repo-check', ...(begun.locator !== '' ? ['resume', begun.locator, prompt] : [prompt])];
  const run = await rt.exec(begun.containerId, [CODEX_PATH, ...args], { env: { HOME: '/root' }, timeoutMs: 120_000, maxOutputBytes: 8 * 1024 * 1024 });
  const seen = readCodexExec(run.stdout);
  expect(seen.completed, `${run.stderr}\n${run.stdout}`.slice(0, 2000)).toBe(true);
  await runner.completeTurn({ groupId, memberId: 'codex', turnId: begun.turnId, observedLocator: seen.threadId ?? '', evidence: successEvidence() });
  return { begun, threadId: seen.threadId, agentText: seen.agentText, requests: api.requests.slice(before) };
}

describe(`pinned Codex ${CODEX_VERSION} against a loopback model API`, () => {
  it('NEW, then a resumed follow-up that sends the history once', async () => {
    const opened = await runner.openGroup({ conversationId: 'history-codex', members: [{ memberId: 'codex', cli: 'codex' }] });
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
    const locator = (await runner.getGroupState({ groupId })).group?.members[0]?.savedLocator;
    await runner.stopGroup({ groupId });
    await fleet.startAgentOn('host-b', 1, AGENT);
    await fleet.waitFor('host-b READY', async () => ((await fleet.host('host-b')).lifecycle.state === 'READY' ? true : undefined));
    expect(await plane.drainHost('host-a')).toBe(true);
    await fleet.waitFor('group moved to host-b', async () => {
      const g = await fleet.group(groupId);
      if (g.lifecycle.state === 'LOST') throw new Error(`group LOST: ${g.lifecycle.lostReason}`);
      return g.lifecycle.state === 'STOPPED' && g.lifecycle.hostId === 'host-b' && g.evacuation === undefined ? true : undefined;
    }, 120_000);
    const t3 = await turn('MARK-THREE');
    expect(t3.begun).toMatchObject({ contextState: ContextState.RESTORED, hostId: 'host-b', locator });
    expect(t3.threadId).toBe(locator);
    expect(history(promptRequest(t3.requests, 'MARK-THREE')).filter((h) => h !== 'user:')).toEqual(['user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO', 'assistant:MARK-TWO', 'user:MARK-THREE']);
  });
});
