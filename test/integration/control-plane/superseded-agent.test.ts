// Two agent processes claiming one host (R-H6), with real parts: a real nats-server, a real dockerd
// host, two real in-process host agents with the same host id and a real control plane. The newer
// registration wins; the older process, told its epoch was superseded by a live one, stands by —
// no commands, no new registration — instead of registering again (which fenced the newer one,
// which registered again in turn: the epoch climbed every heartbeat and neither could work). Once
// the newer process is gone and its registration declared DEAD, the standby takes the host over.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { startFleet, type Fleet } from './fleet-harness.ts';

let fleet: Fleet;
let plane: ControlPlane;

beforeAll(async () => {
  fleet = await startFleet(1);
  plane = await fleet.startPlane();
}, 240_000);

afterAll(async () => {
  await fleet?.cleanup();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('two agent processes for one host', () => {
  it('the newer registration wins, the older stands by without registering again, and takes over once the newer one is gone', async () => {
    const older = await fleet.startAgentOn('host-a', 0);
    try {
      await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined), 60_000);
      await fleet.waitFor('host-a heartbeating', async () => (plane.fleet.heartbeat('host-a') !== undefined ? true : undefined), 30_000);
      const olderEpoch = older.agent.epoch!;

      // A second process registers for the same host (the harness now tracks this one as host-a's).
      const newer = await fleet.startAgentOn('host-a', 0);
      const newerEpoch = newer.agent.epoch!;
      expect(newerEpoch).toBeGreaterThan(olderEpoch);
      // Longer than the fenced-notice interval (5 s) and many heartbeats of both.
      await sleep(8_000);
      const host = await fleet.host('host-a');
      expect(host.lifecycle.epoch, 'registrations fenced each other in a loop').toBe(newerEpoch);
      expect(host.lifecycle.state).toBe('READY');
      expect(older.agent.epoch, 'the older process registered again').toBe(olderEpoch);
      expect(newer.agent.epoch).toBe(newerEpoch);

      // The newer process goes away: its registration turns DEAD by silence; the standby takes over.
      await fleet.stopAgent('host-a');
      const taken = await fleet.waitFor('the standby registered again', async () => {
        const h = await fleet.host('host-a');
        return h.lifecycle.state === 'READY' && h.lifecycle.epoch > newerEpoch && older.agent.epoch === h.lifecycle.epoch ? h : undefined;
      }, 60_000);
      expect(taken.lifecycle.epoch).toBe(older.agent.epoch);
    } finally {
      await older.stop();
    }
  }, 180_000);
});
