// Model-based test of the whole session/group core: random sequences of begin/complete turns (random
// observed locators, failures, disconnects, timeouts), process exits, container loss, clean and
// unclean stops, checkpoints, planned migrations and unplanned host losses with failing restores.
// Turns are driven either by a runner (its own process; the fleet sees only the container run) or by
// the fleet (RunTurn: a turn process the host agent keeps between turns, which may also die alone).
// A small explicit model predicts every decision independently of src/core, and the safety
// invariants of R-S1..R-S8, R-G2, R-G4, R-G6 and R-R1/R-R2 are checked after every step.
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import {
  assessCheckpoint, beginTurn, completeTurn, createGroup, decideAfterRestoreFailure, decideOnHostLoss, decideStopCleanliness,
  markMemberLost, newMemberSession, onContainerStopped, onProcessExited, onRestored, transitionGroup, unwrap, parseLocator,
  type CheckpointSummary, type GroupEvent, type GroupLifecycle, type Locator, type MemberSession, type ProcessIdentity, type TurnEnd,
} from '../../../src/core/index.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

const MEMBERS = ['m0', 'm1'] as const;
const IMG = `sha256:${'1'.repeat(64)}`;
const IMG_OTHER = `sha256:${'2'.repeat(64)}`;
const MAX_AGE_MS = 60_000;
const MAX_RESTORES = 3;
const TARGET = { imageDigests: new Set([IMG]), bridgeVersion: 4 };

// ---- actions -------------------------------------------------------------------------------
type Action =
  | { t: 'begin'; m: number; locator: 'none' | 'saved' | 'other'; fleet: boolean }
  | { t: 'complete'; m: number; observed: 'expected' | 'other' | 'none' | 'invalid'; end: 'success' | 'failKept' | 'failNoCleanup' | 'failNoTransport' | 'notEnded'; processExits: boolean; exitConfirmed: boolean }
  | { t: 'completeAgain'; m: number }
  | { t: 'processExit'; m: number }
  | { t: 'turnProcessExit'; m: number }
  | { t: 'containerVanish'; m: number }
  | { t: 'stop'; killed: [boolean, boolean] }
  | { t: 'start' }
  | { t: 'checkpoint'; corrupt: boolean; wrongImage: boolean }
  | { t: 'migrate'; restoreOk: boolean }
  | { t: 'drain' }
  | { t: 'hostLoss'; restoreFailures: number; stopFirst: 'no' | 'clean' | 'killed' }
  | { t: 'tick'; dtMs: number };

const member = fc.integer({ min: 0, max: MEMBERS.length - 1 });
const action: fc.Arbitrary<Action> = fc.oneof(
  { arbitrary: fc.record({ t: fc.constant('begin' as const), m: member, locator: fc.constantFrom('none' as const, 'none' as const, 'saved' as const, 'other' as const), fleet: fc.constantFrom(false, true, true) }), weight: 6 },
  {
    arbitrary: fc.record({
      t: fc.constant('complete' as const), m: member,
      observed: fc.constantFrom('expected' as const, 'expected' as const, 'expected' as const, 'expected' as const, 'expected' as const, 'other' as const, 'other' as const, 'none' as const, 'invalid' as const),
      end: fc.constantFrom('success' as const, 'success' as const, 'success' as const, 'success' as const, 'failKept' as const, 'failKept' as const, 'failNoCleanup' as const, 'failNoTransport' as const, 'notEnded' as const),
      processExits: fc.boolean(), exitConfirmed: fc.boolean(),
    }),
    weight: 8,
  },
  { arbitrary: fc.record({ t: fc.constant('completeAgain' as const), m: member }), weight: 1 },
  { arbitrary: fc.record({ t: fc.constant('processExit' as const), m: member }), weight: 1 },
  { arbitrary: fc.record({ t: fc.constant('turnProcessExit' as const), m: member }), weight: 1 },
  { arbitrary: fc.record({ t: fc.constant('containerVanish' as const), m: member }), weight: 1 },
  { arbitrary: fc.record({ t: fc.constant('stop' as const), killed: fc.tuple(fc.nat(3), fc.nat(3)).map(([a, b]) => [a === 0, b === 0] as [boolean, boolean]) }), weight: 3 },
  { arbitrary: fc.constant({ t: 'start' as const }), weight: 3 },
  { arbitrary: fc.record({ t: fc.constant('checkpoint' as const), corrupt: fc.boolean(), wrongImage: fc.constantFrom(false, false, false, true) }), weight: 3 },
  { arbitrary: fc.record({ t: fc.constant('migrate' as const), restoreOk: fc.boolean() }), weight: 2 },
  { arbitrary: fc.constant({ t: 'drain' as const }), weight: 1 },
  { arbitrary: fc.record({ t: fc.constant('hostLoss' as const), restoreFailures: fc.integer({ min: 0, max: 4 }), stopFirst: fc.constantFrom('no' as const, 'clean' as const, 'clean' as const, 'killed' as const) }), weight: 2 },
  { arbitrary: fc.record({ t: fc.constant('tick' as const), dtMs: fc.integer({ min: 1, max: 90_000 }) }), weight: 2 },
);

// ---- the explicit model ----------------------------------------------------------------------
interface ModelMember {
  status: 'fresh' | 'retained' | 'unconfirmed' | 'lost';
  saved?: string;
  completed: number;
  /** The process that may be reused LIVE. */
  live?: ProcessIdentity;
  /** R-S6: the last turn's process, not reused and not confirmed exited: end it before another starts. */
  reclaim?: ProcessIdentity;
  inFlight?: { turnId: string; expected?: string; process: ProcessIdentity };
  lastTurnId?: string;
}
interface ModelCheckpoint { activitySeq: number; createdAtMs: number; corrupt: boolean; wrongImage: boolean; id: string }
interface Model {
  members: ModelMember[];
  groupState: 'PENDING' | 'RUNNING' | 'STOPPED' | 'LOST';
  clean?: boolean;
  activitySeq: number;
  checkpoint?: ModelCheckpoint;
}

/** The physical world the host agent observes. */
interface WorldMember {
  containerId: string;
  present: boolean;
  intact: boolean;
  /** The container run (a runner's own process lives in it and is named by it). */
  running?: ProcessIdentity;
  /** Turn processes the host agent keeps in that run (RunTurn), `<run>/<process id>`. */
  procs: ProcessIdentity[];
  /** Incarnations that ran a turn on the member's native session. */
  turnProcs?: Set<string>;
}

const same = (a?: ProcessIdentity, b?: ProcessIdentity) => a !== undefined && b !== undefined && a.containerId === b.containerId && a.incarnation === b.incarnation;
const isTurnProc = (p: ProcessIdentity) => p.incarnation.includes('/');
const runOf = (p: ProcessIdentity): ProcessIdentity => ({ containerId: p.containerId, incarnation: p.incarnation.split('/')[0]! });
const loc = (s: string): Locator => unwrap(parseLocator(s));
/** Paths the random histories reached, so the property cannot pass vacuously. */
const reached = new Map<string, number>();
const hit = (path: string) => reached.set(path, (reached.get(path) ?? 0) + 1);

function run(actions: Action[]): void {
  let now = 1_000;
  let seq = 0;
  const fresh = () => `${++seq}`;
  // One conversation at a time; when its group is LOST, the next action starts a new conversation so
  // long histories keep exercising live paths instead of idling on a dead group.
  let group!: GroupLifecycle;
  let hostN = 0;
  let sessions!: MemberSession[];
  let world!: WorldMember[];
  let model!: Model;
  let checkpoint: CheckpointSummary | undefined;
  let firstSaved!: (string | undefined)[];
  const g = (e: GroupEvent) => { group = unwrap(transitionGroup(group, e, now)); };
  const newConversation = () => {
    group = createGroup(`h${hostN}`, now);
    sessions = MEMBERS.map((id, i) => newMemberSession(id, i === 0 ? 'claude_code' : 'codex'));
    world = MEMBERS.map(() => ({ containerId: `c-${fresh()}`, present: true, intact: true, procs: [] }));
    model = { members: MEMBERS.map(() => ({ status: 'fresh', completed: 0 })), groupState: 'PENDING', activitySeq: 0 };
    checkpoint = undefined;
    firstSaved = MEMBERS.map(() => undefined);
    g({ type: 'started' });
    model.groupState = 'RUNNING';
    model.activitySeq++;
  };
  newConversation();

  const freshness = () => ({ groupId: 'g', activityVersion: group.activityVersion, lastActivityAtMs: group.lastActivityAtMs, memberIds: [...MEMBERS] });
  const modelCheckpointUsable = () => {
    const c = model.checkpoint;
    return c !== undefined && c.activitySeq === model.activitySeq && now - c.createdAtMs <= MAX_AGE_MS && !c.corrupt && !c.wrongImage;
  };
  const restoreGroup = () => {
    // Restored on a new host: new containers from the checkpoint, no processes.
    hostN++;
    for (let i = 0; i < MEMBERS.length; i++) {
      world[i] = { containerId: `c-${fresh()}`, present: true, intact: true, procs: [] };
      sessions[i] = onRestored(sessions[i]!);
      const mm = model.members[i]!;
      delete mm.live;
      delete mm.reclaim;
      if (mm.inFlight) { delete mm.inFlight; mm.status = 'unconfirmed'; }
    }
  };
  const loseGroup = (reason: string | undefined) => {
    expect(reason, 'every LOST carries a reason').toBeDefined();
    sessions = sessions.map((s) => markMemberLost(s, 'group_lost'));
    model.groupState = 'LOST';
    for (const mm of model.members) { if (mm.status !== 'lost') mm.status = 'lost'; delete mm.inFlight; delete mm.live; delete mm.reclaim; }
  };

  const doStop = (a: { killed: [boolean, boolean] }) => {
    if (group.state !== 'RUNNING') return;
    g({ type: 'stop_requested' });
    const evidence = {
      graceMs: 10_000,
      memberIds: [...MEMBERS],
      members: MEMBERS.map((memberId, i) => ({
        memberId,
        turnInFlight: sessions[i]!.phase === 'IN_TURN',
        sigtermAtMs: now,
        exitedAtMs: a.killed[i] ? undefined : now + 100,
        exitCode: a.killed[i] ? undefined : 0,
        killed: a.killed[i]!,
        containerExists: world[i]!.present,
        writableLayerExists: world[i]!.intact,
      })),
    };
    const verdict = decideStopCleanliness(evidence);
    g({ type: 'stopped', verdict });
    const modelClean = model.members.every((mm, i) => !mm.inFlight && !a.killed[i] && world[i]!.present && world[i]!.intact);
    expect(verdict.clean).toBe(modelClean);
    model.clean = modelClean;
    model.groupState = 'STOPPED';
    model.activitySeq++;
    for (let i = 0; i < MEMBERS.length; i++) {
      sessions[i] = onContainerStopped(sessions[i]!);
      delete world[i]!.running;
      world[i]!.procs = [];
      const mm = model.members[i]!;
      delete mm.live;
      delete mm.reclaim;
      if (mm.inFlight) { delete mm.inFlight; mm.status = 'unconfirmed'; }
    }
    return;
  };

  const doCheckpoint = (a: { corrupt: boolean; wrongImage: boolean }) => {
    // R-G3: taken only right after a clean stop.
    if (group.state !== 'STOPPED' || !group.stop?.clean) return;
    const id = `cp-${fresh()}`;
    checkpoint = {
      checkpointId: id, groupId: 'g', placementGeneration: group.generation, createdAtMs: now, activityVersion: group.activityVersion,
      baseImageDigest: a.wrongImage ? IMG_OTHER : IMG, bridgeVersion: 4,
      members: MEMBERS.map((memberId, i) => ({ memberId, blobPresent: !(a.corrupt && i === 1), digestVerified: !a.corrupt })),
    };
    model.checkpoint = { id, activitySeq: model.activitySeq, createdAtMs: now, corrupt: a.corrupt, wrongImage: a.wrongImage };
    return;
  };

  const doMigrate = (a: { restoreOk: boolean }) => {
    if (group.state !== 'STOPPED') return;
    const assessment = assessCheckpoint(freshness(), checkpoint, TARGET, now, MAX_AGE_MS);
    const r = transitionGroup(group, { type: 'migration_started', targetHostId: `h${hostN + 1}`, assessment }, now);
    // Never migrate an unclean group or from a stale/corrupt/incompatible checkpoint (R-G2, R-G4, R-R2).
    expect(r.ok).toBe(model.clean === true && modelCheckpointUsable());
    if (!r.ok) return;
    hit('migrated');
    group = r.value;
    if (a.restoreOk) {
      g({ type: 'migration_completed', targetHostId: `h${hostN + 1}` });
      restoreGroup();
    } else {
      g({ type: 'migration_aborted' });
    }
    return;
  };

  for (const a of actions) {
    // The runner opens a new conversation once the old one can no longer run a turn.
    if (group.state === 'LOST' || sessions.every((x) => x.phase === 'LOST')) newConversation();
    switch (a.t) {
      case 'tick':
        now += a.dtMs;
        break;

      case 'begin': {
        // A turn for a stopped group resumes it on its own host first (allowed clean or unclean, R-G2).
        if (group.state === 'STOPPED') { g({ type: 'started' }); model.groupState = 'RUNNING'; model.activitySeq++; }
        const i = a.m;
        const mm = model.members[i]!;
        const w = world[i]!;
        const request = a.locator === 'none' ? undefined : a.locator === 'saved' ? (mm.saved === undefined ? undefined : loc(mm.saved)) : loc(`other-${i}`);
        const turnId = `turn-${fresh()}`;
        const before = sessions[i]!;
        // The agent lists its turn processes to a fleet-driven begin only (a runner cannot reach them).
        const r = beginTurn(before, { turnId, locator: request, fleetDriven: a.fleet }, { containerPresent: w.present, layerIntact: w.intact, runningProcess: w.running, turnProcesses: a.fleet ? [...w.procs] : undefined }, now);
        sessions[i] = r.member;

        // Model prediction.
        const retained = mm.status === 'retained';
        // R-S8 before anything else; the in-flight turn's own completion decides what happened to it.
        if (mm.inFlight && mm.status !== 'lost') {
          expect(!r.ok && r.error.reason).toBe('turn_in_flight');
          expect(r.member).toBe(before);
          break;
        }
        if (mm.status === 'lost' || mm.status === 'unconfirmed' || (retained && (!w.present || !w.intact))) {
          expect(r.ok).toBe(false);
          hit('begin:LOST');
          if (!r.ok) { expect(r.contextState).toBe('LOST'); expect(r.member.phase).toBe('LOST'); expect(r.member.lostReason).toBeDefined(); }
          mm.status = 'lost';
          delete mm.live;
          delete mm.reclaim;
          break;
        }
        if (!retained && (!w.present || !w.intact)) {
          expect(!r.ok && r.error.reason).toBe('container_missing');
          break;
        }
        if (request !== undefined && request !== mm.saved) {
          // R-S3: a locator that cannot be confirmed is refused; nothing changes.
          expect(!r.ok && r.error.reason).toBe('locator_mismatch');
          expect(r.member).toBe(before);
          break;
        }
        expect(r.ok).toBe(true);
        if (!r.ok) break;
        // The last turn's process still runs and this driver can reach it: the agent's turn process in
        // the running container run for the fleet, the container run itself for a runner's own process.
        const live = mm.live;
        const reusable = live !== undefined && (isTurnProc(live)
          ? a.fleet && same(runOf(live), w.running) && w.procs.some((q) => same(q, live))
          : !a.fleet && same(w.running, live));
        const mayRun = (p?: ProcessIdentity) => p !== undefined && same(runOf(p), w.running);
        if (mm.status === 'fresh') {
          // NEW only before the first completed turn.
          expect(r.contextState).toBe('NEW');
          expect(mm.completed).toBe(0);
          expect(r.effectiveLocator).toBeUndefined();
          // R-S6 before a first session too: the process of a turn that failed before creating one
          // and may still run is ended first, nothing else (the world's rule, then the model's).
          if (w.running !== undefined && w.turnProcs?.has(w.running.incarnation) === true) expect(r.reclaimProcess).toEqual(w.running);
          for (const p of w.procs) if (w.turnProcs?.has(p.incarnation) === true) expect(r.reclaimProcess).toEqual(w.running);
          expect(r.reclaimProcess).toEqual(mayRun(mm.reclaim) ? w.running : undefined);
          if (r.reclaimProcess !== undefined) hit('begin:reclaim:fresh');
        } else if (reusable) {
          // LIVE only on the very process that ran the last turn and was left reusable.
          expect(r.contextState).toBe('LIVE');
          expect(r.startProcess).toBe(false);
          if (isTurnProc(live)) hit('begin:LIVE:turn_process');
        } else {
          // RESTORED only after a new process on retained state with a saved locator.
          expect(r.contextState).toBe('RESTORED');
          expect(mm.completed).toBeGreaterThan(0);
          expect(w.present && w.intact).toBe(true);
          expect(r.startProcess).toBe(true);
          // R-S6 safety, from the world alone: a process that ran a turn on this session and may still
          // run is ended before another one starts on it (never two processes on one session).
          if (w.running !== undefined && w.turnProcs?.has(w.running.incarnation) === true) expect(r.reclaimProcess).toEqual(w.running);
          // A turn process that ran a turn and still runs: its container run is restarted, or (fleet)
          // the agent's start of the member's new turn process ends it first.
          for (const p of w.procs) if (w.turnProcs?.has(p.incarnation) === true && !a.fleet) expect(r.reclaimProcess).toEqual(w.running);
          // The model: exactly a process that may linger is reclaimed, nothing else (no needless restarts).
          expect(r.reclaimProcess).toEqual(mayRun(mm.reclaim) || mayRun(live) ? w.running : undefined);
          if (r.reclaimProcess !== undefined) hit(live !== undefined && isTurnProc(live) ? 'begin:reclaim:turn_process' : 'begin:reclaim');
        }
        delete mm.reclaim;
        hit(`begin:${r.contextState}`);
        if (r.contextState !== 'NEW') expect(r.effectiveLocator).toBe(mm.saved);
        // The world follows the host agent's instructions: a reclaim restarts the container run.
        if (r.reclaimProcess !== undefined) { w.running = { containerId: w.containerId, incarnation: fresh() }; w.procs = []; }
        let process: ProcessIdentity;
        if (r.contextState === 'LIVE') process = live!;
        else if (a.fleet) {
          // RunTurn starts the member's turn process (the agent ends any older one of the member first).
          if (w.running === undefined) w.running = { containerId: w.containerId, incarnation: fresh() };
          process = { containerId: w.containerId, incarnation: `${w.running.incarnation}/p${fresh()}` };
          w.procs = [process];
        } else {
          if (r.startProcess && r.reclaimProcess === undefined) { w.running = { containerId: w.containerId, incarnation: fresh() }; w.procs = []; }
          process = w.running!;
        }
        if (r.contextState === 'RESTORED') delete mm.live;
        mm.inFlight = { turnId, ...(mm.saved !== undefined ? { expected: mm.saved } : {}), process };
        (w.turnProcs ??= new Set()).add(process.incarnation);
        break;
      }

      case 'complete': {
        // Prefer a member with a turn in flight, so completions mostly complete something.
        const i = model.members[a.m]!.inFlight || !model.members[1 - a.m]!.inFlight ? a.m : 1 - a.m;
        const mm = model.members[i]!;
        const w = world[i]!;
        const s = sessions[i]!;
        if (!mm.inFlight) {
          const r = completeTurn(s, { turnId: `turn-unknown-${fresh()}`, observedLocator: undefined, end: { kind: 'not_ended', cause: 'timeout' } });
          expect(!r.ok && r.error.reason).toBe('turn_not_found');
          break;
        }
        const { turnId, expected, process } = mm.inFlight;
        const observed =
          a.observed === 'expected' ? (expected ?? `sess-${i}-${fresh()}`)
            : a.observed === 'other' ? `stranger-${fresh()}`
              : a.observed === 'invalid' ? 'not a/valid id' : undefined;
        const ended = a.end !== 'notEnded';
        const success = a.end === 'success';
        const cleanup = a.end !== 'failNoCleanup';
        const transport = a.end !== 'failNoTransport';
        const end: TurnEnd = ended
          ? { kind: 'ended', success, cleanupFinished: cleanup, transportUsable: transport, processExits: a.processExits, exitConfirmed: a.processExits && a.exitConfirmed }
          : { kind: 'not_ended', cause: a.processExits ? 'transport_disconnect' : 'timeout' };
        const r = completeTurn(s, { turnId, observedLocator: observed, end, process });
        expect(r.ok).toBe(true);
        if (!r.ok) break;
        sessions[i] = r.member;
        if (group.state === 'RUNNING') { g({ type: 'turn_completed' }); model.activitySeq++; }
        if (ended && a.processExits && a.exitConfirmed) {
          if (isTurnProc(process)) w.procs = w.procs.filter((q) => !same(q, process));
          else if (same(w.running, process)) { delete w.running; w.procs = []; }
        }
        delete mm.inFlight;
        delete mm.reclaim;
        mm.lastTurnId = turnId;
        const reclaimUnlessExited = () => {
          if (!(a.processExits && a.exitConfirmed)) mm.reclaim = process;
        };

        // Model prediction.
        const keepLive = () => {
          if (transport && !a.processExits) mm.live = process;
          else {
            delete mm.live;
            reclaimUnlessExited();
          }
        };
        if (!ended) {
          expect(r.outcome).toBe('unconfirmed');
          mm.status = 'unconfirmed';
          delete mm.live;
        } else if (a.observed === 'invalid' || (a.observed === 'none' && !(expected === undefined && !success && cleanup && transport))) {
          expect(r.outcome).toBe('locator_missing');
          expect(r.refusal).toBeDefined();
          mm.status = 'unconfirmed';
          delete mm.live;
        } else if (a.observed === 'none') {
          expect(r.outcome).toBe('failed_before_session');
          expect(r.member.phase).toBe('FRESH');
          delete mm.live;
          // Not reused by the NEW turn that follows: reclaimed unless its exit was confirmed (R-S6).
          reclaimUnlessExited();
        } else if (expected !== undefined && observed !== expected) {
          // R-S2: refused and the saved locator is kept.
          expect(r.outcome).toBe('locator_mismatch');
          expect(r.refusal?.reason).toBe('locator_mismatch');
          expect(r.member.savedLocator).toBe(expected);
          delete mm.live;
          reclaimUnlessExited();
        } else if (!success && !(cleanup && transport)) {
          expect(r.outcome).toBe('unconfirmed');
          mm.saved = observed;
          mm.status = 'unconfirmed';
          delete mm.live;
        } else {
          expect(r.outcome).toBe(success ? 'completed' : 'failed_kept');
          mm.saved = observed;
          mm.completed++;
          mm.status = 'retained';
          keepLive();
        }
        expect(r.member.completedTurns).toBe(mm.completed);
        expect(r.member.reclaim).toEqual(mm.reclaim);
        hit(`complete:${r.outcome}`);
        break;
      }

      case 'completeAgain': {
        const mm = model.members[a.m]!;
        if (mm.lastTurnId === undefined || mm.inFlight) break;
        const before = sessions[a.m]!;
        const r = completeTurn(before, { turnId: mm.lastTurnId, observedLocator: 'whatever-id', end: { kind: 'ended', success: true, cleanupFinished: true, transportUsable: true, processExits: false } });
        if (before.lastTurn?.turnId === mm.lastTurnId) {
          expect(r.ok && r.duplicate).toBe(true);
          if (r.ok) expect(r.member).toBe(before);
        } else {
          expect(r.ok).toBe(false); // superseded by a later loss; never re-applied
        }
        break;
      }

      case 'processExit': {
        const w = world[a.m]!;
        if (!w.running) break;
        const p = w.running;
        delete w.running;
        w.procs = [];
        sessions[a.m] = onProcessExited(sessions[a.m]!, p);
        const mm = model.members[a.m]!;
        if (same(mm.live, p)) delete mm.live;
        if (same(mm.reclaim, p)) delete mm.reclaim;
        break;
      }

      case 'turnProcessExit': {
        // A kept turn process dies by itself (crash, OOM): nobody tells the control plane; the agent
        // just stops listing it.
        const w = world[a.m]!;
        w.procs = w.procs.slice(1);
        break;
      }

      case 'containerVanish': {
        if (model.groupState === 'LOST') break;
        const w = world[a.m]!;
        w.present = false;
        w.intact = false;
        delete w.running;
        w.procs = [];
        break;
      }

      case 'stop':
        doStop(a);
        break;

      case 'start': {
        if (group.state !== 'STOPPED') break;
        g({ type: 'started' }); // an unclean group may resume on its own host (R-G2)
        model.groupState = 'RUNNING';
        model.activitySeq++;
        break;
      }

      case 'checkpoint':
        doCheckpoint(a);
        break;

      case 'migrate':
        doMigrate(a);
        break;

      case 'drain':
        // R-H4/R-H5 planned move: clean stop, checkpoint, migrate.
        if (group.state === 'RUNNING') doStop({ killed: [false, false] });
        doCheckpoint({ corrupt: false, wrongImage: false });
        doMigrate({ restoreOk: true });
        break;

      case 'hostLoss': {
        if (group.state === 'LOST') break;
        // Often a host dies some time after a stop (with or without a checkpoint since).
        if (a.stopFirst !== 'no') doStop({ killed: [a.stopFirst === 'killed', false] });
        let attempts = 0;
        for (;;) {
          const assessment = assessCheckpoint(freshness(), checkpoint, TARGET, now, MAX_AGE_MS);
          const d = decideOnHostLoss(group, checkpoint === undefined ? undefined : assessment, { attempts, maxAttempts: MAX_RESTORES });
          const restorable = model.groupState === 'STOPPED' && model.clean === true && modelCheckpointUsable();
          if (d.action === 'restore') {
            expect(restorable).toBe(true);
            if (attempts < a.restoreFailures) {
              const after = decideAfterRestoreFailure({ attempts: attempts + 1, maxAttempts: MAX_RESTORES });
              if (after.action === 'lost') {
                expect(attempts + 1).toBe(MAX_RESTORES);
                g({ type: 'lost', reason: after.reason });
                hit(`hostLoss:${after.reason}`);
                loseGroup(group.lostReason);
                break;
              }
              attempts++;
              continue;
            }
            g({ type: 'migration_started', targetHostId: `h${hostN + 1}`, assessment });
            g({ type: 'migration_completed', targetHostId: `h${hostN + 1}` });
            restoreGroup();
            hit('hostLoss:restored');
            break;
          }
          expect(d.action).toBe('lost');
          if (d.action !== 'lost') break;
          if (restorable) expect(d.reason).toBe('restore_failed');
          if (model.groupState === 'RUNNING' || model.groupState === 'PENDING') expect(d.reason).toBe('host_lost_running');
          if (model.groupState === 'STOPPED' && model.clean === false) expect(d.reason).toBe('unclean_stop');
          g({ type: 'lost', reason: d.reason });
          hit(`hostLoss:${d.reason}`);
          loseGroup(group.lostReason);
          break;
        }
        break;
      }
    }

    // ---- invariants after every step ----
    for (let i = 0; i < MEMBERS.length; i++) {
      const s = sessions[i]!;
      const mm = model.members[i]!;
      // A saved locator is never replaced by a different one (R-S2, R-R2).
      if (firstSaved[i] === undefined) firstSaved[i] = s.savedLocator;
      else expect(s.savedLocator).toBe(firstSaved[i]);
      expect(s.savedLocator).toBe(mm.saved);
      expect(s.completedTurns).toBe(mm.completed);
      if (s.completedTurns > 0) expect(s.savedLocator).toBeDefined();
      // Every loss has a reason (R-R1).
      if (s.phase === 'LOST') expect(s.lostReason).toBeDefined();
      expect(s.phase === 'IN_TURN').toBe(mm.inFlight !== undefined);
      if (model.groupState === 'LOST') expect(s.phase).toBe('LOST');
    }
    if (group.state === 'LOST') expect(group.lostReason).toBeDefined();
    expect(group.state).toBe(model.groupState);
  }
}

describe('session and group core, model-based', () => {
  it(`random histories agree with the model and keep every invariant (numRuns=${PROPERTY_RUNS})`, () => {
    fc.assert(fc.property(fc.array(action, { minLength: 1, maxLength: 50, size: 'max' }), (actions) => { run(actions); }), { numRuns: PROPERTY_RUNS });
    if (process.env.DBG) console.log(JSON.stringify([...reached]));
    if (PROPERTY_RUNS >= 500) {
      const expected = [
        'begin:NEW', 'begin:LIVE', 'begin:LIVE:turn_process', 'begin:RESTORED', 'begin:reclaim', 'begin:reclaim:turn_process', 'begin:LOST', 'migrated', 'hostLoss:restored', 'hostLoss:host_lost_running',
        'hostLoss:unclean_stop', 'hostLoss:no_checkpoint', 'hostLoss:stale_checkpoint', 'hostLoss:checkpoint_corrupt', 'hostLoss:restore_failed',
        'complete:completed', 'complete:failed_kept', 'complete:unconfirmed', 'complete:locator_mismatch', 'complete:locator_missing', 'complete:failed_before_session',
      ];
      expect(expected.filter((p) => !reached.has(p)), JSON.stringify([...reached])).toEqual([]);
    }
  });

  it('a stated regression history: success, api_retry exit, restore, mismatch, disconnect', () => {
    run([
      { t: 'begin', m: 0, locator: 'none', fleet: false },
      { t: 'complete', m: 0, observed: 'expected', end: 'success', processExits: false, exitConfirmed: false },
      { t: 'begin', m: 0, locator: 'saved', fleet: false },
      { t: 'complete', m: 0, observed: 'expected', end: 'failKept', processExits: true, exitConfirmed: false },
      { t: 'begin', m: 0, locator: 'none', fleet: false },
      { t: 'complete', m: 0, observed: 'other', end: 'success', processExits: false, exitConfirmed: false },
      { t: 'stop', killed: [false, false] },
      { t: 'checkpoint', corrupt: false, wrongImage: false },
      { t: 'hostLoss', restoreFailures: 1, stopFirst: 'no' },
      { t: 'start' },
      { t: 'begin', m: 0, locator: 'saved', fleet: false },
      { t: 'complete', m: 0, observed: 'expected', end: 'notEnded', processExits: true, exitConfirmed: false },
      { t: 'begin', m: 0, locator: 'none', fleet: false },
    ]);
  });

  it('a stated history of fleet-driven turns: LIVE on the kept turn process, a runner cannot reuse it, a dead one is RESTORED', () => {
    run([
      { t: 'begin', m: 0, locator: 'none', fleet: true },
      { t: 'complete', m: 0, observed: 'expected', end: 'success', processExits: false, exitConfirmed: false },
      { t: 'begin', m: 0, locator: 'none', fleet: true },
      { t: 'complete', m: 0, observed: 'expected', end: 'success', processExits: false, exitConfirmed: false },
      { t: 'begin', m: 0, locator: 'none', fleet: false },
      { t: 'complete', m: 0, observed: 'expected', end: 'success', processExits: false, exitConfirmed: false },
      { t: 'begin', m: 0, locator: 'none', fleet: true },
      { t: 'complete', m: 0, observed: 'expected', end: 'success', processExits: false, exitConfirmed: false },
      { t: 'turnProcessExit', m: 0 },
      { t: 'begin', m: 0, locator: 'none', fleet: true },
      { t: 'complete', m: 0, observed: 'expected', end: 'success', processExits: true, exitConfirmed: true },
      { t: 'begin', m: 0, locator: 'none', fleet: true },
    ]);
  });
});
