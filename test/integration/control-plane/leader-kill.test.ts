// Crash safety of the migration controller (R-R3, R-R2, R-R1): a leader is killed at a randomized
// step boundary of a planned migration (20 seeded schedules, in-process leaders with a kill switch
// in the step hook), then a fresh leader takes over from persisted state only. Every schedule must
// finish: the group ends placed on exactly one other host (or LOST with a reason, never silently),
// never has containers running on two hosts, and after the source host re-registers no container
// of the group is left anywhere but on its final host. Real nats-server, dockerd hosts and agents.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TEST_AGENT_SHA } from '../../support/agent.ts';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import type { GroupRecord } from '../../../src/control-plane/records.ts';
import { SUCCESS, startFleet, type Fleet } from './fleet-harness.ts';

const HOSTS = ['host-a', 'host-b', 'host-c'];
const SCHEDULES = Number(process.env.SF_LEADER_KILL_SCHEDULES ?? 20);
let fleet: Fleet;
let registry: ControlPlane;
let n = 0;
const key = () => `lk-${++n}`;

/** Small deterministic PRNG (mulberry32) so a failing schedule can be replayed by its seed. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

class Killed extends Error {}

// Every schedule leaves its group behind (stopped, on its final host): with the default 64 members
// per host, the two hosts a drain may move to are full after 128 schedules, and a group then rightly
// waits for room until its evacuation deadline. The soak runs 200.
const ROOMY = { maxMembers: 1000 };

beforeAll(async () => {
  fleet = await startFleet(3);
  // A replica that only serves registrations/heartbeats; leaders below are driven by hand.
  registry = await fleet.startPlane({ replicaId: 'registry', autoReconcile: false });
  await Promise.all(HOSTS.map((h, i) => fleet.startAgentOn(h, i, ROOMY)));
  for (const h of HOSTS) await fleet.waitFor(`${h} READY`, async () => ((await fleet.host(h)).lifecycle.state === 'READY' ? true : undefined));
});

afterAll(async () => {
  await fleet?.cleanup();
});

async function containersOf(groupId: string): Promise<{ host: string; running: boolean }[]> {
  const out: { host: string; running: boolean }[] = [];
  for (const [i, h] of HOSTS.entries()) {
    const host = fleet.hosts[i]!;
    const list = await host.docker.listContainers({ all: true });
    for (const c of list) if (Object.values(c.Labels ?? {}).includes(groupId)) out.push({ host: h, running: c.State === 'running' });
  }
  return out;
}

async function settled(groupId: string, source: string): Promise<GroupRecord | undefined> {
  const g = await fleet.group(groupId);
  if (g.lifecycle.state === 'LOST') return g;
  return g.lifecycle.state === 'STOPPED' && g.lifecycle.hostId !== source && g.evacuation === undefined ? g : undefined;
}

describe('leader killed during a migration', () => {
  it(`finishes every one of ${SCHEDULES} randomized kill schedules without double placement or silent loss`, async () => {
    const outcomes: string[] = [];
    for (let s = 0; s < SCHEDULES; s++) {
      const random = rng(1000 + s);
      // Every host READY again (the previous schedule's source was removed and re-registers).
      for (const [i, h] of HOSTS.entries()) {
        if ((await fleet.host(h)).lifecycle.state !== 'READY') {
          await fleet.stopAgent(h);
          await fleet.startAgentOn(h, i, ROOMY);
          await fleet.waitFor(`${h} READY`, async () => ((await fleet.host(h)).lifecycle.state === 'READY' ? true : undefined));
        }
      }
      const { group } = await registry.runner.openGroup({ idempotencyKey: key(), conversationId: `conv-lk-${s}`, members: [{ memberId: 'm1', cli: 'claude_code' }] });
      const groupId = group.groupId;
      const begun = await registry.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
      await fleet.writeSession(begun.hostId, begun.containerId, `sess-${s}`);
      await registry.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: `sess-${s}`, evidence: SUCCESS });
      // Odd schedules start from a clean stop with a checkpoint; even ones from a running group.
      if (s % 2 === 1) await registry.runner.stopGroup({ idempotencyKey: key(), groupId });
      const source = (await fleet.group(groupId)).lifecycle.hostId;
      await registry.drainHost(source);

      const killAt = 1 + Math.floor(random() * 7);
      let calls = 0;
      let dead = false;
      let killedAt = 'never';
      const leaderA = await fleet.startPlane({ replicaId: `leader-a-${s}`, autoReconcile: false, stepHook: (step) => {
        if (dead) throw new Killed('already dead');
        if (++calls === killAt) {
          dead = true;
          killedAt = step;
          throw new Killed(step);
        }
      } });
      for (let pass = 0; pass < 40 && !dead && (await settled(groupId, source)) === undefined; pass++) await leaderA.reconcileOnce();
      await leaderA.stop();

      // Never on two hosts at once; and what runs, runs where the group record places it (a leader
      // killed before the stop leaves a running group running on its source, as it should).
      const running = (await containersOf(groupId)).filter((c) => c.running);
      const runningHosts = [...new Set(running.map((c) => c.host))];
      expect(runningHosts.length, `schedule ${s} (kill at ${killedAt}): running on ${runningHosts.join(', ')}`).toBeLessThanOrEqual(1);
      if (runningHosts.length === 1) {
        const now = await fleet.group(groupId);
        expect({ state: now.lifecycle.state, host: now.lifecycle.hostId }, `schedule ${s} (kill at ${killedAt})`).toEqual({ state: 'RUNNING', host: runningHosts[0] });
      }

      const leaderB = await fleet.startPlane({ replicaId: `leader-b-${s}`, autoReconcile: false });
      let final: GroupRecord | undefined;
      for (let pass = 0; pass < 60 && final === undefined; pass++) {
        await leaderB.reconcileOnce();
        final = await settled(groupId, source);
      }
      await leaderB.stop();
      if (final === undefined) {
        // Say where it stuck: the group as stored and its last events.
        const g = await fleet.group(groupId);
        const { events } = await fleet.store.events.read({ subjectKind: 'group', subjectId: groupId, limit: 50 });
        const trail = events.slice(-8).map((e) => `${e.event.type}${e.event.reason ? `(${e.event.reason})` : ''}`).join(' > ');
        expect.fail(`schedule ${s} (kill at ${killedAt}) did not finish: ${g.lifecycle.state} on ${g.lifecycle.hostId}, evacuation ${JSON.stringify(g.evacuation)}; events: ${trail}`);
      }
      if (final!.lifecycle.state === 'LOST') expect(final!.lifecycle.lostReason).toBeDefined();
      else expect(final!.lifecycle.generation).toBe(2);
      outcomes.push(`${s}:${killedAt}:${final!.lifecycle.state}`);

      // The source re-registers; it deletes what it no longer owns, so only the final host keeps the group.
      await fleet.waitFor('source removed', async () => ((await fleet.host(source)).lifecycle.state === 'REMOVED' ? true : undefined), 30_000);
      const idx = HOSTS.indexOf(source);
      await fleet.stopAgent(source);
      await fleet.startAgentOn(source, idx, ROOMY);
      await fleet.waitFor('source orphans deleted', async () => ((await containersOf(groupId)).every((c) => c.host === final!.lifecycle.hostId) ? true : undefined), 30_000);
    }
    // Most schedules must end with the group moved; LOST is allowed only with a reason (above).
    expect(outcomes.filter((o) => o.endsWith('STOPPED')).length).toBe(SCHEDULES);
    console.log(`leader-kill schedules: ${outcomes.join(' ')}`);
  });
});

/** The real control-plane binary as a child process against the test NATS (leader election on KV). */
function spawnControlPlane(stateDir: string, replicaId: string): ChildProcess {
  return spawn(process.execPath, ['--import', 'tsx', 'cmd/control-plane/main.ts'], {
    env: {
      ...process.env,
      SANDBOXFLEET_NATS_URL: fleet.nats.server.url,
      SANDBOXFLEET_STATE_DIR: stateDir,
      SANDBOXFLEET_HTTP_PORT: '0',
      // This test drives the control plane through NATS only: plaintext gRPC on loopback, any port.
      SANDBOXFLEET_GRPC_INSECURE: '1',
      SANDBOXFLEET_GRPC_HOST: '127.0.0.1',
      SANDBOXFLEET_GRPC_PORT: '0',
      SANDBOXFLEET_REPLICA_ID: replicaId,
      SANDBOXFLEET_ALLOWED_AGENT_SHAS: TEST_AGENT_SHA,
      SANDBOXFLEET_ALLOWED_IMAGE_DIGESTS: fleet.image.imageId,
      SANDBOXFLEET_HEARTBEAT_INTERVAL_MS: '500',
      SANDBOXFLEET_HEARTBEAT_TTL_MS: '3000',
      SANDBOXFLEET_DEAD_GRACE_MS: '2000',
      SANDBOXFLEET_RECONCILE_INTERVAL_MS: '250',
      SANDBOXFLEET_STOP_GRACE_MS: '5000',
      SANDBOXFLEET_TURN_WAIT_MS: '3000',
      SANDBOXFLEET_LEADER_RENEW_MS: '1000',
      LOG_LEVEL: 'warn',
    },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
}

describe('control-plane process killed during a migration', () => {
  it('a second process takes the leader lease and finishes the migration', async () => {
    for (const [i, h] of HOSTS.entries()) {
      if ((await fleet.host(h)).lifecycle.state !== 'READY') {
        await fleet.stopAgent(h);
        await fleet.startAgentOn(h, i, ROOMY);
        await fleet.waitFor(`${h} READY`, async () => ((await fleet.host(h)).lifecycle.state === 'READY' ? true : undefined));
      }
    }
    const dir = await mkdtemp(join(tmpdir(), 'sf-cpkill-'));
    const first = spawnControlPlane(join(dir, 'one'), 'proc-one');
    let second: ChildProcess | undefined;
    try {
      const { group } = await registry.runner.openGroup({ idempotencyKey: key(), conversationId: 'conv-process-kill', members: [{ memberId: 'm1', cli: 'claude_code' }] });
      const groupId = group.groupId;
      const begun = await registry.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
      await fleet.writeSession(begun.hostId, begun.containerId, 'sess-proc');
      await registry.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-proc', evidence: SUCCESS });
      const source = (await fleet.group(groupId)).lifecycle.hostId;
      await registry.drainHost(source);
      // Kill -9 as soon as the leader process has begun working on the group.
      // (A migration can finish in well under a second, so poll tightly; the kill may land anywhere.)
      const deadline = Date.now() + 60_000;
      for (;;) {
        const g = await fleet.group(groupId);
        if (g.evacuation !== undefined || g.lifecycle.hostId !== source) break;
        if (Date.now() > deadline) throw new Error('the control-plane process never started the migration');
        await new Promise((r) => setTimeout(r, 10));
      }
      first.kill('SIGKILL');
      second = spawnControlPlane(join(dir, 'two'), 'proc-two');
      // The killed leader's lease expires by TTL (15 s); the second process then leads and finishes.
      const final = await fleet.waitFor('migration finished by the second process', () => settled(groupId, source), 90_000);
      expect(final.lifecycle.state).toBe('STOPPED');
      expect(final.lifecycle.generation).toBe(2);
      expect((await containersOf(groupId)).filter((c) => c.running), 'running containers of the stopped group').toEqual([]);
    } finally {
      first.kill('SIGKILL');
      if (second) {
        const exited = new Promise((r) => second!.once('exit', r));
        second.kill('SIGTERM');
        await exited;
      }
      await rm(dir, { recursive: true, force: true });
    }
  });
});
