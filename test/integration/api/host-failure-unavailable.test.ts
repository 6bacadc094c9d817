// A runner call whose group's host fails the command it needs (here its Docker engine is down) is
// refused UNAVAILABLE host_unreachable, which a runner retries with the same idempotency key, and
// that retry succeeds once the host is back. Before, the agent's failure escaped the runner backend
// as an unknown error and the API answered INTERNAL, which a runner does not retry (found by the
// chaos workload over gRPC: a BeginTurn on a host whose dockerd had just been killed). Real
// nats-server, a real dockerd, the real agent and control plane (fleet-harness.ts).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { isFleetError } from '../../../src/core/index.ts';
import { startFleet, type Fleet } from '../control-plane/fleet-harness.ts';

const pi = [{ memberId: 'm1', cli: 'pi' as const }];

let fleet: Fleet;
let plane: ControlPlane;

async function refusal(p: Promise<unknown>): Promise<{ status: string; reason: string; agentReason: unknown }> {
  const err = await p.then(() => undefined, (e: unknown) => e);
  expect(isFleetError(err), `refused with a FleetError (a status the API maps), got ${String(err)}`).toBe(true);
  const e = err as { status: string; reason: string; details: Record<string, unknown> };
  return { status: e.status, reason: e.reason, agentReason: e.details.agentReason };
}

beforeAll(async () => {
  fleet = await startFleet(1);
  plane = await fleet.startPlane();
  await fleet.startAgentOn('host-a', 0);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
}, 240_000);

afterAll(async () => {
  await fleet?.cleanup();
});

describe("a host that fails the command a runner call needs", () => {
  it('BeginTurn on a stopped group whose engine is down: UNAVAILABLE host_unreachable, and the same key succeeds once the engine is back', async () => {
    const { group } = await plane.runner.openGroup({ idempotencyKey: 'open-1', conversationId: 'conv-1', members: pi });
    await plane.runner.stopGroup({ idempotencyKey: 'stop-1', groupId: group.groupId });
    expect((await fleet.group(group.groupId)).lifecycle.state).toBe('STOPPED');

    await fleet.hosts[0]!.stop();
    // The start the begin needs fails on the host (its engine does not answer).
    const refused = await refusal(plane.runner.beginTurn({ idempotencyKey: 'begin-1', groupId: group.groupId, memberId: 'm1' }));
    expect(refused).toMatchObject({ status: 'UNAVAILABLE', reason: 'host_unreachable' });
    expect(String(refused.agentReason)).toMatch(/docker/);

    await fleet.hosts[0]!.restart();
    // A runner's retry, with the same key, once the host can start containers again.
    const begun = await fleet.waitFor('the retried begin', async () => plane.runner.beginTurn({ idempotencyKey: 'begin-1', groupId: group.groupId, memberId: 'm1' }), 60_000);
    expect(begun.turnId).toMatch(/^t-/);
    expect((await fleet.group(group.groupId)).lifecycle.state).toBe('RUNNING');
  }, 180_000);

  it('OpenGroup while the engine is down: UNAVAILABLE host_unreachable, and the same key opens the group once it is back (the failed create is not answered again from the agent\'s cache)', async () => {
    await fleet.hosts[0]!.stop();
    const refused = await refusal(plane.runner.openGroup({ idempotencyKey: 'open-2', conversationId: 'conv-2', members: pi }));
    expect(refused).toMatchObject({ status: 'UNAVAILABLE', reason: 'host_unreachable' });

    await fleet.hosts[0]!.restart();
    const opened = await fleet.waitFor('the retried open', async () => plane.runner.openGroup({ idempotencyKey: 'open-2', conversationId: 'conv-2', members: pi }), 60_000);
    expect((await fleet.group(opened.group.groupId)).lifecycle.state).toBe('RUNNING');
  }, 180_000);
});
