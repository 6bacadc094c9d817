// The request-history scenarios (R-P1) and the live-bridge v4 contract (R-S5, R-S7) for a
// CLI behind the project's bridge (OpenCode, Kilo), run for real: the pinned binary as `<cli> serve`
// under `live-bridge serve` as the member's main process, turns driven the way a runner without
// Docker access drives them (BeginTurn, `live-bridge turn` through the fleet's Exec, the runner SDK's
// live-bridge detector, CompleteTurn), every request the model API received checked in full by the
// history checker. One conversation goes through:
//   1. NEW, then LIVE (the bridge and the CLI server stay up between turns);
//   2. a follow-up while the CLI is still running (its model call held): BeginTurn refused
//      `turn_in_flight` (R-S8) and the bridge itself refuses a second turn; sent after the end, once;
//   3. close immediately (clean stop; the CLI's own listing names the one session, the checkpoint
//      names the CLI's SQLite store, proven by the session's row), then resume at once: RESTORED,
//      a new CLI process, the whole history;
//   4. a failed model call (HTTP 400, not retried by the CLI): `settled` with the error, a failed but
//      ended turn, the session kept; the runner retries the prompt: the CLI sends the failed prompt
//      and the retry as one user message (its own history), then the answer;
//   5. a failed call the CLI retries by itself (HTTP 500 once) that succeeds, then a native resume
//      (stop, RESTORED): every message once;
//   6. stop → host killed → restored elsewhere (the cold-start check proves the session's row) →
//      resume on host-b: the CLI's own session listing names the session, the history is intact;
//   7. the control plane refuses a locator change at begin, and at the end of an ended-failed turn
//      the bridge ran in a new native session (the SDK's detector flags it first).
// A second conversation exercises the bridge contract with the real CLI: a Task child session's
// permission request is answered by the bridge (`once`) and the turn settles on the root session
// with the root's text only; a runner stream that drops mid-turn aborts the native turn (the
// session goes idle, the prompt kept with no answer) and the turn is not a native end; a turn id is
// never replayed.
// A third member proves the cold-start check on the real store (R-G5): its checkpoint restored as is
// passes; the same layer saved under a session its store never held (the first conversation's) or
// under a Task child's id fails the check, and nothing is placed.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { CheckpointManifest as StoredManifest } from '../../../src/core/checkpoint-manifest.ts';
import { CommandOutcome, type AgentCommandResult, type CheckpointManifest } from '../../../src/gen/sandboxfleet/v1/agent.ts';
import { ContextState, StopOutcome } from '../../../src/gen/sandboxfleet/v1/common.ts';
import { RunnerError } from '../../../src/runner-sdk/index.ts';
import { toWireManifest } from '../../../src/wire/checkpoint-manifest.ts';
import { sendCommand } from '../../support/agent.ts';
import { ackMarker, type ReplyScript } from '../../support/fake-model-api.ts';
import { SessionHistory, expectNegativeControlsFail, requestEntries, type Entry } from '../../support/history-checker.ts';
import { KILO_HISTORY, OPENCODE_HISTORY } from '../../support/history-profiles.ts';
import { BRIDGE_CLIS, bridgeAgent, bridgeImage, bridgeTurn, runBridgeTurn, type BridgeCli, type BridgeTurn } from './bridge-cli.ts';
import { completeWith, execCommand } from './exec-turn.ts';
import { startHistoryFleet, type HistoryFleet } from './history-fleet.ts';

/** ack <marker> for prompts; a Task delegation for MARK-TASK, a bash call in the child it starts, `done` after a tool result. */
export const bridgeReplies: ReplyScript = (last) => {
  if (last.includes('CHILD-TASK')) return { text: 'running it', toolUse: { id: 'toolu_child_bash_1', name: 'bash', input: { command: 'echo child', description: 'echo' } } };
  if (last.includes('MARK-TASK')) return { text: 'delegating', toolUse: { id: 'toolu_root_task_1', name: 'task', input: { description: 'child work', prompt: 'CHILD-TASK run echo', subagent_type: 'general' } } };
  if (last === '') return 'done';
  return ackMarker(last);
};

const prompt = (marker: string): string => `Please remember ${marker}.`;
const ack = (marker: string): string => `ack ${marker}`;

/** Run a command in the member through the fleet's Exec; its exit code and output. */
function execIn(h: HistoryFleet, groupId: string, memberId: string, argv: string[]): Promise<{ exitCode: number | undefined; stdout: string; stderr: string }> {
  return execCommand(h.runner, { groupId, memberId, argv });
}

/** The CLI's own API through the bridge (`live-bridge api`), parsed. */
async function cliApi(h: HistoryFleet, groupId: string, memberId: string, method: string, path: string): Promise<unknown> {
  const r = await execIn(h, groupId, memberId, ['/usr/local/bin/live-bridge', 'api', method, path]);
  expect(r.exitCode, r.stderr).toBe(0);
  return JSON.parse(r.stdout) as unknown;
}

async function waitUntil(what: string, probe: () => boolean | Promise<boolean>, timeoutMs = 60_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!(await probe())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** A stored manifest as a RestoreCommand carries it (what the control plane sends: the clean stop re-stated). */
function wireManifest(m: StoredManifest): CheckpointManifest {
  return toWireManifest(m, {
    baseImageRef: '',
    activityVersion: m.cleanStop.stateRevision,
    lastCompletedTurnId: '',
    cleanStop: {
      clean: true, noTurnInFlight: true, graceMs: 0, stoppedAtUnixMs: m.cleanStop.stoppedAtMs,
      members: m.cleanStop.members.map((s) => ({
        memberId: s.memberId, exitCode: s.exitCode, exitedByItself: true, signal: 'SIGTERM', withinGrace: true, containerPresent: true,
        writableLayerPresent: true, stopDurationMs: 0, sigtermAtUnixMs: 0, exitedAtUnixMs: 0, killed: false, turnInFlight: false,
      })),
    },
    sourceContainerIds: new Map(),
    entryCounts: new Map(),
  });
}

export function bridgeHistoryScenarios(cli: BridgeCli): void {
  const profile = cli === 'kilo' ? KILO_HISTORY : OPENCODE_HISTORY;
  const store = `/root/.local/share/${cli}/${cli}.db`;
  let h: HistoryFleet;
  /** The first conversation's native session (kept in ITS member's store only). */
  let conversationLocator = '';

  beforeAll(async () => {
    h = await startHistoryFleet(bridgeImage(cli), { agent: (url) => bridgeAgent(cli, url, { permission: { bash: 'ask' } }), reply: bridgeReplies });
  }, 600_000);

  afterAll(async () => {
    await h?.cleanup();
  });

  describe(`pinned ${cli} ${BRIDGE_CLIS[cli].version} behind the live bridge v4`, () => {
    let groupId = '';
    let locator = '';
    const session = new SessionHistory(profile);
    const turn = async (marker: string): Promise<BridgeTurn> => {
      const t = await bridgeTurn(h, groupId, cli, prompt(marker));
      expect(t.evidence, t.stdout.slice(-1500)).toMatchObject({ nativeTurnEnded: true, succeeded: true, endKind: 'settled', assistantText: ack(marker) });
      session.expectTurn(t.requests, { prompt: prompt(marker), reply: ack(marker) });
      return t;
    };

    it('the host is attested by the image\'s own live bridge (its --version and the label agree on 4)', async () => {
      expect((await h.fleet.host('host-a')).attestation.bridgeVersion).toBe(4);
      const opened = await h.runner.openGroup({ conversationId: `history-${cli}`, members: [{ memberId: cli, cli }] });
      groupId = opened.group!.groupId;
      const v = await execIn(h, groupId, cli, ['/usr/local/bin/live-bridge', '--version']);
      expect(v).toMatchObject({ exitCode: 0, stdout: 'http-agent-live-bridge=4\n' });
    });

    it('NEW, then LIVE on the same CLI process with the history once', async () => {
      const t1 = await turn('MARK-ONE');
      expect(t1.begun.contextState).toBe(ContextState.NEW);
      locator = t1.evidence.observedLocator!;
      expect(locator).toMatch(/^ses_[0-9A-Za-z]+$/);
      conversationLocator = locator;
      const t2 = await turn('MARK-TWO');
      expect(t2.begun).toMatchObject({ contextState: ContextState.LIVE, locator });
      expect(t2.evidence.observedLocator).toBe(locator);
      expectNegativeControlsFail(session, t2.requests.find((r) => requestEntries(r).some((e) => e.role === 'assistant'))!);
    });

    it('a follow-up while the CLI is still running is refused by the fleet and by the bridge, then sent once after the end', async () => {
      const release = h.api.holdRequestsWith('MARK-THREE');
      const running = turn('MARK-THREE');
      running.catch(() => undefined);
      try {
        await waitUntil('the CLI called the model for MARK-THREE', () => h.api.requests.some((r) => JSON.stringify(r.raw).includes('MARK-THREE')));
        const refused = await h.runner.beginTurn({ groupId, memberId: cli }).then(() => undefined, (e: unknown) => e);
        expect(refused).toBeInstanceOf(RunnerError);
        expect((refused as RunnerError).reason).toBe('turn_in_flight');
        // A driver that skipped the fleet's begin still cannot start a second native turn: the bridge refuses it.
        const second = await execIn(h, groupId, cli, ['/usr/local/bin/live-bridge', 'turn', '--turn-id', 'not-a-fleet-turn', '--session', locator, '--', prompt('MARK-INTRUDER')]);
        expect(second.exitCode).toBe(1);
        expect(second.stderr).toContain('turn_in_flight');
      } finally {
        release();
      }
      const t3 = await running;
      expect(t3.begun.contextState).toBe(ContextState.LIVE);
      const t4 = await turn('MARK-FOUR');
      expect(t4.begun.contextState).toBe(ContextState.LIVE);
      expect(h.api.requests.some((r) => JSON.stringify(r.raw).includes('MARK-INTRUDER'))).toBe(false);
    });

    it('close immediately, then resume at once: the checkpoint names the CLI\'s session store, RESTORED with the whole history', async () => {
      // The CLI's own listing (its server API) names the one session the checkpoint must prove.
      const listed = (await cliApi(h, groupId, cli, 'GET', '/session')) as Array<{ id: string; parentID?: string }>;
      expect(listed.filter((s) => s.parentID === undefined).map((s) => s.id)).toEqual([locator]);
      const stopped = await h.runner.stopGroup({ groupId });
      expect(stopped.outcome).toBe(StopOutcome.CLEAN);
      expect(stopped.checkpointId).not.toBe('');
      const manifest = await h.fleet.chunks.getManifest('host-a', groupId, stopped.checkpointId);
      expect(manifest.members[0]).toMatchObject({ savedLocator: locator, nativeSessionPaths: [store] });
      const t5 = await turn('MARK-FIVE');
      expect(t5.begun).toMatchObject({ contextState: ContextState.RESTORED, hostId: 'host-a', locator });
      expect(t5.evidence.observedLocator).toBe(locator);
    });

    it('a failed model call ends the turn failed with the session kept; the runner\'s retry reaches the model with the failed prompt once before it', async () => {
      h.api.failNext(1_000, 400);
      const failed = await runBridgeTurn(h, groupId, cli, prompt('MARK-SIX')).finally(() => h.api.failNext(0, 500));
      expect(failed.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false, endKind: 'settled', observedLocator: locator });
      expect(failed.evidence.error).toContain('fake failure');
      const done = await completeWith(h.runner, groupId, cli, failed.begun, failed, false);
      expect(done).toMatchObject({ sessionKept: true, savedLocator: locator });
      session.expectTurn(failed.requests, { prompt: prompt('MARK-SIX'), reply: null });
      // The runner retries the same prompt: the CLI keeps the failed one, so both go out, in one message.
      const retried = await turn('MARK-SIX');
      expect(retried.begun.contextState).toBe(ContextState.LIVE);
    });

    it('a failed call the CLI retries by itself succeeds, and a native resume after it carries every message once', async () => {
      h.api.failNext(1, 500);
      const t7 = await turn('MARK-SEVEN');
      expect(t7.stdout).toContain('"type":"retry"');
      expect(t7.requests.filter((r) => !profile.auxiliary?.some((a) => a.matches(requestEntries(r))))).toHaveLength(2);
      expect((await h.runner.stopGroup({ groupId })).outcome).toBe(StopOutcome.CLEAN);
      const t8 = await turn('MARK-EIGHT');
      expect(t8.begun).toMatchObject({ contextState: ContextState.RESTORED, locator });
    });

    it('stop, host killed, restored elsewhere, resume: the CLI\'s own listing names the session and the history is intact', async () => {
      const stopped = await h.runner.stopGroup({ groupId });
      expect(stopped.outcome).toBe(StopOutcome.CLEAN);
      await h.killHostAAndRestoreOnB(groupId);
      const t9 = await turn('MARK-NINE');
      expect(t9.begun).toMatchObject({ contextState: ContextState.RESTORED, hostId: 'host-b', locator });
      const listed = (await cliApi(h, groupId, cli, 'GET', '/session')) as Array<{ id: string; parentID?: string }>;
      expect(listed.filter((s) => s.parentID === undefined).map((s) => s.id)).toEqual([locator]);
    });

    it('refuses a locator change at begin, and at the end of an ended-failed turn the bridge ran in a new session; the saved one stays', async () => {
      await h.expectLocatorChangeRefusedAtBegin(groupId, cli);
      const before = (await h.runner.getGroupState({ groupId })).group?.members[0];
      // A runner that lost the locator: `live-bridge turn` without --session opens a new native session; its call fails.
      h.api.failNext(1_000, 400);
      const t = await runBridgeTurn(h, groupId, cli, prompt('MARK-TEN'), { session: null }).finally(() => h.api.failNext(0, 500));
      expect(t.begun.locator).toBe(locator);
      // The SDK's detector judges the turn by the session it ran in, and flags that it is not the resumed one.
      expect(t.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false, endKind: 'settled' });
      expect(t.evidence.error).toContain('fake failure');
      expect(t.evidence.observedLocator).toMatch(/^ses_/);
      expect(t.evidence.observedLocator).not.toBe(locator);
      expect(t.evidence.locatorConflict).toEqual({ kept: locator, other: t.evidence.observedLocator, source: 'expected' });
      const refused = await completeWith(h.runner, groupId, cli, t.begun, t, false).then(() => undefined, (e: unknown) => e);
      expect(refused).toBeInstanceOf(RunnerError);
      expect((refused as RunnerError).reason).toBe('locator_mismatch');
      expect((await h.runner.getGroupState({ groupId })).group?.members[0]).toMatchObject({ savedLocator: locator, turnInFlightId: '', completedTurns: before?.completedTurns });
      const t11 = await turn('MARK-ELEVEN');
      expect(t11.begun.locator).toBe(locator);
      expect(t11.requests.every((r) => !JSON.stringify(r.raw).includes('MARK-TEN'))).toBe(true);
    });
  });

  describe(`the live bridge v4 contract with the real ${cli}`, () => {
    let groupId = '';
    let root = '';
    const rootSession = new SessionHistory(profile);

    it('answers the permission request of a Task child session once, and settles on the root session with the root\'s text', async () => {
      const opened = await h.runner.openGroup({ conversationId: `bridge-contract-${cli}`, members: [{ memberId: cli, cli }] });
      groupId = opened.group!.groupId;
      const t = await runBridgeTurn(h, groupId, cli, prompt('MARK-TASK'));
      expect(t.evidence, t.stdout.slice(-3000)).toMatchObject({ nativeTurnEnded: true, succeeded: true, endKind: 'settled' });
      root = t.evidence.observedLocator!;
      const events = t.stdout.trim().split('\n').map((l) => JSON.parse(l) as { turnId: string; type: string; properties: Record<string, unknown> });
      expect(events.every((e) => e.turnId === t.begun.turnId)).toBe(true);
      const child = events.find((e) => e.type === 'session.created' && (e.properties.info as { parentID?: string }).parentID === root)?.properties.info as { id: string };
      expect(child?.id).toMatch(/^ses_/);
      const asked = events.find((e) => e.type === 'permission.asked');
      expect(asked?.properties).toMatchObject({ sessionID: child.id, permission: 'bash' });
      expect(events.find((e) => e.type === 'bridge.permission.replied')?.properties).toMatchObject({ requestID: asked!.properties.id, reply: 'once', attempt: 1 });
      expect(events.filter((e) => e.type === 'settled')).toEqual([{ turnId: t.begun.turnId, type: 'settled', properties: { sessionID: root } }]);
      // The child's own text ("running it") is not the root's answer.
      expect(t.evidence.assistantText).toBe('delegating\ndone');
      await completeWith(h.runner, groupId, cli, t.begun, t, false);
      const listed = (await cliApi(h, groupId, cli, 'GET', '/session')) as Array<{ id: string; parentID?: string }>;
      expect(listed.find((s) => s.id === child.id)?.parentID).toBe(root);
      // Every root request of the turn, in full: the prompt, then the task call and the child's result
      // (the child session's own requests are its own conversation); the next turn carries it all once.
      const rootRequests = t.requests.filter((r) => requestEntries(r).some((e) => e.role === 'user' && e.blocks.includes(prompt('MARK-TASK'))));
      const exchange: Entry[] = [
        { role: 'assistant', blocks: ['delegating', '[tool_use task] {"description":"child work","prompt":"CHILD-TASK run echo","subagent_type":"general"}'] },
        { role: 'user', blocks: ['[tool_result] <task id="<ses-id>" state="completed">\n<task_result>\ndone\n</task_result>\n</task>'] },
        { role: 'assistant', blocks: ['done'] },
      ];
      rootSession.expectTurn(rootRequests, { prompt: prompt('MARK-TASK'), reply: 'done', exchange });
      expect(rootRequests.length).toBeGreaterThanOrEqual(2);
      const next = await bridgeTurn(h, groupId, cli, prompt('MARK-AFTER'));
      expect(next.begun.contextState).toBe(ContextState.LIVE);
      rootSession.expectTurn(next.requests, { prompt: prompt('MARK-AFTER'), reply: ack('MARK-AFTER') });
    });

    it('a runner stream that drops mid-turn aborts the native turn (not a native end), and a turn id is never replayed', async () => {
      const release = h.api.holdRequestsWith('MARK-DROP');
      let dropped: BridgeTurn;
      try {
        dropped = await runBridgeTurn(h, groupId, cli, prompt('MARK-DROP'), { cancelWhen: (out) => out.includes('"type":"busy"') });
      } finally {
        release();
      }
      expect(dropped.evidence).toMatchObject({ nativeTurnEnded: false, succeeded: false, transportUsable: false });
      expect(dropped.evidence.transport?.kind).toBe('disconnect');
      expect(dropped.stdout).not.toContain('"type":"settled"');
      // The native session is idle again: the bridge aborted it (its held model call was cancelled).
      await waitUntil('the native session idle', async () => JSON.stringify(await cliApi(h, groupId, cli, 'GET', '/session/status')) === '{}');
      // The prompt stays in the session with no answer: nothing after it but, when the CLI had
      // started one by then, an aborted assistant message with no text (MessageAbortedError).
      const messages = (await cliApi(h, groupId, cli, 'GET', `/session/${root}/message`)) as Array<{ info: { role: string; error?: { name?: string } }; parts: Array<{ type: string; text?: string }> }>;
      const at = messages.findIndex((m) => m.info.role === 'user' && m.parts.some((p) => p.text === prompt('MARK-DROP')));
      expect(at).toBeGreaterThan(-1);
      const after = messages.slice(at + 1);
      expect(after.every((m) => m.info.role === 'assistant' && m.info.error?.name === 'MessageAbortedError' && !m.parts.some((p) => p.type === 'text' && (p.text ?? '') !== ''))).toBe(true);
      expect(after.length).toBeLessThanOrEqual(1);
      // The same turn id again: refused, the stream is not replayed.
      const replay = await execIn(h, groupId, cli, ['/usr/local/bin/live-bridge', 'turn', '--turn-id', dropped.begun.turnId, '--session', root, '--', prompt('MARK-DROP')]);
      expect(replay.exitCode).toBe(1);
      expect(replay.stderr).toContain('turn_replayed');
    });
  });

  describe(`the cold-start check on the real ${cli} session store`, () => {
    // The checkpoint of a member whose CLI ran one Task turn: its store holds the root session and
    // the Task child, nothing else. Restoring that very layer under another group id (straight to
    // the agent, as the control plane would send it) proves the check reads the store: the saved
    // session passes; a session the store never held (the first conversation's, kept in another
    // member's store — this store is a fresh one for it) and the Task child (not a root session)
    // fail it, and nothing is left placed. A check that proved nothing would pass all three.
    it('proves the saved session\'s root row after the restore, and refuses a store that never held the session or holds it only as a Task child', async () => {
      expect(conversationLocator, 'the first conversation ran').toMatch(/^ses_/);
      const opened = await h.runner.openGroup({ conversationId: `store-proof-${cli}`, members: [{ memberId: cli, cli }] });
      const groupId = opened.group!.groupId;
      const t = await bridgeTurn(h, groupId, cli, prompt('MARK-TASK'));
      const root = t.evidence.observedLocator!;
      const listed = (await cliApi(h, groupId, cli, 'GET', '/session')) as Array<{ id: string; parentID?: string }>;
      expect(listed.filter((s) => s.parentID === undefined).map((s) => s.id)).toEqual([root]);
      const child = listed.find((s) => s.parentID === root)?.id;
      expect(child).toMatch(/^ses_/);
      expect(listed.some((s) => s.id === conversationLocator)).toBe(false);

      const stopped = await h.runner.stopGroup({ groupId });
      expect(stopped.outcome).toBe(StopOutcome.CLEAN);
      const hostId = (await h.fleet.group(groupId)).lifecycle.hostId!;
      const manifest = await h.fleet.chunks.getManifest(hostId, groupId, stopped.checkpointId);
      expect(manifest.members).toEqual([expect.objectContaining({ savedLocator: root, nativeSessionPaths: [store] })]);

      const epoch = h.fleet.agents.get(hostId)!.agent.epoch!;
      const restoreAs = async (name: string, savedLocator: string): Promise<AgentCommandResult> => {
        const probe = { ...manifest, groupId: `store-proof-${name}-${cli}`, checkpointId: `probe-${name}`, members: manifest.members.map((m) => ({ ...m, savedLocator })) };
        await h.fleet.chunks.putManifest(probe);
        return sendCommand(h.fleet.nc, { hostId, epoch, generation: 1 }, { $case: 'restore', value: { groupId: probe.groupId, manifest: wireManifest(probe) } });
      };
      const members = async (name: string): Promise<unknown[]> => h.runtimeOf(hostId).listMembers(`store-proof-${name}-${cli}`);

      const same = await restoreAs('same', root);
      expect(same, same.message).toMatchObject({ outcome: CommandOutcome.OK });
      expect(same.result?.$case === 'restore' ? same.result.value : undefined).toMatchObject({ verified: true, members: [expect.objectContaining({ sessionFilesPresent: true, missingPaths: [] })] });
      expect(await members('same')).toHaveLength(1);
      expect((await sendCommand(h.fleet.nc, { hostId, epoch, generation: 1 }, { $case: 'deleteGroup', value: { groupId: `store-proof-same-${cli}`, reason: 'destroyed' } })).outcome).toBe(CommandOutcome.OK);

      const other = await restoreAs('other', conversationLocator);
      expect(other).toMatchObject({ outcome: CommandOutcome.FAILED, reason: 'session_files_missing' });
      expect(other.message).toContain(`${store}:locator_absent`);
      expect(await members('other')).toEqual([]);

      const task = await restoreAs('child', child!);
      expect(task).toMatchObject({ outcome: CommandOutcome.FAILED, reason: 'session_files_missing' });
      expect(task.message).toContain(`${store}:not_a_root_session`);
      expect(await members('child')).toEqual([]);
    });
  });
}
