// Crash safety of the migration controller (R-R3, R-R2, R-R1): a leader is killed at a step
// boundary of a planned migration (20 schedules, in-process leaders with a kill switch in the step
// hook), then a fresh leader takes over from persisted state only. Each schedule names its kill
// point; the first schedules of each kind go through every boundary before the placement switch,
// later ones draw one from a seeded PRNG. A schedule whose kill point is never reached counts as
// not killing, and the suite requires MIN_KILLS real kills and every boundary killed at least once.
// For each kill it proves: the killed leader did exactly the steps up to the kill point, the group
// was still mid-migration when it died (evacuation pending, placement not switched), and the second
// leader did the remaining steps (every later boundary, the switch, and the migration_completed
// event is its own). Every schedule must finish: the group ends placed on exactly one other host
// (or LOST with a reason, never silently), never has containers running on two hosts, and after
// the source host re-registers no container of the group is left anywhere but on its final host.
// A second test kills -9 the real control-plane process after it started a migration and before
// it did anything more, and checks a second process did the rest. Real nats-server, dockerd hosts
// and agents.
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
/** At least this many schedules must really kill their leader mid-migration. */
const MIN_KILLS = Math.ceil(SCHEDULES * 0.9);

/**
 * The step boundaries (StepHook names) of a planned migration, in order, up to the placement
 * switch: from a running group (stop, checkpoint, intent, restore) and from a cleanly stopped one
 * whose checkpoint is current (intent, restore). `after_switch` is left out: past it the migration
 * is complete in the record and no leader has a step left to do.
 */
const STEPS = {
  running: ['before_stop', 'after_stop', 'before_checkpoint', 'after_checkpoint', 'before_intent', 'after_intent', 'before_restore', 'after_restore'],
  stopped: ['before_intent', 'after_intent', 'before_restore', 'after_restore'],
} as const;
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

/** The group's audit events of one type, with the replica that wrote each. */
async function eventsOf(groupId: string, type: string): Promise<string[]> {
  const { events } = await fleet.store.events.read({ subjectKind: 'group', subjectId: groupId, limit: 200 });
  return events.filter((e) => e.event.type === type).map((e) => e.event.actor);
}

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
  it(`finishes every one of ${SCHEDULES} kill schedules without double placement or silent loss, each killed mid-migration and finished by the second leader`, async () => {
    const outcomes: string[] = [];
    const killedAt = new Set<string>();
    let kills = 0;
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
      const kind = s % 2 === 1 ? 'stopped' : 'running';
      if (kind === 'stopped') await registry.runner.stopGroup({ idempotencyKey: key(), groupId });
      const source = (await fleet.group(groupId)).lifecycle.hostId;
      await registry.drainHost(source);

      // The kill point: each boundary in turn for the first schedules of a kind, then seeded draws.
      const steps: readonly string[] = STEPS[kind];
      const nth = Math.floor(s / 2);
      const killAt = steps[nth < steps.length ? nth : Math.floor(random() * steps.length)]!;
      const label = `schedule ${s} (${kind}, kill at ${killAt})`;
      const stepsA: string[] = [];
      const stepsB: string[] = [];
      let dead = false;
      const leaderA = await fleet.startPlane({ replicaId: `leader-a-${s}`, autoReconcile: false, stepHook: (step, g) => {
        if (dead) throw new Killed('already dead');
        if (g !== groupId) return;
        stepsA.push(step);
        if (step === killAt) {
          dead = true;
          throw new Killed(step);
        }
      } });
      for (let pass = 0; pass < 40 && !dead && (await settled(groupId, source)) === undefined; pass++) await leaderA.reconcileOnce();
      await leaderA.stop();

      if (dead) {
        kills += 1;
        killedAt.add(`${kind}:${killAt}`);
        // The killed leader did exactly the boundaries before its kill point, and died mid-migration:
        // the evacuation is still pending and the placement is not switched.
        expect(stepsA, `${label}: steps of the killed leader`).toEqual(steps.slice(0, steps.indexOf(killAt) + 1));
        const atDeath = await fleet.group(groupId);
        expect({ evacuating: atDeath.evacuation !== undefined, generation: atDeath.lifecycle.generation }, `${label}: group when the leader died`).toEqual({ evacuating: true, generation: 1 });
        expect(await eventsOf(groupId, 'group_migration_completed'), `${label}: nothing completed before the kill`).toEqual([]);
      }

      // Never on two hosts at once; and what runs, runs where the group record places it (a leader
      // killed before the stop leaves a running group running on its source, as it should).
      const running = (await containersOf(groupId)).filter((c) => c.running);
      const runningHosts = [...new Set(running.map((c) => c.host))];
      expect(runningHosts.length, `${label}: running on ${runningHosts.join(', ')}`).toBeLessThanOrEqual(1);
      if (runningHosts.length === 1) {
        const now = await fleet.group(groupId);
        expect({ state: now.lifecycle.state, host: now.lifecycle.hostId }, label).toEqual({ state: 'RUNNING', host: runningHosts[0] });
      }

      const leaderB = await fleet.startPlane({ replicaId: `leader-b-${s}`, autoReconcile: false, stepHook: (step, g) => {
        if (g === groupId) stepsB.push(step);
      } });
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
        expect.fail(`${label} did not finish: ${g.lifecycle.state} on ${g.lifecycle.hostId}, evacuation ${JSON.stringify(g.evacuation)}; events: ${trail}`);
      }
      if (final!.lifecycle.state === 'LOST') expect(final!.lifecycle.lostReason).toBeDefined();
      else expect(final!.lifecycle.generation).toBe(2);
      if (dead && final!.lifecycle.state !== 'LOST') {
        // The second leader did the remaining steps: every boundary after the kill point, the
        // switch, and the completion event is its own.
        const remaining = [...steps.slice(steps.indexOf(killAt) + 1), 'after_switch'];
        expect(remaining.filter((step) => !stepsB.includes(step)), `${label}: steps the second leader did not do (it did ${stepsB.join(', ')})`).toEqual([]);
        expect(await eventsOf(groupId, 'group_migration_completed'), `${label}: who completed the migration`).toEqual([`control-plane/leader-b-${s}`]);
      }
      outcomes.push(`${s}:${dead ? killAt : 'not-killed'}:${final!.lifecycle.state}`);

      // The source re-registers; it deletes what it no longer owns, so only the final host keeps the group.
      await fleet.waitFor('source removed', async () => ((await fleet.host(source)).lifecycle.state === 'REMOVED' ? true : undefined), 30_000);
      const idx = HOSTS.indexOf(source);
      await fleet.stopAgent(source);
      await fleet.startAgentOn(source, idx, ROOMY);
      await fleet.waitFor('source orphans deleted', async () => ((await containersOf(groupId)).every((c) => c.host === final!.lifecycle.hostId) ? true : undefined), 30_000);
    }
    console.log(`leader-kill schedules (${kills} of ${SCHEDULES} killed mid-migration): ${outcomes.join(' ')}`);
    // Most schedules must end with the group moved; LOST is allowed only with a reason (above).
    expect(outcomes.filter((o) => o.endsWith('STOPPED')).length).toBe(SCHEDULES);
    // The kills happened: enough of them, and at every boundary before the switch.
    expect(kills, `schedules that reached their kill point: ${outcomes.join(' ')}`).toBeGreaterThanOrEqual(MIN_KILLS);
    if (SCHEDULES >= 2 * STEPS.running.length) {
      const missed = [...STEPS.running.map((x) => `running:${x}`), ...STEPS.stopped.map((x) => `stopped:${x}`)].filter((x) => !killedAt.has(x));
      expect(missed, 'kill points no schedule reached').toEqual([]);
    }
  });
});

/** The real control-plane binary as a child process against the test NATS (leader election on KV). */
function spawnControlPlane(stateDir: string, replicaId: string, env: Record<string, string> = {}): ChildProcess {
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
      ...env,
    },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
}

describe('control-plane process killed during a migration', () => {
  it('a second process takes the leader lease and does the rest of a migration the killed one started', async () => {
    for (const [i, h] of HOSTS.entries()) {
      if ((await fleet.host(h)).lifecycle.state !== 'READY') {
        await fleet.stopAgent(h);
        await fleet.startAgentOn(h, i, ROOMY);
        await fleet.waitFor(`${h} READY`, async () => ((await fleet.host(h)).lifecycle.state === 'READY' ? true : undefined));
      }
    }
    const dir = await mkdtemp(join(tmpdir(), 'sf-cpkill-'));
    // The first process waits (up to 2 minutes) for a turn in flight before it stops the group: the
    // migration it starts is held right after its first persisted step (the evacuation intent), so
    // the kill lands mid-migration every time, not wherever a sub-second migration happens to be.
    const first = spawnControlPlane(join(dir, 'one'), 'proc-one', { SANDBOXFLEET_TURN_WAIT_MS: '120000' });
    const firstExited = new Promise((r) => first.once('exit', r));
    let second: ChildProcess | undefined;
    try {
      const { group } = await registry.runner.openGroup({ idempotencyKey: key(), conversationId: 'conv-process-kill', members: [{ memberId: 'm1', cli: 'claude_code' }] });
      const groupId = group.groupId;
      const begun = await registry.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
      await fleet.writeSession(begun.hostId, begun.containerId, 'sess-proc');
      await registry.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-proc', evidence: SUCCESS });
      const inFlight = await registry.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
      const source = (await fleet.group(groupId)).lifecycle.hostId;
      await registry.drainHost(source);

      // The leader process starts the migration (its evacuation intent), then waits for the turn.
      await fleet.waitFor('the first process started the migration', async () => ((await eventsOf(groupId, 'evacuation_started')).length > 0 ? true : undefined), 60_000);
      expect(await eventsOf(groupId, 'evacuation_started'), 'who started the migration').toEqual(['control-plane/proc-one']);
      first.kill('SIGKILL');
      await firstExited;

      // Killed mid-migration: the intent is there, nothing after it happened.
      const atDeath = await fleet.group(groupId);
      expect({ state: atDeath.lifecycle.state, host: atDeath.lifecycle.hostId, generation: atDeath.lifecycle.generation, evacuating: atDeath.evacuation !== undefined })
        .toEqual({ state: 'RUNNING', host: source, generation: 1, evacuating: true });
      for (const type of ['group_stop_requested', 'group_stopped', 'checkpoint_created', 'group_migration_started', 'group_migration_completed']) {
        expect(await eventsOf(groupId, type), `${type} before the kill`).toEqual([]);
      }

      // The turn ends; the second process (normal turn wait) takes the lease once the killed
      // leader's expires (TTL 15 s) and does every remaining step.
      await registry.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: inFlight.turnId, observedLocator: 'sess-proc', evidence: SUCCESS });
      second = spawnControlPlane(join(dir, 'two'), 'proc-two');
      const final = await fleet.waitFor('migration finished by the second process', () => settled(groupId, source), 90_000);
      expect(final.lifecycle.state).toBe('STOPPED');
      expect(final.lifecycle.generation).toBe(2);
      expect((await containersOf(groupId)).filter((c) => c.running), 'running containers of the stopped group').toEqual([]);
      for (const type of ['group_stopped', 'group_migration_started', 'group_migration_completed']) {
        expect(await eventsOf(groupId, type), `who wrote ${type}`).toEqual(['control-plane/proc-two']);
      }
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
