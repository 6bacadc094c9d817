// A zombie host comes back by itself (R-H6), with real parts: a real nats-server, two real dockerd
// hosts, the real agent binary as a child process on host-a (so it can be frozen with SIGSTOP) and a
// real control plane. Frozen past TTL + grace, host-a is declared DEAD: its clean group is restored
// on host-b, its running group is LOST. Resumed (SIGCONT), the same agent process heartbeats with
// its old epoch, is told it is fenced, registers again, and then acts on the verdicts: the copy of
// the group restored elsewhere is deleted, the LOST group's copy is kept, stopped. Before, the
// fenced heartbeats were only counted: the host stayed DEAD and its stale containers ran on until
// someone restarted the agent.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { spawnAgent, type ChildAgent } from '../../support/agent.ts';
import { writeNativeSession } from '../../support/native-session.ts';
import { SUCCESS, startFleet, type Fleet } from './fleet-harness.ts';

let fleet: Fleet;
let plane: ControlPlane;
let zombie: ChildAgent | undefined;
let n = 0;
const key = () => `z-${++n}`;

beforeAll(async () => {
  fleet = await startFleet(2);
  plane = await fleet.startPlane();
  zombie = spawnAgent({ hostId: 'host-a', natsUrl: fleet.nats.server.url, host: fleet.hosts[0]!, imageRef: fleet.image.reference, overrides: { heartbeatIntervalMs: 500 } });
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined), 60_000);
  // Heartbeats start once the agent takes commands: the first one says it is listening.
  await fleet.waitFor('host-a heartbeating', async () => (plane.fleet.heartbeat('host-a') !== undefined ? true : undefined), 30_000);
}, 240_000);

afterAll(async () => {
  if (zombie !== undefined) {
    zombie.kill('SIGCONT');
    zombie.kill('SIGKILL');
    await zombie.exited;
  }
  await fleet?.cleanup();
});

async function groupOnA(conversationId: string, stop: boolean): Promise<string> {
  const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId, members: [{ memberId: 'm1', cli: 'claude_code' }] });
  expect(group.hostId).toBe('host-a');
  const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: group.groupId, memberId: 'm1' });
  // host-a's agent is a child process, not one of the harness's: write the CLI's session file directly.
  await writeNativeSession(fleet.hosts[0]!.docker, begun.containerId, 'claude_code', `sess-${conversationId}`);
  await plane.runner.completeTurn({ idempotencyKey: key(), groupId: group.groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: `sess-${conversationId}`, evidence: SUCCESS });
  if (stop) await plane.runner.stopGroup({ idempotencyKey: key(), groupId: group.groupId });
  return group.groupId;
}

async function copiesOnA(groupId: string): Promise<{ running: boolean }[]> {
  const list = await fleet.hosts[0]!.docker.listContainers({ all: true, filters: { label: [`sandboxfleet.group=${groupId}`] } });
  return list.map((c) => ({ running: c.State === 'running' }));
}

describe('a zombie host (frozen until DEAD, then resumed)', () => {
  it('is told it is fenced, registers again by itself, and keeps only what the verdicts allow', async () => {
    const running = await groupOnA('conv-zombie-running', false);
    const clean = await groupOnA('conv-zombie-clean', true);
    await fleet.startAgentOn('host-b', 1);
    await fleet.waitFor('host-b READY', async () => ((await fleet.host('host-b')).lifecycle.state === 'READY' ? true : undefined));
    const epochBefore = (await fleet.host('host-a')).lifecycle.epoch;

    zombie!.kill('SIGSTOP');
    await fleet.waitFor('host-a DEAD', async () => ((await fleet.host('host-a')).lifecycle.state === 'DEAD' ? true : undefined), 60_000);
    await fleet.waitFor('clean group restored on host-b', async () => {
      const g = await fleet.group(clean);
      return g.lifecycle.hostId === 'host-b' && g.lifecycle.state === 'STOPPED' ? true : undefined;
    }, 90_000);
    await fleet.waitFor('running group LOST', async () => ((await fleet.group(running)).lifecycle.state === 'LOST' ? true : undefined), 30_000);
    expect((await fleet.group(running)).lifecycle.lostReason).toBe('host_lost_running');
    // Frozen, the zombie still holds both copies, the running one still "running".
    expect(await copiesOnA(clean)).toHaveLength(1);
    expect(await copiesOnA(running)).toEqual([{ running: true }]);

    const resumedAt = Date.now();
    zombie!.kill('SIGCONT');
    const back = await fleet.waitFor('host-a READY again, same process', async () => {
      const h = await fleet.host('host-a');
      return h.lifecycle.state === 'READY' && h.lifecycle.epoch > epochBefore ? h : undefined;
    }, 30_000);
    const secondsToRejoin = (Date.now() - resumedAt) / 1000;
    expect(back.lifecycle.epoch).toBeGreaterThan(epochBefore);
    expect(secondsToRejoin).toBeLessThan(15);
    expect(zombie!.child.exitCode).toBeNull();
    const { events } = await fleet.store.events.read({ subjectKind: 'host', subjectId: 'host-a', limit: 1000 });
    expect(events.some((e) => e.event.type === 'host_report_fenced' && e.event.reason === 'host_dead')).toBe(true);

    await fleet.waitFor('the restored group\'s zombie copy deleted', async () => ((await copiesOnA(clean)).length === 0 ? true : undefined), 15_000);
    await fleet.waitFor('the LOST group\'s copy stopped, kept', async () => {
      const c = await copiesOnA(running);
      return c.length === 1 && !c[0]!.running ? true : undefined;
    }, 15_000);
    expect(zombie!.output()).toContain('registering again');
  }, 300_000);
});
