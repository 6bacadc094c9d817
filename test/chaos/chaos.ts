// The seeded chaos suite (issue 15): on a ClusterFleet (3-node NATS cluster, R3; two control-plane
// replicas; real agents on real dockerd hosts), each schedule runs a live workload through the
// runner API, over gRPC with the runner SDK on any replica as a runner does (open groups, turns = BeginTurn + the CLI's session write + CompleteTurn, stops,
// restores = a turn on a stopped group, a drain) while its fault plan injects faults at seeded
// moments. Everything a schedule chooses — operations, fault kinds, targets, moments, hold times —
// comes from its seed (mulberry32), so `--seed N` replays the same plan; how the concurrent parts
// interleave is up to the machine, as in any such test.
//
// Fault kinds: a NATS node SIGKILLed and restarted (nats_kill) or SIGSTOPped past its heartbeat
// (nats_freeze); the leader replica crashed and a new one started (leader_crash); an agent
// SIGKILLed and restarted (agent_kill) or SIGSTOPped (agent_freeze); a host's disk wiped
// (dockerd_kill: dockerd SIGKILLed with its containers, data root deleted; the node comes back with
// an empty engine, the sandbox image and a restarted agent); a byte flipped in a cached checkpoint
// chunk (chunk_flip); a clock stepped forward or back and later stepped back (clock_jump): a
// control-plane replica's (the replicas take time from the ControlPlane's injectable clock) or, one
// time in three, a host agent's (its binary reads the system clock: a preload steps Date.now,
// test/support/clock-offset-preload.ts).
//
// A history of acknowledged operations is kept and checked against the final state (a small
// linearizability-style check of the turn API: every acknowledged CompleteTurn stays counted and
// its locator saved, and a group's session holds at least every acknowledged turn once it runs
// again, so nothing was restored from a checkpoint older than its last turn). Invariants:
//   - at most one running container per group across all engines (sampled every second), exactly
//     one at the end for every live group;
//   - every acknowledged CompleteTurn is still there (acked_writes_lost);
//   - nothing restored from a stale or older-than-last-turn checkpoint (restored_stale);
//   - every LOST group has a reason and a LOST event (else a silent loss), and is counted in the
//     LOST metric by its reason (else lost_uncounted);
//   - no group in a transitional state (PENDING, STOPPING, MIGRATING, an evacuation mark) once the
//     faults are over and the evacuation deadline has passed.
//   - a stale host that speaks is fenced: an agent thawed after its host was declared DEAD while it
//     was frozen gets at least one report counted as fenced (sandboxfleet_fenced_reports_total)
//     or registers again at a newer epoch within 15 s, and its host is never READY again at the
//     dead epoch (else unfenced_stale_host). All fenced reports of a schedule are counted as
//     fenced_reports; how many there are depends on the interleaving.
import { readdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { GroupRecord } from '../../src/control-plane/records.ts';
import { RunnerError, WireContextState as ContextState } from '../../src/runner-sdk/index.ts';
import { nativeSessionPath, writeNativeSession } from '../support/native-session.ts';
import { waitFor, type ClusterFleet, type Replica } from './cluster-fleet.ts';
import { isFinalRefusal, retryCall, WIRE_SUCCESS } from './workload.ts';

export const FAULT_KINDS = ['nats_kill', 'nats_freeze', 'leader_crash', 'agent_kill', 'agent_freeze', 'chunk_flip', 'dockerd_kill', 'clock_jump'] as const;
export type FaultKind = (typeof FAULT_KINDS)[number];

/** mulberry32: a small seeded PRNG, so a schedule is replayed from its seed. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export interface PlannedFault {
  readonly kind: FaultKind;
  /** When, from the workload's start. */
  readonly atMs: number;
  /** How long the fault lasts before it is healed (restart, SIGCONT, new replica). */
  readonly holdMs: number;
  /** Which node / host / replica (index); unused for leader_crash. */
  readonly target: number;
  /**
   * chunk_flip: which cached chunk (a fraction of the sorted list) and which byte of it;
   * clock_jump: how far and which way the clock steps (clockJumpMs).
   */
  readonly pick: number;
}

/**
 * A clock_jump's step: 0.5-2.5 s back (pick < 0.5) or forward. Within the clock skew the control
 * plane allows for between its replicas (CLOCK_SKEW_MS, 5 s) and half the time a host has to
 * heartbeat before it is declared dead here (heartbeat TTL + dead grace = 5 s in
 * CLUSTER_FAST_CONFIG): larger steps break the fleet's stated assumptions rather than test them.
 */
export function clockJumpMs(pick: number): number {
  const size = 500 + Math.floor(Math.abs(pick * 2 - 1) * 2_000);
  return pick < 0.5 ? -size : size;
}

export interface SchedulePlan {
  readonly seed: number;
  readonly durationMs: number;
  readonly faults: readonly PlannedFault[];
}

/** The fault plan of `seed`: 1-3 faults at random moments of the workload, each healed before the next. */
export function planSchedule(seed: number, durationMs: number, kinds: readonly FaultKind[] = FAULT_KINDS): SchedulePlan {
  const r = rng(seed);
  const count = 1 + Math.floor(r() * 3);
  const moments = Array.from({ length: count }, () => Math.floor(2_000 + r() * Math.max(1, durationMs - 6_000))).sort((a, b) => a - b);
  const faults = moments.map((atMs) => {
    const kind = kinds[Math.floor(r() * kinds.length)]!;
    // Freezes last past the detection times: Raft heartbeats (~1 s) for NATS, heartbeat TTL +
    // dead grace (3 s + 2 s here) for an agent, sometimes not (a short stall must be ridden out).
    // A clock stays stepped for as long before it is stepped back.
    const holdMs = kind === 'nats_freeze' ? 2_000 + Math.floor(r() * 6_000)
      : kind === 'agent_freeze' || kind === 'clock_jump' ? 1_000 + Math.floor(r() * 8_000)
      : kind === 'leader_crash' || kind === 'chunk_flip' ? 0
      : 500 + Math.floor(r() * 4_000);
    return { kind, atMs, holdMs, target: Math.floor(r() * 3), pick: r() };
  });
  return { seed, durationMs, faults };
}

export interface FaultOutcome {
  readonly kind: FaultKind;
  readonly target: string;
  readonly atMs: number;
  /**
   * From the heal (restart, SIGCONT; for a leader crash the crash itself) until the fleet was
   * healthy again: every NATS node current, a leader, every host READY.
   */
  readonly recoveryS: number;
}

export interface ScheduleResult {
  readonly seed: number;
  readonly faults: readonly FaultOutcome[];
  readonly ackedOperations: number;
  readonly ackedOpsByKind: Record<string, number>;
  readonly refused: number;
  /** Calls that failed for good, by gRPC code and reason (`FAILED_PRECONDITION/group_lost`): none acknowledged. */
  readonly unacknowledgedByCode: Record<string, number>;
  readonly violations: readonly string[];
  readonly ackedWritesLost: number;
  readonly doubleRunning: number;
  readonly silentLosses: number;
  readonly lost: number;
  readonly groups: number;
  /** Agent reports fenced by the control plane during the schedule (sandboxfleet_fenced_reports_total). */
  readonly fencedReports: number;
  readonly wallS: number;
}

interface GroupHistory {
  readonly groupId: string;
  readonly locator: string;
  /** CompleteTurns acknowledged. */
  ackedTurns: number;
  /** Turns whose session line was written (acknowledged or not): the most lines the session may hold. */
  writtenTurns: number;
}

const TRANSITIONAL = new Set(['PENDING', 'STOPPING', 'MIGRATING']);

/** Run one schedule on `fleet`, which must be healthy; leaves it healthy (or throws). */
export interface WorkloadOptions {
  /**
   * One operator drain per schedule at most (default true). A drain that races a turn's start on the
   * same group can leave the losing start's container running on the drained host (seeds 1056, 1072).
   */
  readonly drain?: boolean;
}

export async function runSchedule(fleet: ClusterFleet, plan: SchedulePlan, log: (s: string) => void = () => undefined, opts: WorkloadOptions = {}): Promise<ScheduleResult> {
  const started = Date.now();
  const fencedBefore = await fleet.fencedReports();
  const lostCountedBefore = await fleet.lostSessions();
  const r = rng(plan.seed ^ 0x5eed);
  const violations: string[] = [];
  const history = new Map<string, GroupHistory>();
  const acked: Record<string, number> = {};
  let refused = 0;
  const unacknowledged: Record<string, number> = {};
  let opSeq = 0;
  const ack = (kind: string): void => void (acked[kind] = (acked[kind] ?? 0) + 1);
  const key = (w: number): string => `s${plan.seed}-w${w}-${++opSeq}`;
  const doubleRunning = new Set<string>();
  let running = true;
  // What the schedule is waiting on, said when it runs long (a hung call shows where it hangs).
  let phase = 'workload';
  const doing: string[] = [];
  const watchdog = setInterval(() => {
    const s = Math.round((Date.now() - started) / 1000);
    if (s >= 120) log(`  still running after ${s} s: ${phase}; workers ${doing.map((d, w) => `${w}=${d}`).join(' ')}`);
  }, 30_000);
  watchdog.unref();

  // Any replica's runner API answers (a follower forwards nothing: every call is CAS on the store);
  // a runner reaches them over gRPC (each replica's server, the SDK client with no retries of its own).
  const api = (): Replica => {
    const live = fleet.replicas;
    if (live.length === 0) throw new Error('no control-plane replica');
    return live[Math.floor(r() * live.length)]!;
  };
  const hostIndex = (hostId: string): number => fleet.hostIds.indexOf(hostId);

  const turn = async (w: number, h: GroupHistory): Promise<void> => {
    const k = key(w);
    const begun = await retryCall(() => api().runner.beginTurn({ groupId: h.groupId, memberId: 'm1' }, { idempotencyKey: `${k}-b` }), 30_000);
    ack(begun.contextState === ContextState.RESTORED ? 'restore' : 'begin_turn');
    await writeNativeSession(fleet.hosts[hostIndex(begun.hostId)]!.docker, begun.containerId, 'claude_code', h.locator);
    h.writtenTurns += 1;
    await retryCall(() => api().runner.completeTurn({ groupId: h.groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: h.locator, evidence: WIRE_SUCCESS }, { idempotencyKey: `${k}-c` }), 30_000);
    h.ackedTurns += 1;
    ack('complete_turn');
  };

  let drained = opts.drain === false;
  const worker = async (w: number): Promise<void> => {
    const mine: GroupHistory[] = [];
    while (running) {
      const p = r();
      doing[w] = `op ${opSeq + 1} since ${new Date().toISOString().slice(11, 19)}`;
      try {
        if (mine.length === 0 || (p < 0.12 && mine.length < 3)) {
          const conversationId = `c-${plan.seed}-${w}-${mine.length}`;
          const k = key(w);
          const { group } = await retryCall(() => api().runner.openGroup({ conversationId, members: [{ memberId: 'm1', cli: 'claude-code' }] }, { idempotencyKey: k }), 30_000);
          if (group === undefined) throw new Error('OpenGroup answered no group');
          ack('open_group');
          const h: GroupHistory = { groupId: group.groupId, locator: `sess-${plan.seed}-${w}-${mine.length}`, ackedTurns: 0, writtenTurns: 0 };
          mine.push(h);
          history.set(h.groupId, h);
          continue;
        }
        const h = mine[Math.floor(r() * mine.length)]!;
        if (p < 0.75) await turn(w, h);
        else if (p < 0.95 || drained) {
          const k = key(w);
          await retryCall(() => api().runner.stopGroup({ groupId: h.groupId }, { idempotencyKey: k }), 30_000);
          ack('stop_group');
        } else {
          // One drain per schedule at most: the group's host is emptied and must register again.
          drained = true;
          const g = await fleet.group(h.groupId);
          if (g !== undefined && g.lifecycle.state !== 'LOST') {
            const leader = fleet.leader() ?? api();
            await leader.plane.drainHost(g.lifecycle.hostId);
            ack('drain_host');
          }
        }
      } catch (err) {
        // A retried-out call, or an internal error (a runner does not retry it, and a fault should
        // answer UNAVAILABLE instead): said, with what the replica answered.
        if (!isFinalRefusal(err) || (err instanceof RunnerError && err.codeName === 'INTERNAL')) log(`  op failed (not acknowledged): ${(err as Error).message.slice(0, 160)}`);
        const code = err instanceof RunnerError ? `${err.codeName}/${err.reason}` : (err as Error).name;
        unacknowledged[code] = (unacknowledged[code] ?? 0) + 1;
        refused += 1;
        await sleep(300);
      }
    }
    doing[w] = 'done';
  };

  // Sampled every second: a group's containers running on two engines at once.
  const monitor = (async () => {
    while (running) {
      for (const groupId of history.keys()) {
        const hostsRunning = new Set((await fleet.containersOf(groupId)).filter((c) => c.running).map((c) => c.host));
        if (hostsRunning.size > 1 && !doubleRunning.has(groupId)) {
          doubleRunning.add(groupId);
          violations.push(`double_running: ${groupId} running on ${[...hostsRunning].join(', ')}`);
        }
      }
      await sleep(1_000);
    }
  })();

  const faults: FaultOutcome[] = [];
  const injector = (async () => {
    for (const f of plan.faults) {
      const wait = started + f.atMs - Date.now();
      if (wait > 0) await sleep(wait);
      const { target, healedAt, unfenced } = await inject(fleet, f, log);
      if (unfenced !== undefined) violations.push(unfenced);
      await waitHealthy(fleet, 180_000);
      faults.push({ kind: f.kind, target, atMs: f.atMs, recoveryS: (Date.now() - healedAt) / 1000 });
    }
  })();

  const workers = [worker(0), worker(1)];
  await sleep(plan.durationMs);
  phase = 'faults still being injected or healed';
  await injector;
  running = false;
  phase = 'workers finishing their last call';
  await Promise.all(workers);
  phase = 'monitor finishing its sample';
  await monitor;

  // ---- final checks -------------------------------------------------------------------------
  phase = 'final checks: fleet healthy';
  await waitHealthy(fleet, 180_000);
  // Hosts drained or found DEAD register again (agents restart), as an operator would bring them back.
  for (const [i, hostId] of fleet.hostIds.entries()) {
    const h = await fleet.host(hostId);
    if (h?.lifecycle.state !== 'READY') {
      await waitFor(`${hostId} holds nothing before it re-registers`, async () => {
        const x = await fleet.host(hostId);
        return x === undefined || x.lifecycle.state === 'REMOVED' || x.lifecycle.state === 'READY' || x.lifecycle.state === 'DEAD' ? true : undefined;
      }, 120_000);
      await fleet.killAgent(i);
      await fleet.startAgent(i);
    }
  }
  await waitHealthy(fleet, 180_000);

  phase = 'final checks: groups settled';
  // No group stays transitional past the evacuation deadline once the faults are over.
  const settleMs = fleet.config.evacuationDeadlineMs + 30_000;
  const finals = new Map<string, GroupRecord>();
  for (const groupId of history.keys()) {
    try {
      finals.set(groupId, await waitFor(`${groupId} settled`, async () => {
        const g = await fleet.group(groupId);
        return g !== undefined && !TRANSITIONAL.has(g.lifecycle.state) && g.evacuation === undefined ? g : undefined;
      }, settleMs, 500));
    } catch {
      const g = await fleet.group(groupId);
      violations.push(`stuck: ${groupId} ${g?.lifecycle.state}${g?.evacuation ? ' evacuating' : ''} after ${settleMs} ms`);
    }
  }

  phase = 'final checks: a turn on every group';
  let ackedWritesLost = 0;
  let silentLosses = 0;
  let lost = 0;
  /** Member sessions of this schedule's groups that ended LOST, by reason (what the metric must have counted). */
  const lostSessions = new Map<string, number>();
  for (const h of history.values()) {
    const g = finals.get(h.groupId);
    if (g === undefined) continue;
    if (g.lifecycle.state === 'LOST') {
      lost += 1;
      const reason = g.lifecycle.lostReason ?? 'operator_declared';
      lostSessions.set(reason, (lostSessions.get(reason) ?? 0) + g.members.length);
      const { events } = await fleet.store.events.read({ subjectKind: 'group', subjectId: h.groupId, limit: 500 });
      const lostEvent = events.some((e) => e.event.toState === 'LOST');
      if (g.lifecycle.lostReason === undefined || !lostEvent) {
        silentLosses += 1;
        violations.push(`silent_loss: ${h.groupId} LOST reason=${g.lifecycle.lostReason ?? 'none'} event=${lostEvent}`);
      }
      continue;
    }
    const session = g.members[0]!.session;
    if (session.completedTurns < h.ackedTurns || (h.ackedTurns > 0 && session.savedLocator !== h.locator)) {
      ackedWritesLost += Math.max(1, h.ackedTurns - session.completedTurns);
      violations.push(`acked_write_lost: ${h.groupId} has ${session.completedTurns} turns / ${session.savedLocator ?? 'no locator'}, ${h.ackedTurns} acknowledged / ${h.locator}`);
      continue;
    }
    // It runs again (a restore when stopped): its session holds every acknowledged turn, and
    // exactly one engine runs it.
    try {
      const k = `s${plan.seed}-final-${h.groupId}`;
      const begun = await retryCall(() => api().runner.beginTurn({ groupId: h.groupId, memberId: 'm1' }, { idempotencyKey: `${k}-b` }), 60_000);
      if (h.ackedTurns > 0) {
        const lines = await sessionLines(fleet, hostIndex(begun.hostId), begun.containerId, h.locator);
        if (lines < h.ackedTurns || lines > h.writtenTurns) violations.push(`restored_stale: ${h.groupId} session has ${lines} turns, ${h.ackedTurns} acknowledged, ${h.writtenTurns} written (${ContextState[begun.contextState]})`);
        await writeNativeSession(fleet.hosts[hostIndex(begun.hostId)]!.docker, begun.containerId, 'claude_code', h.locator);
      }
      await retryCall(() => api().runner.completeTurn({ groupId: h.groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: h.locator, evidence: WIRE_SUCCESS }, { idempotencyKey: `${k}-c` }), 60_000);
      const runningOn = (await fleet.containersOf(h.groupId)).filter((c) => c.running);
      if (runningOn.length !== 1 || runningOn[0]!.host !== begun.hostId) {
        violations.push(`not_exactly_one: ${h.groupId} running ${runningOn.length}x (${runningOn.map((c) => `${c.host}:${c.id.slice(0, 12)}`).join(', ')}), placed on ${begun.hostId}`);
      }
    } catch (err) {
      const g2 = await fleet.group(h.groupId);
      // A final refusal that declares the group LOST (with its reason) is a declared loss, not a violation.
      if (g2?.lifecycle.state === 'LOST' && g2.lifecycle.lostReason !== undefined) {
        lost += 1;
        lostSessions.set(g2.lifecycle.lostReason, (lostSessions.get(g2.lifecycle.lostReason) ?? 0) + g2.members.length);
      } else violations.push(`final_turn_failed: ${h.groupId} (${g2?.lifecycle.state}): ${(err as Error).message.slice(0, 200)}`);
    }
  }

  // Every LOST is counted in the metric too (sandboxfleet_lost_sessions_total, which the alert reads),
  // by its reason, on whichever replica wrote it. Groups of earlier schedules are destroyed, so what
  // the metric gained during this one is this schedule's.
  const lostCounted = await fleet.lostSessions();
  for (const [reason, n] of lostSessions) {
    const counted = (lostCounted.get(reason) ?? 0) - (lostCountedBefore.get(reason) ?? 0);
    if (counted < n) violations.push(`lost_uncounted: ${n} member session(s) LOST ${reason} in this schedule, the metric counted ${counted}`);
  }

  // Say what happened to every group a violation names, before it is destroyed.
  for (const groupId of new Set(violations.flatMap((v) => /\bg-[0-9a-f]+/.exec(v)?.[0] ?? []))) {
    log(`  ${groupId}: ${await trail(fleet, groupId).catch((err: unknown) => String(err))}`);
    log(`  ${groupId} containers: ${JSON.stringify(await fleet.containersOf(groupId))}`);
  }

  // Tidy up: the next schedule starts with empty engines.
  phase = 'destroying the groups';
  for (const groupId of history.keys()) {
    await retryCall(() => (fleet.leader() ?? api()).plane.admin.destroyGroup(groupId), 60_000).catch((err: unknown) => log(`  destroy ${groupId}: ${(err as Error).message}`));
  }
  clearInterval(watchdog);
  return {
    seed: plan.seed,
    faults,
    ackedOperations: Object.values(acked).reduce((a, b) => a + b, 0),
    ackedOpsByKind: acked,
    refused,
    unacknowledgedByCode: unacknowledged,
    violations,
    ackedWritesLost,
    doubleRunning: doubleRunning.size,
    silentLosses,
    lost,
    groups: history.size,
    fencedReports: (await fleet.fencedReports()) - fencedBefore,
    wallS: (Date.now() - started) / 1000,
  };
}

/** The group's event trail, for a violation report. */
export async function trail(fleet: ClusterFleet, groupId: string): Promise<string> {
  const { events } = await fleet.store.events.read({ subjectKind: 'group', subjectId: groupId, limit: 500 });
  return events.map((e) => `${e.event.type}${e.event.toState ? `>${e.event.toState}` : ''}${e.event.reason ? `(${e.event.reason})` : ''}${e.event.detail?.hostId ? `@${String(e.event.detail.hostId)}` : ''}`).join(' ');
}

/** History lines naming `locator` in the member's session file (one per turn written). */
async function sessionLines(fleet: ClusterFleet, index: number, containerId: string, locator: string): Promise<number> {
  const exec = await fleet.hosts[index]!.docker.getContainer(containerId).exec({
    Cmd: ['/bin/sh', '-c', 'grep -c . "$1" || true', 'sh', nativeSessionPath('claude_code', locator)],
    AttachStdout: true,
    AttachStderr: true,
  });
  const stream = await exec.start({});
  const out = await new Promise<string>((resolve, reject) => {
    let s = '';
    stream.on('data', (b: Buffer) => (s += b.toString('latin1')));
    stream.on('end', () => resolve(s));
    stream.on('error', reject);
  });
  // The attach stream is multiplexed (8-byte frame headers): the count is the last number in it.
  const m = /(\d+)\s*$/.exec(out.replace(/[^\x20-\x7e\n]/g, ''));
  return m === null ? 0 : Number(m[1]);
}

/**
 * Inject `f` and heal it after its hold time; returns what was hit and when the healing began (a
 * leader crash: the crash itself, since its replacement starting is part of the recovery).
 */
async function inject(fleet: ClusterFleet, f: PlannedFault, log: (s: string) => void): Promise<{ target: string; healedAt: number; unfenced?: string }> {
  const healed = (target: string, healedAt = Date.now()): { target: string; healedAt: number } => ({ target, healedAt });
  switch (f.kind) {
    case 'nats_kill': {
      const node = fleet.cluster.nodes[f.target % fleet.cluster.nodes.length]!;
      log(`  fault nats_kill ${node.name} for ${f.holdMs} ms`);
      await node.kill();
      await sleep(f.holdMs);
      const at = Date.now();
      await node.restart();
      return healed(node.name, at);
    }
    case 'nats_freeze': {
      const node = fleet.cluster.nodes[f.target % fleet.cluster.nodes.length]!;
      log(`  fault nats_freeze ${node.name} for ${f.holdMs} ms`);
      node.freeze();
      await sleep(f.holdMs);
      node.thaw();
      return healed(node.name);
    }
    case 'leader_crash': {
      const leader = fleet.leader() ?? fleet.replicas[0];
      if (leader === undefined) return healed('none');
      log(`  fault leader_crash ${leader.id}`);
      const at = Date.now();
      await fleet.crashReplica(leader);
      // Its pod is rescheduled: a new replica (a new id) joins; the lease passes on its expiry.
      await fleet.startReplica(`${leader.id.replace(/-r\d+$/, '')}-r${Date.now() % 100_000}`);
      return healed(leader.id, at);
    }
    case 'agent_kill': {
      const i = f.target % fleet.hosts.length;
      log(`  fault agent_kill ${fleet.hostIds[i]} for ${f.holdMs} ms`);
      await fleet.killAgent(i);
      await sleep(f.holdMs);
      const at = Date.now();
      await fleet.startAgent(i);
      return healed(fleet.hostIds[i]!, at);
    }
    case 'chunk_flip': {
      // A byte flipped in a checkpoint chunk the host keeps (its layer cache, named by digest): a
      // restore must notice (digest check) and use a good copy or refuse, never place bad data.
      const i = f.target % fleet.hosts.length;
      const root = join(fleet.hosts[i]!.dir, 'chunk-cache');
      const files = (await readdir(root, { recursive: true, withFileTypes: true }).catch(() => [])).filter((d) => d.isFile()).map((d) => join(d.parentPath, d.name)).sort();
      const file = files[Math.floor(f.pick * files.length)];
      if (file === undefined) {
        log(`  fault chunk_flip ${fleet.hostIds[i]}: no cached chunk yet`);
        return healed(`${fleet.hostIds[i]}:none`);
      }
      const data = await readFile(file);
      if (data.length > 0) {
        const at = Math.floor(f.pick * 7919) % data.length;
        data[at] = data[at]! ^ 0x01;
        await writeFile(file, data);
      }
      log(`  fault chunk_flip ${fleet.hostIds[i]} ${file.slice(-16)}`);
      return healed(`${fleet.hostIds[i]}:chunk`);
    }
    case 'dockerd_kill': {
      // The host's disk is wiped under its running agent (which sees the data root go and reports
      // it), then the node comes back: a fresh, empty dockerd on the same paths, the sandbox image
      // loaded as the node's bootstrap would, and the agent restarted (data loss is sticky for the
      // life of an agent process, so only a new one can serve the new engine).
      const i = f.target % fleet.hosts.length;
      log(`  fault dockerd_kill ${fleet.hostIds[i]} (data root deleted) for ${f.holdMs} ms`);
      await fleet.wipeDocker(i);
      await sleep(f.holdMs);
      const at = Date.now();
      await fleet.restoreDocker(i);
      await fleet.killAgent(i);
      await fleet.startAgent(i);
      return healed(fleet.hostIds[i]!, at);
    }
    case 'clock_jump': {
      const jumpMs = clockJumpMs(f.pick);
      if (f.target === 2) {
        // A host's clock: its agent reads the system clock, stepped through its preload.
        const i = Math.floor(f.pick * 997) % fleet.hosts.length;
        log(`  fault clock_jump agent ${fleet.hostIds[i]} ${jumpMs > 0 ? '+' : ''}${jumpMs} ms for ${f.holdMs} ms`);
        await fleet.jumpAgentClock(i, jumpMs);
        await sleep(f.holdMs);
        await fleet.jumpAgentClock(i, -jumpMs);
        return healed(`${fleet.hostIds[i]}:clock`);
      }
      const replica = fleet.replicas[f.target % Math.max(1, fleet.replicas.length)];
      if (replica === undefined) return healed('none');
      log(`  fault clock_jump ${replica.id}${replica.plane.leader.isLeader ? ' (leader)' : ''} ${jumpMs > 0 ? '+' : ''}${jumpMs} ms for ${f.holdMs} ms`);
      fleet.jumpClock(replica, jumpMs);
      await sleep(f.holdMs);
      // Corrected (NTP steps it back): a jump the other way, as sudden as the first.
      fleet.jumpClock(replica, -jumpMs);
      return healed(replica.id);
    }
    case 'agent_freeze': {
      const i = f.target % fleet.hosts.length;
      const agent = fleet.agents.get(fleet.hostIds[i]!);
      const hostId = fleet.hostIds[i]!;
      log(`  fault agent_freeze ${hostId} for ${f.holdMs} ms`);
      agent?.kill('SIGSTOP');
      await sleep(f.holdMs);
      // Declared DEAD while frozen: the thawed agent still beats with that epoch, a stale host
      // speaking, which the control plane must fence and count. (A read that fails under another
      // fault leaves the check out.)
      const fencedBefore = await fleet.fencedReports();
      const frozenHost = agent === undefined ? undefined : await fleet.host(hostId).catch(() => undefined);
      const deadEpoch = frozenHost?.lifecycle.state === 'DEAD' ? frozenHost.lifecycle.epoch : undefined;
      agent?.kill('SIGCONT');
      const at = Date.now();
      if (deadEpoch !== undefined) {
        log(`  ${hostId} was declared DEAD while its agent was frozen`);
        // Fenced (a report counted) or registered again at a newer epoch before speaking with the dead
        // one (a registration under way when it froze): both keep the stale host out. READY again at
        // the dead epoch would be a stale host let back in.
        const outcome = await waitFor('a fenced report or a new registration', async () => {
          const h = await fleet.host(hostId);
          if (h?.lifecycle.state === 'READY' && h.lifecycle.epoch === deadEpoch) return 'revived';
          if ((await fleet.fencedReports()) > fencedBefore) return 'fenced';
          return h?.lifecycle.state === 'READY' && h.lifecycle.epoch > deadEpoch ? 'registered' : undefined;
        }, 15_000).catch(() => 'silent');
        if (outcome === 'revived') return { ...healed(hostId, at), unfenced: `unfenced_stale_host: ${hostId} was declared DEAD at epoch ${deadEpoch} while its agent was frozen, and is READY again at that epoch` };
        if (outcome === 'silent') return { ...healed(hostId, at), unfenced: `unfenced_stale_host: ${hostId} was declared DEAD while its agent was frozen; within 15 s of the thaw no report of it was counted as fenced and it did not register again` };
        if (outcome === 'registered') log(`  ${hostId} registered again (a newer epoch) before any report with the dead one`);
      }
      return healed(hostId, at);
    }
  }
}

/**
 * Healthy: every NATS node up and current, a leader, and every host READY (an agent that found
 * itself fenced or its host DEAD registers again by itself; one that has not within 30 s is
 * restarted, as its supervisor would). A host an operator drained stays out until the schedule ends.
 */
export async function waitHealthy(fleet: ClusterFleet, timeoutMs: number): Promise<void> {
  const end = Date.now() + timeoutMs;
  const left = (): number => Math.max(1_000, end - Date.now());
  await fleet.cluster.waitHealthy(timeoutMs);
  await waitFor('a control-plane leader', async () => fleet.leader(), left());
  for (const [i, hostId] of fleet.hostIds.entries()) {
    const agent = fleet.agents.get(hostId);
    if (agent === undefined || agent.child.exitCode !== null || agent.child.signalCode !== null) {
      await fleet.killAgent(i);
      await fleet.startAgent(i);
    }
    const ready = async (): Promise<true | undefined> => {
      const state = (await fleet.host(hostId))?.lifecycle.state;
      return state === 'READY' || state === 'DRAINING' || state === 'REMOVED' ? true : undefined;
    };
    try {
      await waitFor(`${hostId} READY`, ready, Math.min(30_000, left()));
    } catch {
      await fleet.killAgent(i);
      await fleet.startAgent(i);
      await waitFor(`${hostId} READY after an agent restart`, ready, left());
    }
  }
}

/** A fleet for the chaos suite: its hosts registered and READY, two replicas. */
export async function readyFleet(fleet: ClusterFleet): Promise<void> {
  if (fleet.replicas.length === 0) {
    await fleet.startReplica('cp-a');
    await fleet.startReplica('cp-b');
  }
  for (const [i] of fleet.hostIds.entries()) if (!fleet.agents.has(fleet.hostIds[i]!)) await fleet.startAgent(i);
  for (const hostId of fleet.hostIds) await fleet.waitReady(hostId, 120_000);
}

export interface ChaosFigures {
  readonly schedules: number;
  readonly seeds: readonly number[];
  readonly faults_by_kind: Record<string, number>;
  readonly acked_operations: number;
  readonly acked_operations_by_kind: Record<string, number>;
  /** Operations that failed for good (after the workload's retries), by gRPC code/reason. */
  readonly unacknowledged_by_code: Record<string, number>;
  readonly violations: number;
  readonly violation_list: readonly string[];
  readonly acked_writes_lost: number;
  readonly double_running: number;
  readonly silent_losses: number;
  readonly lost_with_reason: number;
  readonly fenced_reports: number;
  readonly recovery_p50_s_by_kind: Record<string, number>;
  readonly recovery_p99_s_by_kind: Record<string, number>;
}

function quantile(xs: readonly number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? 0 : Number(s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)]!.toFixed(2));
}

/** The figures of bench/results/chaos.json from schedule results. */
export function figures(results: readonly ScheduleResult[]): ChaosFigures {
  const faults = results.flatMap((r) => r.faults);
  const byKind: Record<string, number[]> = {};
  for (const f of faults) (byKind[f.kind] ??= []).push(f.recoveryS);
  const ops: Record<string, number> = {};
  for (const r of results) for (const [k, v] of Object.entries(r.ackedOpsByKind)) ops[k] = (ops[k] ?? 0) + v;
  const unacked: Record<string, number> = {};
  for (const r of results) for (const [k, v] of Object.entries(r.unacknowledgedByCode)) unacked[k] = (unacked[k] ?? 0) + v;
  return {
    schedules: results.length,
    seeds: results.map((r) => r.seed),
    faults_by_kind: Object.fromEntries(Object.entries(byKind).map(([k, v]) => [k, v.length])),
    acked_operations: results.reduce((a, r) => a + r.ackedOperations, 0),
    acked_operations_by_kind: ops,
    unacknowledged_by_code: unacked,
    violations: results.reduce((a, r) => a + r.violations.length, 0),
    violation_list: results.flatMap((r) => r.violations.map((v) => `seed ${r.seed}: ${v}`)),
    acked_writes_lost: results.reduce((a, r) => a + r.ackedWritesLost, 0),
    double_running: results.reduce((a, r) => a + r.doubleRunning, 0),
    silent_losses: results.reduce((a, r) => a + r.silentLosses, 0),
    lost_with_reason: results.reduce((a, r) => a + r.lost - r.silentLosses, 0),
    fenced_reports: results.reduce((a, r) => a + r.fencedReports, 0),
    recovery_p50_s_by_kind: Object.fromEntries(Object.entries(byKind).map(([k, v]) => [k, quantile(v, 0.5)])),
    recovery_p99_s_by_kind: Object.fromEntries(Object.entries(byKind).map(([k, v]) => [k, quantile(v, 0.99)])),
  };
}
