// Which checkpoint manifest version an agent writes is the control plane's to say (CheckpointCommand
// max_manifest_schema_version), with real parts: a real nats-server, two real dockerd hosts, real
// host agents (which would write version 2), a control plane configured to verify version 1 only
// (checkpointManifestVersion 1, as before a rollback). Its checkpoints are version 1, full reads, and
// the loss of its host restores the group from one. The default (version 2, incremental) is what
// every other control-plane test runs; checkpoint-refresh.test.ts checks its incremental captures.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { CheckpointRecordSchema } from '../../../src/control-plane/records.ts';
import { Keys } from '../../../src/control-plane/state.ts';
import { startFleet, stoppedAfterOneTurn, type Fleet } from './fleet-harness.ts';

let fleet: Fleet;
let plane: ControlPlane;

beforeAll(async () => {
  fleet = await startFleet(2, { checkpointManifestVersion: 1 });
  plane = await fleet.startPlane();
  await fleet.startReadyAgentOn('host-a', 0);
}, 240_000);

afterAll(async () => {
  await fleet?.cleanup();
});

describe('checkpoint manifest version', () => {
  it('a control plane that verifies version 1 only gets version-1 checkpoints, and restores from them', async () => {
    const { groupId, begun, stopped } = await stoppedAfterOneTurn(fleet, plane, 'conv-v1', 'sess-v1');
    const record = (await fleet.store.repository('checkpoints', CheckpointRecordSchema).get(Keys.checkpoint(groupId, stopped.checkpointId!)))!.value;
    const manifest = await fleet.chunks.getManifest(record.sourceHostId, groupId, record.checkpointId);
    expect(manifest.schemaVersion).toBe(1);
    const captures = (await fleet.agents.get(begun.hostId)!.metrics.registry.getSingleMetric('sandboxfleet_layer_captures_total')!.get()).values;
    expect(captures.filter((v) => v.value > 0).map((v) => v.labels)).toEqual([{ mode: 'full', why: 'version_1' }]);

    // Host A dies: the group is restored on host B from its version-1 checkpoint, and its next turn
    // there is RESTORED with the same locator.
    await fleet.startReadyAgentOn('host-b', 1);
    await fleet.killHost('host-a');
    await fleet.waitFor('group restored on host-b', async () => {
      const g = await fleet.group(groupId);
      if (g.lifecycle.state === 'LOST') throw new Error(`group LOST: ${g.lifecycle.lostReason}`);
      return g.lifecycle.state === 'STOPPED' && g.lifecycle.hostId === 'host-b' && g.evacuation === undefined ? g : undefined;
    }, 90_000);
    const next = await plane.runner.beginTurn({ idempotencyKey: 'mv-next', groupId, memberId: 'm1' });
    expect(next).toMatchObject({ contextState: 'RESTORED', locator: 'sess-v1', hostId: 'host-b' });
  });
});
