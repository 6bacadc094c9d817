// The survival scenario (issue 14 items 5, 6), shared by bench/survival/run.ts and
// test/integration/control-plane/survival.test.ts: real nats-server, three real dockerd hosts, the
// real host agent as a child process per host (so it can be SIGKILLed), one leading ControlPlane.
// A seeded workload of conversations (one Claude Code member each) runs random turns with idle gaps
// around idleStopAfter; each turn writes the conversation's native session file the way the CLI does
// (one history line per turn, test/support/native-session.ts) and ends with an exit the runner saw
// (`claude -p` per turn). Then the host holding the most groups dies:
//   kill: without warning — its agent and dockerd SIGKILLed, its data root deleted, at a random moment;
//   spot: a spot notice (the agent's notice file) with a deadline, the host dies at the deadline.
// Afterwards every group of that host must be either restored with its session (the next turn is
// RESTORED with the same locator and its session file holds every completed turn) or LOST with its
// reason; the result says which, and whether it was protected (stopped cleanly with a checkpoint of
// its state) at the moment of death.
// `realClaude: N`: N of the conversations, placed on the host holding the most groups (the one that
// dies), run every turn with the real pinned Claude Code CLI through the fleet (RunTurn: `claude -p`
// per turn in the member container, test/support/claude-code.ts) against the loopback fake Messages
// API (test/support/fake-model-api.ts: the named seam of the request-history tests; it records what
// the model receives). Every host then runs the sandbox image with the CLI and host networking for
// its members. A restored one must resume its session with the real CLI: the turn after the restore
// is RESTORED with the same locator and the model receives every completed turn's messages, in
// order, before the new prompt. With deathRightAfterTurn the host dies right after one of THEIR
// answers, while another one's turn is held at the fake model API (in flight at the death: LOST;
// its turns after its first are held from the start).
import { randomUUID } from 'node:crypto';
import { rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type Docker from 'dockerode';
import { Unavailable } from '../../src/core/errors.ts';
import type { RunTurnEndView } from '../../src/core/exec-port.ts';
import type { BeginTurnView } from '../../src/core/runner-port.ts';
import { ControlPlaneConfigSchema } from '../../src/config/control-plane.ts';
import { CONTROL_PLANE_BUCKETS } from '../../src/control-plane/buckets.ts';
import { ControlPlane } from '../../src/control-plane/control-plane.ts';
import { CheckpointRecordSchema, GroupRecordSchema, type GroupRecord } from '../../src/control-plane/records.ts';
import { Keys } from '../../src/control-plane/state.ts';
import type { IdleStopAfter } from '../../src/core/idle-stop.ts';
import { API_SHA } from '../../src/gen/api-sha.ts';
import { silentLogger } from '../../src/observability/logger.ts';
import { FleetMetrics } from '../../src/observability/metrics.ts';
import { ChunkStore } from '../../src/store/chunk-store.ts';
import { StateStore } from '../../src/store/connection.ts';
import { TEST_AGENT_SHA, spawnAgent, startAgent, type ChildAgent, type InProcessAgent } from '../../test/support/agent.ts';
import { CLAUDE_CODE_VERSION, CLAUDE_PATH, claudeCodeEnv, claudeCodeImageFiles } from '../../test/support/claude-code.ts';
import { destroyAll, startDockerHosts, type DockerHost } from '../../test/support/docker.ts';
import { ackMarker, history, startFakeModelApi, textOf, type FakeModelApi } from '../../test/support/fake-model-api.ts';
import { startTestNats, type TestNats } from '../../test/support/nats.ts';
import { nativeSessionPath, writeNativeSession } from '../../test/support/native-session.ts';
import { provisionSandboxImage } from '../../test/support/sandbox-image.ts';

const CLI = 'claude_code';
/** A `claude -p` turn: the native turn ended, the process exited and the runner saw it exit. */
const EXITED = { kind: 'result' as const, nativeTurnEnded: true, succeeded: true, cleanupFinished: true, transportUsable: true, locatorUsable: true, processExited: true, exitConfirmed: true };

export interface SurvivalOptions {
  readonly conversations: number;
  /** The fleet's idle auto-stop (every conversation uses it). */
  readonly idleStopAfterMs: IdleStopAfter;
  /** How long the workload runs before the host dies (the moment is drawn in its second half). */
  readonly workloadMs: number;
  /** Idle gaps between a conversation's turns: uniform in [0, 2 × this] (around idleStopAfter). */
  readonly meanGapMs: number;
  /** A turn's own duration (the CLI working): uniform in [min, max]. */
  readonly turnMs: readonly [number, number];
  readonly seed: number;
  readonly mode: 'kill' | 'spot';
  /** Spot mode: the notice's length; the host dies at its end. */
  readonly spotNoticeMs?: number;
  /** Incompressible bytes written into each turn's layer (a CLI writing files), 0 for none. */
  readonly bytesPerTurn?: number;
  /**
   * idle 0: every completion (CompleteTurn, RunTurn) asks protect_in_background: it answers first
   * and its group is stopped and checkpointed after (the runner's turn does not wait for that).
   */
  readonly protectInBackground?: boolean;
  /**
   * Kill mode: from the chosen moment on, the host dies the instant a CompleteTurn of one of its
   * groups has answered (in that answer's continuation, before anything else runs): with
   * idleStopAfter 0 that conversation must be restored (its answer means protected).
   */
  readonly deathRightAfterTurn?: boolean;
  /**
   * Conversations whose turns run the real pinned Claude Code CLI through the fleet (RunTurn) against
   * the loopback fake Messages API; placed on the host holding the most groups. Default 0.
   */
  readonly realClaude?: number;
  readonly log?: (line: string) => void;
}

export interface GroupOutcome {
  readonly groupId: string;
  readonly conversationId: string;
  /** The runner's view at the death: a turn begun and not completed. */
  readonly midTurn: boolean;
  /** At the death: STOPPED clean with a checkpoint of its state (or MIGRATING). */
  readonly protectedAtDeath: boolean;
  readonly stateAtDeath: string;
  /** Completed turns the runner saw before the death. */
  readonly completedTurns: number;
  readonly result: 'restored' | 'lost' | 'unsettled';
  readonly lostReason?: string | undefined;
  /** Restored: the next turn's context state and whether it resumed the same locator. */
  readonly nextTurnContext?: string | undefined;
  readonly sameLocator?: boolean | undefined;
  /** Restored: history lines in the restored session file (one per completed turn). */
  readonly restoredHistoryLines?: number | undefined;
  readonly restoredOlderThanLastTurn?: boolean | undefined;
  /** Its turns ran the real Claude Code CLI (RunTurn, fake Messages API). */
  readonly realClaude?: boolean | undefined;
  /** Real Claude: its turn was held at the fake model API when the host died (in flight). */
  readonly heldAtDeath?: boolean | undefined;
  /** Real Claude, restored: what the model received on the turn after the restore (role:markers). */
  readonly modelHistory?: readonly string[] | undefined;
  /** Real Claude, restored: that request carried every completed turn, in order, then the new prompt. */
  readonly historyCarried?: boolean | undefined;
}

export interface SurvivalResult {
  readonly mode: 'kill' | 'spot';
  readonly idleStopAfterMs: IdleStopAfter;
  readonly conversations: number;
  readonly victim: string;
  readonly groupsOnVictim: number;
  readonly turnsCompleted: number;
  readonly deathAfterMs: number;
  readonly outcomes: readonly GroupOutcome[];
  /** Restored / groups of the victim with no turn in flight at the death. */
  readonly survivedFractionNotMidTurn: number;
  readonly restoredOlderThanLastTurn: number;
  /** Groups not mid-turn and not protected at the death (their save was still running, or idle time not reached). */
  readonly unprotectedNotMidTurn: number;
  /** Of those, the ones whose last completion said it could not protect them (a turn_end_unprotected event). */
  readonly reportedUnprotected: number;
  /** What those completions said (event reason and error), by group. */
  readonly unprotectedReports: Record<string, string>;
  /** deathRightAfterTurn: the group whose CompleteTurn answered right before the death. */
  readonly killedRightAfterTurnOf?: string | undefined;
  /** CompleteTurn latency (the answer, with idleStopAfter 0 after the stop and checkpoint), ms. */
  readonly completeMs: readonly number[];
  /** Per completed turn: BeginTurn + CompleteTurn latency (what the fleet adds to a turn), ms. */
  readonly turnCallsMs: readonly number[];
  /** Invariant breaches (empty when every group ended as it must). */
  readonly violations: readonly string[];
  /** Spot mode: what the host said at the notice's deadline. */
  readonly spotSummary?: Record<string, unknown> | undefined;
  /** BeginTurn latency: on a stopped group (start + attach) and on a running one, ms. */
  readonly beginStoppedMs: readonly number[];
  readonly beginRunningMs: readonly number[];
  /** Real Claude: the conversations' groups, and their turns completed before the death. */
  readonly realClaudeGroups: readonly string[];
  readonly realClaudeTurnsCompleted: number;
  /** Real Claude: each completed RunTurn, begin to end (restart, the CLI's turn, stop and checkpoint with idle 0), ms. */
  readonly realClaudeTurnMs: readonly number[];
  /** Real Claude: turns that failed while their host was alive (begins refused are retried). */
  readonly realClaudeTurnFailures: readonly string[];
}

/** mulberry32: a small seeded PRNG (the workload must be replayable from its seed). */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function waitFor<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs: number, everyMs = 200): Promise<T> {
  const end = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < end) {
    try {
      const v = await probe();
      if (v !== undefined) return v;
    } catch (err) {
      last = err;
    }
    await sleep(everyMs);
  }
  throw new Error(`timed out waiting for ${what}${last ? `: ${String(last)}` : ''}`);
}

/** Lines of a file inside a running container (the native session's history), or -1. */
async function historyLines(docker: Docker, containerId: string, path: string): Promise<number> {
  const exec = await docker.getContainer(containerId).exec({ Cmd: ['/bin/sh', '-c', 'wc -l < "$1" 2>/dev/null || echo -1', 'sh', path], AttachStdout: true, AttachStderr: true });
  const stream = await exec.start({});
  const chunks: Buffer[] = [];
  await new Promise<void>((resolve, reject) => {
    stream.on('data', (c: Buffer) => chunks.push(c));
    stream.on('end', () => resolve());
    stream.on('error', reject);
  });
  // Docker's multiplexed frames: 8-byte headers before each payload.
  const raw = Buffer.concat(chunks);
  let out = '';
  for (let i = 0; i + 8 <= raw.length;) {
    const len = raw.readUInt32BE(i + 4);
    out += raw.subarray(i + 8, i + 8 + len).toString('utf8');
    i += 8 + len;
  }
  const n = Number.parseInt(out.trim(), 10);
  return Number.isFinite(n) ? n : -1;
}

async function writeBytes(docker: Docker, containerId: string, bytes: number, turn: number): Promise<void> {
  if (bytes <= 0) return;
  const exec = await docker.getContainer(containerId).exec({ Cmd: ['/bin/sh', '-c', `mkdir -p /root/work && head -c ${bytes} /dev/urandom > /root/work/turn-${turn}.bin`], AttachStdout: true, AttachStderr: true });
  const stream = await exec.start({});
  await new Promise<void>((resolve, reject) => {
    stream.on('end', () => resolve());
    stream.on('error', reject);
    stream.resume();
  });
}

interface Conversation {
  readonly conversationId: string;
  readonly groupId: string;
  locator: string | undefined;
  completed: number;
  /** The last turn whose CompleteTurn answered. */
  lastTurnId: string | undefined;
  inTurn: boolean;
  /** Turns stop being started once set (the death, or the notice). */
  frozen: boolean;
  /**
   * Real Claude: its turns' marker words (MARK-C<index>T<attempt>): the completed ones, and the ones
   * that began but did not complete for the runner (failed, or in flight at the death), which its
   * session may or may not hold.
   */
  real: boolean;
  readonly index: number;
  readonly markers: string[];
  readonly uncertain: string[];
  attempts: number;
  /** Real Claude: the caller's side of its RunTurn in flight (aborted at the death: it went away). */
  abort: AbortController | undefined;
  /** Its workload loop has ended (the death, or a turn that failed). */
  done: boolean;
}

/** A whole turn through the fleet's RunTurn (the backend the gRPC API serves): its begin, its end, or what it failed with. */
async function runTurnOf(cp: ControlPlane, key: string, c: Conversation, marker: string, signal: AbortSignal, protectInBackground = false): Promise<{ begun: BeginTurnView | undefined; end: RunTurnEndView | undefined; error: unknown }> {
  let begun: BeginTurnView | undefined;
  let end: RunTurnEndView | undefined;
  try {
    for await (const e of cp.exec.runTurn({ idempotencyKey: key, groupId: c.groupId, memberId: 'm1', prompt: `Please remember ${marker}.`, model: '', timeoutMs: 120_000, ...(protectInBackground ? { protectInBackground } : {}) }, signal)) {
      if (e.kind === 'begun') begun = e.begun;
      else if (e.kind === 'end') end = e.end;
    }
    return { begun, end, error: undefined };
  } catch (error) {
    return { begun, end, error };
  }
}

const sameList = (a: readonly string[], b: readonly string[]): boolean => a.length === b.length && a.every((x, i) => x === b[i]);
/** The marker words of a history() entry (`user:MARK-A,MARK-B` → both). */
const markersOf = (entry: string): string[] => entry.slice(entry.indexOf(':') + 1).split(',').filter((m) => m !== '');

export async function runSurvival(o: SurvivalOptions): Promise<SurvivalResult> {
  const log = o.log ?? (() => undefined);
  const rnd = prng(o.seed);
  let nats: TestNats | undefined;
  let hosts: DockerHost[] = [];
  const agents = new Map<string, ChildAgent>();
  let plane: ControlPlane | undefined;
  let api: FakeModelApi | undefined;
  const releases: (() => void)[] = [];
  const hostIds = ['host-a', 'host-b', 'host-c'];
  const realClaude = o.realClaude ?? 0;
  try {
    [nats, hosts] = await Promise.all([startTestNats(), startDockerHosts(3)]);
    // Real Claude: the image carries the pinned CLI (as in the cli-history tests) on every host.
    const image = await provisionSandboxImage(hosts.map((h) => h.docker), realClaude > 0
      ? { bridgeVersion: 4, extraFiles: claudeCodeImageFiles(), tagSuffix: `claude-code-${CLAUDE_CODE_VERSION}` }
      : { bridgeVersion: 4 });
    if (realClaude > 0) api = await startFakeModelApi(ackMarker);
    const nc = await nats.connect('control-plane');
    const store = await StateStore.open(nc, { buckets: CONTROL_PLANE_BUCKETS });
    const chunks = await ChunkStore.open(nc);
    const config = ControlPlaneConfigSchema.parse({
      heartbeatIntervalMs: 500, heartbeatTtlMs: 3_000, deadGraceMs: 2_000, stallThresholdMs: 5_000, reconcileIntervalMs: 250,
      stopGraceMs: 5_000, turnWaitMs: 3_000, evacuationDeadlineMs: 120_000, agentCommandTimeoutMs: 60_000, leaderRenewMs: 1_000,
      // The real CLI's start (a 200 MB binary) can hold a loaded 2-core machine for seconds: a host
      // whose heartbeats it delays past the TTL turns SUSPECT, and a turn running there then ends
      // unconfirmed (its member's context LOST). Longer silences before SUSPECT and DEAD with it.
      ...(realClaude > 0 ? { heartbeatTtlMs: 6_000, deadGraceMs: 3_000 } : {}),
      idleStopAfterMs: o.idleStopAfterMs, idleStopStartGraceMs: 2_000, idleStopsPerSecond: 50, idleStopParallelism: 8,
      spotNoticeMs: o.spotNoticeMs ?? 30_000, migrationParallelism: 8,
      allowedAgentShas: [TEST_AGENT_SHA], allowedImageDigests: [image.imageId],
      // RunTurn runs `claude -p` per turn (resuming the saved session), pointed at the fake only.
      ...(api !== undefined ? { cliProfiles: { claude_code: { binary: CLAUDE_PATH, env: claudeCodeEnv(api.url), keepProcess: false } } } : {}),
    });
    plane = new ControlPlane({ config, nc, store, chunks, metrics: new FleetMetrics(), logger: silentLogger(), apiSha: API_SHA, replicaId: 'survival-cp' });
    await plane.start();
    const cp = plane;
    const groupsRepo = store.shardedRepository('groups', GroupRecordSchema);
    const checkpoints = store.repository('checkpoints', CheckpointRecordSchema);
    const group = async (id: string): Promise<GroupRecord> => (await groupsRepo.get(Keys.group(id)))!.value;
    const dockerOf = new Map(hostIds.map((h, i) => [h, hosts[i]!.docker]));
    const noticeFiles = new Map(hostIds.map((h, i) => [h, join(hosts[i]!.dir, 'reclaim-notice.json')]));
    await Promise.all(hostIds.map(async (hostId, i) => {
      agents.set(hostId, spawnAgent({ hostId, natsUrl: nats!.server.url, host: hosts[i]!, imageRef: image.reference, overrides: { reclaimNoticeFile: noticeFiles.get(hostId)!, memberNetworkMode: realClaude > 0 ? 'host' : 'none' } }));
      await waitFor(`${hostId} READY`, async () => ((await cp.repos.hosts.get(Keys.host(hostId)))?.value.lifecycle.state === 'READY' ? true : undefined), 120_000);
    }));
    log(`fleet up: 3 hosts, idleStopAfter ${String(o.idleStopAfterMs)}`);

    let k = 0;
    const key = () => `sv-${o.seed}-${++k}`;
    const convs: Conversation[] = [];
    for (let i = 0; i < o.conversations; i++) {
      const conversationId = `sv-${o.seed}-${i}`;
      const { group: g } = await cp.runner.openGroup({ idempotencyKey: key(), conversationId, members: [{ memberId: 'm1', cli: CLI }] });
      convs.push({ conversationId, groupId: g.groupId, locator: undefined, completed: 0, lastTurnId: undefined, inTurn: false, frozen: false, real: false, index: i, markers: [], uncertain: [], attempts: 0, abort: undefined, done: false });
    }
    log(`${convs.length} conversations opened`);
    // The host that dies: the one holding the most groups (ties: the first in hostIds order).
    const busiest = (): string => [...hostIds.map((h) => [h, cp.fleet.groupKeysOnHost(h).size] as const)].sort((a, b) => b[1] - a[1])[0]![0];
    const groupIdsOn = (hostId: string): Set<string> => new Set([...cp.fleet.groupKeysOnHost(hostId)].map((key) => cp.fleet.group(key)?.value.groupId).filter((x): x is string => x !== undefined));
    if (realClaude > 0) {
      // The real-Claude conversations go where the death will be (groups stay on their hosts until it).
      await waitFor('the read model holding every group', async () => (hostIds.reduce((n, h) => n + cp.fleet.groupKeysOnHost(h).size, 0) >= convs.length ? true : undefined), 30_000, 100);
      const likely = groupIdsOn(busiest());
      const chosen = [...convs.filter((c) => likely.has(c.groupId)), ...convs.filter((c) => !likely.has(c.groupId))].slice(0, realClaude);
      for (const c of chosen) c.real = true;
      log(`real Claude Code ${CLAUDE_CODE_VERSION} in ${chosen.length} conversations: ${chosen.map((c) => c.conversationId).join(', ')}`);
    }
    const realGroups = convs.filter((c) => c.real).map((c) => c.groupId);
    // deathRightAfterTurn: the first real-Claude conversation's turns after its first one are held at
    // the fake model API (a turn still running at the death, as long as the model takes): LOST. Held
    // from then on, so the death need not wait for one of its turns to start.
    const toHold = o.mode === 'kill' && o.deathRightAfterTurn === true && realGroups.length >= 2 ? convs.find((c) => c.real) : undefined;
    /** Requests the fake had received when the hold began (-1: not yet). */
    let holdFrom = -1;
    const hold = (c: Conversation, fake: FakeModelApi): void => {
      holdFrom = fake.requests.length;
      releases.push(fake.holdRequestsWith(`MARK-C${c.index}T`));
    };
    /** Real-Claude turns that failed while their host was alive (a begin refused is retried). */
    const realFailures: string[] = [];

    const beginStoppedMs: number[] = [];
    const beginRunningMs: number[] = [];
    const completeMs: number[] = [];
    const turnCallsMs: number[] = [];
    let turnsCompleted = 0;
    let realTurnsCompleted = 0;
    const realTurnMs: number[] = [];
    /** deathRightAfterTurn: called (synchronously) with each group whose CompleteTurn just answered. */
    let onAnswered: ((groupId: string) => void) | undefined;
    /** A real-Claude turn: RunTurn runs `claude -p` in the member, which talks to the fake model API. */
    const claudeTurn = async (c: Conversation): Promise<'ok' | 'retry' | 'failed'> => {
      const marker = `MARK-C${c.index}T${++c.attempts}`;
      const wasInTurn = c.inTurn;
      c.inTurn = true;
      c.uncertain.push(marker);
      c.abort = new AbortController();
      const t0 = performance.now();
      const { begun, end, error } = await runTurnOf(cp, key(), c, marker, c.abort.signal, o.protectInBackground === true);
      if (c.frozen) return 'failed'; // answered after the death (or the caller left at it)
      if (begun === undefined || end === undefined || !end.evidence.succeeded || end.observedLocator === undefined) {
        realFailures.push(`${c.conversationId} ${marker} ${begun === undefined ? 'not begun' : 'did not end well'}: ${error !== undefined ? String(error) : JSON.stringify(end?.evidence ?? 'no end')}`);
        // A turn that began and did not complete stays in flight for the runner (it never saw its
        // end) until a later one completes; a refused begin changed nothing.
        if (begun === undefined) c.inTurn = wasInTurn;
        // Unavailable (e.g. a host SUSPECT for a moment): the runner tries again after a gap, as it
        // would; any other refusal (the member's context LOST) ends the conversation.
        return error instanceof Unavailable || (begun !== undefined && error === undefined) ? 'retry' : 'failed';
      }
      realTurnMs.push(performance.now() - t0);
      c.locator = end.observedLocator;
      c.markers.push(marker);
      c.uncertain.pop();
      c.completed += 1;
      c.lastTurnId = begun.turnId;
      turnsCompleted += 1;
      realTurnsCompleted += 1;
      c.inTurn = false;
      if (c === toHold && holdFrom < 0 && api !== undefined) hold(c, api);
      onAnswered?.(c.groupId);
      return 'ok';
    };
    const turn = async (c: Conversation): Promise<'ok' | 'retry' | 'failed'> => {
      if (c.real) return claudeTurn(c);
      const before = cp.fleet.group(Keys.group(c.groupId))?.value.lifecycle.state;
      c.inTurn = true;
      try {
        const t0 = performance.now();
        const begun = await cp.runner.beginTurn({ idempotencyKey: key(), groupId: c.groupId, memberId: 'm1' });
        const ms = performance.now() - t0;
        if (before === 'STOPPED') beginStoppedMs.push(ms);
        else if (before === 'RUNNING') beginRunningMs.push(ms);
        c.locator ??= randomUUID();
        const docker = dockerOf.get(begun.hostId)!;
        await writeNativeSession(docker, begun.containerId, CLI, c.locator);
        await writeBytes(docker, begun.containerId, o.bytesPerTurn ?? 0, c.completed + 1);
        await sleep(o.turnMs[0] + rnd() * (o.turnMs[1] - o.turnMs[0]));
        const t1 = performance.now();
        await cp.runner.completeTurn({ idempotencyKey: key(), groupId: c.groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: c.locator, evidence: EXITED, ...(o.protectInBackground === true ? { protectInBackground: true } : {}) });
        if (c.frozen) return 'failed'; // answered after the death: its host was gone meanwhile
        completeMs.push(performance.now() - t1);
        turnCallsMs.push(ms + performance.now() - t1);
        c.completed += 1;
        c.lastTurnId = begun.turnId;
        turnsCompleted += 1;
        c.inTurn = false;
        onAnswered?.(c.groupId);
        return 'ok';
      } catch {
        // A turn cut off by the death stays "in flight" for the runner: it never completed.
        return 'failed';
      }
    };

    // The workload: every conversation alternates idle gaps and turns until it is frozen.
    const started = Date.now();
    const deathAt = started + o.workloadMs * (0.5 + 0.5 * rnd());
    const loops = convs.map(async (c, i) => {
      // Half the conversations start right away (their first begin finds the group running: the
      // baseline of the begin latency), the others after a first gap. The real-Claude ones start 2 s
      // apart: several CLIs starting at once on one host of this 2-core machine starve its agent.
      if (c.real) await sleep(2_000 * realGroups.indexOf(c.groupId));
      else if (i % 2 === 1) await sleep(rnd() * o.meanGapMs);
      try {
        while (!c.frozen && Date.now() < deathAt + 180_000) { // the death comes (at the latest after its waits)
          if ((await turn(c)) === 'failed') return;
          await sleep(rnd() * 2 * o.meanGapMs);
        }
      } finally {
        c.done = true;
      }
    });

    // The victim: the host holding the most groups when the moment comes.
    const victimAt = o.mode === 'spot' ? deathAt - (o.spotNoticeMs ?? 30_000) : deathAt;
    await sleep(Math.max(0, victimAt - Date.now()));
    const victim = busiest();
    const vi = hostIds.indexOf(victim);
    const onVictim = groupIdsOn(victim);
    let spotSummary: Record<string, unknown> | undefined;
    if (o.mode === 'spot') {
      const noticeMs = o.spotNoticeMs ?? 30_000;
      log(`spot notice to ${victim} (${onVictim.size} groups), ${noticeMs} ms`);
      // The runner keeps working elsewhere; the victim's conversations start no new turn (they would be told to retry).
      for (const c of convs) if (onVictim.has(c.groupId)) c.frozen = true;
      await writeFile(noticeFiles.get(victim)!, JSON.stringify({ source: 'spot', deadlineUnixMs: Date.now() + noticeMs }));
      await sleep(noticeMs);
      spotSummary = cp.spot.summaryOf(victim) as Record<string, unknown> | undefined;
    }

    // The death: agent and dockerd SIGKILLed, data root deleted; no more turns anywhere. Synchronous
    // up to the freeze, so it can run inside a CompleteTurn answer's continuation.
    let deathAfterMs = 0;
    let midTurn = new Set<string>();
    const die = (): void => {
      deathAfterMs = Date.now() - started;
      agents.get(victim)!.kill('SIGKILL');
      try {
        process.kill(hosts[vi]!.pid, 'SIGKILL');
      } catch {
        // already gone
      }
      for (const c of convs) c.frozen = true;
      midTurn = new Set(convs.filter((c) => c.inTurn && onVictim.has(c.groupId)).map((c) => c.groupId));
      // The runner stops waiting for its RunTurn calls (a caller going away is no turn end).
      for (const c of convs) c.abort?.abort();
    };
    let killedRightAfterTurnOf: string | undefined;
    let heldGroup: string | undefined;
    if (o.mode === 'kill' && o.deathRightAfterTurn === true) {
      const realOnVictim = () => convs.filter((c) => c.real && !c.done && onVictim.has(c.groupId));
      const held = toHold !== undefined && !toHold.done && onVictim.has(toHold.groupId) ? toHold : undefined;
      if (held !== undefined && api !== undefined) {
        // One real-Claude conversation is in flight at the death: its turn waits at the model API
        // (held since its first turn's end, or from now if that never came).
        const prefix = `MARK-C${held.index}T`;
        const fake = api;
        if (holdFrom < 0) hold(held, fake);
        const from = holdFrom;
        const lastUser = (r: FakeModelApi['requests'][number]) => textOf([...(r.body.messages ?? [])].reverse().find((m) => m.role === 'user')?.content);
        const got = await waitFor(`${held.conversationId}'s turn held at the model API`, async () => (held.done ? 'gone' : fake.requests.slice(from).some((r) => lastUser(r).includes(prefix)) ? 'held' : undefined), 60_000, 100)
          .catch((err: unknown) => String(err));
        if (got === 'held') heldGroup = held.groupId;
        log(got === 'held' ? `${held.conversationId}'s real Claude Code turn is held at the model API` : `no turn of ${held.conversationId} held: ${got}`);
      }
      // With real-Claude conversations on the victim, the death follows one of THEIR answers.
      const triggers = new Set(realOnVictim().filter((c) => c.groupId !== heldGroup).map((c) => c.groupId));
      const waitMs = triggers.size > 0 ? 60_000 : 30_000;
      await new Promise<void>((resolve) => {
        const fallback = setTimeout(() => {
          onAnswered = undefined;
          log(`no CompleteTurn of the victim${triggers.size > 0 ? '\'s real-Claude conversations' : ''} answered within ${waitMs / 1000} s: killed anyway`);
          die();
          resolve();
        }, waitMs);
        onAnswered = (groupId) => {
          if (!onVictim.has(groupId) || (triggers.size > 0 && !triggers.has(groupId))) return;
          onAnswered = undefined;
          clearTimeout(fallback);
          killedRightAfterTurnOf = groupId;
          die();
          resolve();
        };
      });
    } else {
      die();
    }
    // stop() reaps what the killed dockerd left (containerd, shims, container processes); destroy()
    // unmounts its layers and deletes the data root with the rest of the host's directory.
    await hosts[vi]!.stop();
    await hosts[vi]!.destroy();
    await rm(hosts[vi]!.dataRoot, { recursive: true, force: true });
    // The held model request's CLI is gone with the host: answer it into the void.
    for (const release of releases.splice(0)) release();
    // The state at the death: what the store says for each of the victim's groups (nothing on them
    // can complete any more: their agent is gone).
    const atDeath = new Map<string, { state: string; protected: boolean }>();
    for (const id of onVictim) {
      const g = await group(id);
      const cpRec = g.latestCheckpointId === undefined ? undefined : (await checkpoints.get(Keys.checkpoint(id, g.latestCheckpointId)))?.value;
      const prot = g.lifecycle.state === 'MIGRATING' || (g.lifecycle.state === 'STOPPED' && g.lifecycle.stop?.clean === true && cpRec?.activityVersion === g.lifecycle.activityVersion);
      atDeath.set(id, { state: g.lifecycle.state, protected: prot });
    }
    log(`${victim} died after ${deathAfterMs} ms holding ${onVictim.size} groups (${midTurn.size} mid-turn, ${[...atDeath.values()].filter((s) => s.protected).length} protected)${killedRightAfterTurnOf !== undefined ? `, right after ${killedRightAfterTurnOf}'s CompleteTurn answered` : ''}`);
    // The completions that said they could not protect their group (the event of that turn's end).
    const reported = new Map<string, string>();
    for (const c of convs) {
      if (!onVictim.has(c.groupId) || c.lastTurnId === undefined) continue;
      const events = (await store.events.read({ subjectKind: 'group', subjectId: c.groupId, limit: 1_000 })).events.map((e) => e.event);
      const said = events.find((e) => e.type === 'turn_end_unprotected' && (e.detail as { turnId?: string } | undefined)?.turnId === c.lastTurnId);
      if (said !== undefined) reported.set(c.groupId, `${said.reason ?? ''}: ${String((said.detail as { error?: string } | undefined)?.error ?? '')}`);
    }
    await Promise.race([Promise.all(loops), sleep(30_000)]);

    // Every group of the victim settles: restored elsewhere, or LOST.
    const settled = new Map<string, GroupRecord>();
    await waitFor('every group of the dead host settled', async () => {
      for (const id of onVictim) {
        if (settled.has(id)) continue;
        const g = await group(id);
        if (g.lifecycle.state === 'LOST' || (g.lifecycle.state === 'STOPPED' && g.lifecycle.hostId !== victim && g.evacuation === undefined)) settled.set(id, g);
      }
      return settled.size === onVictim.size ? true : undefined;
    }, 240_000, 500).catch((err: unknown) => log(String(err)));

    const outcomes: GroupOutcome[] = [];
    const violations: string[] = [];
    for (const c of convs) {
      if (!onVictim.has(c.groupId)) continue;
      const d = atDeath.get(c.groupId)!;
      const g = settled.get(c.groupId);
      const base = {
        groupId: c.groupId, conversationId: c.conversationId, midTurn: midTurn.has(c.groupId), protectedAtDeath: d.protected, stateAtDeath: d.state, completedTurns: c.completed,
        ...(c.real ? { realClaude: true, heldAtDeath: c.groupId === heldGroup } : {}),
      };
      if (g === undefined) {
        outcomes.push({ ...base, result: 'unsettled' });
        violations.push(`${c.groupId}: not settled`);
        continue;
      }
      if (g.lifecycle.state === 'LOST') {
        outcomes.push({ ...base, result: 'lost', lostReason: g.lifecycle.lostReason });
        if (g.lifecycle.lostReason === undefined) violations.push(`${c.groupId}: LOST without a reason`);
        if (d.protected) violations.push(`${c.groupId}: protected at the death but LOST ${g.lifecycle.lostReason}`);
        continue;
      }
      // Restored: the next turn resumes the same session, which holds every completed turn.
      let nextTurnContext: string | undefined;
      let sameLocator: boolean | undefined;
      let lines: number | undefined;
      if (c.real && api !== undefined) {
        // The real CLI resumes it: the model must receive every completed turn, in order, then the
        // new prompt; besides those, only turns that did not complete for the runner may appear.
        const marker = `MARK-C${c.index}AFTER`;
        const from = api.requests.length;
        let modelHistory: string[] | undefined;
        let carried = false;
        let older = false;
        const { begun, end, error } = await runTurnOf(cp, key(), c, marker, new AbortController().signal);
        nextTurnContext = begun?.contextState;
        sameLocator = c.locator === undefined || (begun?.locator === c.locator && end?.observedLocator === c.locator);
        if (error !== undefined || end === undefined || !end.evidence.succeeded) violations.push(`${c.groupId}: restored, but the real Claude Code turn after it did not end well: ${error !== undefined ? String(error) : JSON.stringify(end?.evidence ?? 'no end')}`);
        const sent = api.requests.slice(from).filter((r) => markersOf(history(r).at(-1) ?? '').includes(marker)).at(-1);
        if (sent !== undefined) {
          modelHistory = history(sent);
          const certain = modelHistory.map((e) => `${e.slice(0, e.indexOf(':'))}:${markersOf(e).filter((m) => !c.uncertain.includes(m)).join(',')}`).filter((e) => !e.endsWith(':'));
          const done = c.markers.flatMap((m) => [`user:${m}`, `assistant:${m}`]);
          older = !sameList(certain.slice(0, done.length), done);
          carried = sameList(certain, [...done, `user:${marker}`]);
        }
        outcomes.push({ ...base, result: 'restored', nextTurnContext, sameLocator, restoredOlderThanLastTurn: older, modelHistory, historyCarried: carried });
        if (!carried) violations.push(`${c.groupId}: real Claude Code resumed without its history: the model received [${(modelHistory ?? []).join(' ')}] after the turns ${c.markers.join(' ')}`);
        if (older) violations.push(`${c.groupId}: restored without some of its ${c.completed} completed turns`);
        if (c.completed > 0 && nextTurnContext !== 'RESTORED') violations.push(`${c.groupId}: next turn ${nextTurnContext}, not RESTORED`);
        if (sameLocator === false) violations.push(`${c.groupId}: next turn resumed another locator`);
        continue;
      }
      try {
        const begun = await cp.runner.beginTurn({ idempotencyKey: key(), groupId: c.groupId, memberId: 'm1' });
        nextTurnContext = begun.contextState;
        sameLocator = c.locator === undefined ? begun.locator === undefined : begun.locator === c.locator;
        if (c.locator !== undefined) lines = await historyLines(dockerOf.get(begun.hostId)!, begun.containerId, nativeSessionPath(CLI, c.locator));
        if (c.locator !== undefined) await writeNativeSession(dockerOf.get(begun.hostId)!, begun.containerId, CLI, c.locator);
        const locator = c.locator ?? randomUUID();
        if (c.locator === undefined) await writeNativeSession(dockerOf.get(begun.hostId)!, begun.containerId, CLI, locator);
        await cp.runner.completeTurn({ idempotencyKey: key(), groupId: c.groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: locator, evidence: EXITED });
      } catch (err) {
        violations.push(`${c.groupId}: restored, but its next turn failed: ${String(err)}`);
      }
      const older = lines !== undefined && lines < c.completed;
      outcomes.push({ ...base, result: 'restored', nextTurnContext, sameLocator, restoredHistoryLines: lines, restoredOlderThanLastTurn: older });
      if (older) violations.push(`${c.groupId}: restored with ${lines} of ${c.completed} completed turns`);
      if (c.completed > 0 && nextTurnContext !== 'RESTORED') violations.push(`${c.groupId}: next turn ${nextTurnContext}, not RESTORED`);
      if (sameLocator === false) violations.push(`${c.groupId}: next turn resumed another locator`);
    }
    const notMid = outcomes.filter((x) => !x.midTurn);
    return {
      mode: o.mode, idleStopAfterMs: o.idleStopAfterMs, conversations: convs.length, victim, groupsOnVictim: onVictim.size, turnsCompleted, deathAfterMs,
      outcomes,
      survivedFractionNotMidTurn: notMid.length === 0 ? 1 : notMid.filter((x) => x.result === 'restored').length / notMid.length,
      restoredOlderThanLastTurn: outcomes.filter((x) => x.restoredOlderThanLastTurn === true).length,
      unprotectedNotMidTurn: notMid.filter((x) => !x.protectedAtDeath).length,
      reportedUnprotected: notMid.filter((x) => !x.protectedAtDeath && reported.has(x.groupId)).length,
      unprotectedReports: Object.fromEntries(reported),
      killedRightAfterTurnOf,
      violations, spotSummary, beginStoppedMs, beginRunningMs, completeMs, turnCallsMs,
      realClaudeGroups: realGroups, realClaudeTurnsCompleted: realTurnsCompleted, realClaudeTurnMs: realTurnMs, realClaudeTurnFailures: realFailures,
    };
  } finally {
    for (const release of releases.splice(0)) release();
    for (const a of agents.values()) a.kill('SIGKILL');
    await Promise.allSettled([...agents.values()].map((a) => a.exited));
    await plane?.stop().catch(() => undefined);
    await nats?.cleanup();
    await destroyAll(hosts);
    await api?.close();
  }
}

export interface SpotCapacityOptions {
  readonly groups: number;
  readonly mibPerGroup: number;
  readonly noticeMs: number;
  /** spotEvacuationParallelism (default: the configured default). */
  readonly parallelism?: number;
  /** false: do not wait for the restores elsewhere (allRestoredMs stays undefined). Default true. */
  readonly waitRestores?: boolean;
  readonly log?: (line: string) => void;
}

export interface SpotCapacityResult {
  readonly groups: number;
  readonly mibPerGroup: number;
  readonly noticeMs: number;
  /** What the host said at the deadline (spot_evacuation_summary). */
  readonly summary: Record<string, unknown> | undefined;
  readonly savedBeforeDeadline: number;
  /** Checkpoints of the groups taken within the notice (from the checkpoint index). */
  readonly checkpointedWithinNotice: number;
  /** Notice → every group saved (clean stop + checkpoint), ms; undefined if not all were. */
  readonly allSavedMs: number | undefined;
  /** Notice → every group restored on another host, ms. */
  readonly allRestoredMs: number | undefined;
  readonly bytesCheckpointed: number;
  /** Groups LOST in the evacuation, by reason. */
  readonly lostReasons: Record<string, number>;
  /** Where the time went, from the groups' events (ms, p50/p90/max over the groups). */
  readonly profile: SpotProfile;
}

export interface SpotProfile {
  /** Notice -> the group's stop requested (waiting for a slot of the evacuation's parallelism). */
  readonly queuedMs: Stats;
  /** Stop requested -> stopped (SIGTERM, exit, the verdict written). */
  readonly stopMs: Stats;
  /** Stopped -> checkpoint created (capture of the layer into the chunk store, manifest, index). */
  readonly checkpointMs: Stats;
  /** Most stops, and most checkpoints, in progress at once. */
  readonly maxConcurrentStops: number;
  readonly maxConcurrentCheckpoints: number;
  /** Checkpoints created per 5 s after the notice (throughput over time). */
  readonly checkpointsPer5s: readonly number[];
}

export interface Stats {
  readonly n: number;
  readonly p50: number;
  readonly p90: number;
  readonly max: number;
}

function stats(xs: readonly number[]): Stats {
  const s = [...xs].sort((a, b) => a - b);
  const at = (p: number) => s[Math.min(s.length - 1, Math.max(0, Math.ceil(p * s.length) - 1))] ?? 0;
  return { n: s.length, p50: at(0.5), p90: at(0.9), max: s.at(-1) ?? 0 };
}

function maxOverlap(spans: readonly (readonly [number, number])[]): number {
  const edges = spans.flatMap(([a, b]) => [[a, 1], [b, -1]] as const).sort((x, y) => x[0] - y[0] || x[1] - y[1]);
  let cur = 0;
  let max = 0;
  for (const [, d] of edges) {
    cur += d;
    max = Math.max(max, cur);
  }
  return max;
}

/**
 * Spot evacuation capacity (item 6): `groups` RUNNING groups (idle auto-stop off), each with a native
 * session file and `mibPerGroup` MiB of incompressible data in its layer, all on host-a; host-b and
 * host-c READY; a spot notice of `noticeMs` on host-a. How many are clean-stopped and checkpointed
 * off the host before the deadline.
 */
export async function runSpotCapacity(o: SpotCapacityOptions): Promise<SpotCapacityResult> {
  const log = o.log ?? (() => undefined);
  let nats: TestNats | undefined;
  let hosts: DockerHost[] = [];
  // In-process agents: nothing here is killed, and the source host needs room for every group.
  const agents = new Map<string, InProcessAgent>();
  let plane: ControlPlane | undefined;
  try {
    [nats, hosts] = await Promise.all([startTestNats(), startDockerHosts(3)]);
    const image = await provisionSandboxImage(hosts.map((h) => h.docker), { bridgeVersion: 4 });
    const nc = await nats.connect('control-plane');
    const store = await StateStore.open(nc, { buckets: CONTROL_PLANE_BUCKETS });
    const chunks = await ChunkStore.open(nc);
    const config = ControlPlaneConfigSchema.parse({
      heartbeatIntervalMs: 500, heartbeatTtlMs: 5_000, deadGraceMs: 3_000, stallThresholdMs: 5_000, reconcileIntervalMs: 250,
      stopGraceMs: 5_000, turnWaitMs: 3_000, evacuationDeadlineMs: 300_000, agentCommandTimeoutMs: 120_000, leaderRenewMs: 1_000,
      idleStopAfterMs: 'never', spotNoticeMs: o.noticeMs, migrationParallelism: 4, ...(o.parallelism !== undefined ? { spotEvacuationParallelism: o.parallelism } : {}),
      allowedAgentShas: [TEST_AGENT_SHA], allowedImageDigests: [image.imageId],
    });
    plane = new ControlPlane({ config, nc, store, chunks, metrics: new FleetMetrics(), logger: silentLogger(), apiSha: API_SHA, replicaId: 'spot-cp' });
    await plane.start();
    const cp = plane;
    const notice = join(hosts[0]!.dir, 'reclaim-notice.json');
    const start = async (hostId: string, i: number) => {
      agents.set(hostId, await startAgent(await nats!.connect(hostId), { hostId, natsUrl: nats!.server.url, host: hosts[i]!, imageRef: image.reference, overrides: { heartbeatIntervalMs: 500, maxMembers: Math.max(64, 2 * o.groups), ...(i === 0 ? { reclaimNoticeFile: notice } : {}) } }));
      await waitFor(`${hostId} READY`, async () => ((await cp.repos.hosts.get(Keys.host(hostId)))?.value.lifecycle.state === 'READY' ? true : undefined), 120_000);
    };
    await start('host-a', 0);
    const ids: string[] = [];
    let k = 0;
    const key = () => `spot-${++k}`;
    for (let i = 0; i < o.groups; i++) {
      const { group: g } = await cp.runner.openGroup({ idempotencyKey: key(), conversationId: `spot-${i}`, members: [{ memberId: 'm1', cli: CLI }] });
      const begun = await cp.runner.beginTurn({ idempotencyKey: key(), groupId: g.groupId, memberId: 'm1' });
      const locator = randomUUID();
      await writeNativeSession(hosts[0]!.docker, begun.containerId, CLI, locator);
      await writeBytes(hosts[0]!.docker, begun.containerId, o.mibPerGroup * 1024 * 1024, 1);
      await cp.runner.completeTurn({ idempotencyKey: key(), groupId: g.groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: locator, evidence: EXITED });
      ids.push(g.groupId);
    }
    await Promise.all([start('host-b', 1), start('host-c', 2)]);
    log(`${ids.length} running groups × ${o.mibPerGroup} MiB on host-a; spot notice of ${o.noticeMs} ms`);
    const noticeAt = Date.now();
    await writeFile(notice, JSON.stringify({ source: 'spot', deadlineUnixMs: noticeAt + o.noticeMs }));
    const groupsRepo = store.shardedRepository('groups', GroupRecordSchema);
    const checkpoints = store.repository('checkpoints', CheckpointRecordSchema);
    let allSavedMs: number | undefined;
    const deadline = noticeAt + o.noticeMs;
    while (Date.now() < deadline + 1_000) {
      const s = cp.spot.summaryOf('host-a');
      if (allSavedMs === undefined && s !== undefined && s.groups === ids.length && s.savedBeforeDeadline + s.savedAfterDeadline === ids.length) allSavedMs = (s.settledAtMs ?? Date.now()) - noticeAt;
      await sleep(200);
    }
    // What the host said (its last summary: the deadline's, or the final one if all settled first).
    const summary = cp.spot.summaryOf('host-a') as Record<string, unknown> | undefined;
    let allRestoredMs: number | undefined;
    const lostReasons: Record<string, number> = {};
    if (o.waitRestores !== false) try {
      const settled = await waitFor('every group restored elsewhere or LOST', async () => {
        const gs = await Promise.all(ids.map(async (id) => (await groupsRepo.get(Keys.group(id)))!.value));
        return gs.every((g) => g.lifecycle.state === 'LOST' || (g.lifecycle.state === 'STOPPED' && g.lifecycle.hostId !== 'host-a')) ? gs : undefined;
      }, 600_000, 500);
      for (const g of settled) if (g.lifecycle.state === 'LOST') lostReasons[g.lifecycle.lostReason ?? 'unknown'] = (lostReasons[g.lifecycle.lostReason ?? 'unknown'] ?? 0) + 1;
      if (Object.keys(lostReasons).length === 0) allRestoredMs = Date.now() - noticeAt;
    } catch (err) {
      log(String(err));
    }
    // Where the time went: each group's stop and checkpoint from its events.
    const queued: number[] = [];
    const stopSpans: [number, number][] = [];
    const cpSpans: [number, number][] = [];
    const per5s: number[] = [];
    for (const id of ids) {
      const ev = (await store.events.read({ subjectKind: 'group', subjectId: id, limit: 1_000 })).events.map((e) => e.event).filter((e) => e.timeMs >= noticeAt);
      const requested = ev.find((e) => e.type === 'group_stop_requested')?.timeMs;
      const stopped = ev.find((e) => e.type === 'group_stopped')?.timeMs;
      const created = ev.find((e) => e.type === 'checkpoint_created')?.timeMs;
      if (requested !== undefined) queued.push(requested - noticeAt);
      if (requested !== undefined && stopped !== undefined) stopSpans.push([requested, stopped]);
      if (stopped !== undefined && created !== undefined) cpSpans.push([stopped, created]);
      if (created !== undefined) {
        const slot = Math.floor((created - noticeAt) / 5_000);
        while (per5s.length <= slot) per5s.push(0);
        per5s[slot]! += 1;
      }
    }
    const profile: SpotProfile = {
      queuedMs: stats(queued), stopMs: stats(stopSpans.map(([a, b]) => b - a)), checkpointMs: stats(cpSpans.map(([a, b]) => b - a)),
      maxConcurrentStops: maxOverlap(stopSpans), maxConcurrentCheckpoints: maxOverlap(cpSpans), checkpointsPer5s: per5s,
    };
    log(`spot profile: ${JSON.stringify(profile)}`);
    let within = 0;
    let bytes = 0;
    for (const id of ids) {
      const g = (await groupsRepo.get(Keys.group(id)))!.value;
      const c = g.latestCheckpointId === undefined ? undefined : (await checkpoints.get(Keys.checkpoint(id, g.latestCheckpointId)))?.value;
      if (c !== undefined && c.createdAtMs >= noticeAt && c.createdAtMs <= deadline) within += 1;
      bytes += c?.totalBytes ?? 0;
    }
    return {
      groups: ids.length, mibPerGroup: o.mibPerGroup, noticeMs: o.noticeMs, summary,
      savedBeforeDeadline: Number(summary?.savedBeforeDeadline ?? 0), checkpointedWithinNotice: within, allSavedMs, allRestoredMs, bytesCheckpointed: bytes, lostReasons, profile,
    };
  } finally {
    await plane?.stop().catch(() => undefined);
    await Promise.allSettled([...agents.values()].map((a) => a.stop()));
    await nats?.cleanup();
    await destroyAll(hosts);
  }
}
