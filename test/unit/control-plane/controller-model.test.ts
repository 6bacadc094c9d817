// Model-based test of the migration controller's decisions (R-G2..R-G6, R-H4..R-H6, R-R1, R-R2):
// random sequences of host and group events (open, turns, clean/unclean stops, corrupt blobs,
// drains, deaths, re-registrations, time passing, controller passes with random restore outcomes)
// run through the SAME pure rules the controller uses — evacuationFor, decideEvacuationStep,
// chooseHost, assessCheckpoint, decideOnHostLoss, decideAfterRestoreFailure, and core's
// transitionHost/transitionGroup. Invariants are checked after every event, and at the end the
// fleet is left to settle: every evacuation must finish (moved, or LOST with a reason).
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  assessCheckpoint,
  createGroup,
  decideAfterRestoreFailure,
  decideOnHostLoss,
  transitionGroup,
  transitionHost,
  unwrap,
  type GroupLifecycle,
  type HostEvent,
  type HostLifecycle,
  type MemberPhase,
} from '../../../src/core/index.ts';
import { decideEvacuationStep } from '../../../src/control-plane/evacuation-policy.ts';
import { evacuationFor } from '../../../src/control-plane/migration-controller.ts';
import { chooseHost, type HostCandidate } from '../../../src/control-plane/placement.ts';
import type { Evacuation, HostRecord } from '../../../src/control-plane/records.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

const HOSTS = ['h0', 'h1', 'h2', 'h3'];
const DIGEST = `sha256:${'a'.repeat(64)}`;
const MAX_ATTEMPTS = 2;
const TURN_WAIT = 1_000;
const DEADLINE = 10_000;
const MAX_AGE = 50_000;

interface ModelCheckpoint { activityVersion: number; createdAtMs: number; corrupt: boolean }
interface ModelGroup { id: string; lc: GroupLifecycle; phase: MemberPhase; evacuation?: Evacuation; checkpoint?: ModelCheckpoint; everUnclean: boolean }
interface Model { now: number; hosts: Map<string, HostLifecycle>; groups: ModelGroup[] }

type Cmd =
  | { t: 'open' }
  | { t: 'turn'; g: number }
  | { t: 'begin'; g: number }
  | { t: 'stop'; g: number; clean: boolean }
  | { t: 'corrupt'; g: number }
  | { t: 'drain'; h: number }
  | { t: 'kill'; h: number }
  | { t: 'silent'; h: number }
  | { t: 'back'; h: number }
  | { t: 'time'; ms: number }
  | { t: 'pass'; restoreOk: boolean[] };

const cmd: fc.Arbitrary<Cmd> = fc.oneof(
  { weight: 4, arbitrary: fc.constant<Cmd>({ t: 'open' }) },
  { weight: 3, arbitrary: fc.nat(9).map<Cmd>((g) => ({ t: 'turn', g })) },
  { weight: 1, arbitrary: fc.nat(9).map<Cmd>((g) => ({ t: 'begin', g })) },
  { weight: 4, arbitrary: fc.record({ g: fc.nat(9), clean: fc.boolean() }).map<Cmd>((r) => ({ t: 'stop', ...r })) },
  { weight: 2, arbitrary: fc.nat(9).map<Cmd>((g) => ({ t: 'corrupt', g })) },
  { weight: 1, arbitrary: fc.nat(3).map<Cmd>((h) => ({ t: 'drain', h })) },
  { weight: 1, arbitrary: fc.nat(3).map<Cmd>((h) => ({ t: 'kill', h })) },
  { weight: 1, arbitrary: fc.nat(3).map<Cmd>((h) => ({ t: 'silent', h })) },
  { weight: 1, arbitrary: fc.nat(3).map<Cmd>((h) => ({ t: 'back', h })) },
  { weight: 2, arbitrary: fc.integer({ min: 1, max: 20_000 }).map<Cmd>((ms) => ({ t: 'time', ms })) },
  { weight: 3, arbitrary: fc.array(fc.boolean(), { minLength: 1, maxLength: 8 }).map<Cmd>((restoreOk) => ({ t: 'pass', restoreOk })) },
);

function hostRecord(id: string, lc: HostLifecycle): HostRecord {
  return { hostId: id, lifecycle: lc, attestation: { agentSha: '', apiSha: '', dockerVersion: '', storageDriver: 'overlay2', imageRef: '', imageDigest: DIGEST, bridgeVersion: 4, mismatches: [] }, agentInstanceId: 'x', registeredAtMs: 0, maxMembers: 6, updatedAtMs: 0 };
}

function candidatesOf(m: Model): HostCandidate[] {
  return HOSTS.map((id) => ({
    hostId: id,
    lifecycle: m.hosts.get(id)!,
    maxMembers: 6,
    usedMembers: m.groups.filter((g) => g.lc.state !== 'LOST' && g.lc.state !== 'DESTROYED' && (g.lc.hostId === id || g.lc.migration?.targetHostId === id)).length,
    imageDigest: DIGEST,
    bridgeVersion: 4,
  }));
}

function hostEvent(m: Model, id: string, e: HostEvent): void {
  const r = transitionHost(m.hosts.get(id)!, e);
  if (r.ok) m.hosts.set(id, r.value);
}

/** What the runs exercised, so the test proves it covered migrations and every loss path. */
const seen = new Map<string, number>();

function groupEvent(m: Model, g: ModelGroup, e: Parameters<typeof transitionGroup>[1]): boolean {
  const r = transitionGroup(g.lc, e, m.now);
  if (r.ok) {
    g.lc = r.value;
    const label = e.type === 'lost' ? `lost:${e.reason}` : e.type;
    seen.set(label, (seen.get(label) ?? 0) + 1);
  }
  return r.ok;
}

function stopGroup(m: Model, g: ModelGroup, clean: boolean): void {
  if (!groupEvent(m, g, { type: 'stop_requested' })) return;
  const isClean = clean && g.phase !== 'IN_TURN';
  unwrap(transitionGroup(g.lc, { type: 'stopped', verdict: { clean: true } }, m.now));
  groupEvent(m, g, { type: 'stopped', verdict: isClean ? { clean: true } : { clean: false, findings: [{ memberId: 'm', reason: g.phase === 'IN_TURN' ? 'turn_in_flight' : 'killed' }] } });
  if (g.phase === 'IN_TURN') g.phase = 'UNCONFIRMED';
  if (isClean) g.checkpoint = { activityVersion: g.lc.activityVersion, createdAtMs: m.now, corrupt: false };
  else g.everUnclean = true;
}

/** One controller pass: mark evacuations, step every group to a fixed point, remove empty drained hosts. */
function pass(m: Model, restoreOk: boolean[]): void {
  let r = 0;
  for (const g of m.groups) {
    if (g.lc.state === 'LOST' || g.lc.state === 'DESTROYED') continue;
    const wanted = evacuationFor(hostRecord(g.lc.hostId, m.hosts.get(g.lc.hostId)!));
    if (wanted === undefined || g.evacuation?.kind === wanted.kind || g.evacuation?.kind === 'unplanned') continue;
    g.evacuation = { kind: wanted.kind, source: wanted.source, sourceHostId: g.lc.hostId, startedAtMs: g.evacuation?.startedAtMs ?? m.now, deadlineMs: (g.evacuation?.startedAtMs ?? m.now) + DEADLINE, attempts: g.evacuation?.attempts ?? 0, triedHostIds: g.evacuation?.triedHostIds ?? [] };
  }
  for (const g of m.groups) {
    for (let i = 0; i < 16; i++) {
      const d = decideEvacuationStep({ lifecycle: g.lc, memberPhases: [g.phase], evacuation: g.evacuation }, m.now, TURN_WAIT);
      if (d.action === 'none' || d.action === 'wait') break;
      if (d.action === 'clear') { delete g.evacuation; break; }
      if (d.action === 'lost') { groupEvent(m, g, { type: 'lost', reason: d.reason }); delete g.evacuation; break; }
      if (d.action === 'stop') { stopGroup(m, g, true); continue; }
      const ev = g.evacuation!;
      if (d.action === 'plan_restore') {
        const hostAlive = ['READY', 'DRAINING'].includes(m.hosts.get(g.lc.hostId)!.state);
        // Planned departures re-checkpoint on the (still running) source when the checkpoint is behind.
        if (ev.kind === 'planned' && hostAlive && (g.checkpoint === undefined || g.checkpoint.activityVersion !== g.lc.activityVersion)) {
          g.checkpoint = { activityVersion: g.lc.activityVersion, createdAtMs: m.now, corrupt: false };
        }
        const target = g.checkpoint === undefined ? undefined : chooseHost(candidatesOf(m), { members: 1, exclude: new Set([ev.sourceHostId, g.lc.hostId, ...ev.triedHostIds]), imageDigest: DIGEST, bridgeVersion: 4 });
        const assessment = g.checkpoint === undefined ? undefined : assessCheckpoint(
          { groupId: g.id, activityVersion: g.lc.activityVersion, lastActivityAtMs: g.lc.lastActivityAtMs, memberIds: ['m'] },
          { checkpointId: `c-${g.id}`, groupId: g.id, placementGeneration: g.lc.generation, createdAtMs: g.checkpoint.createdAtMs, activityVersion: g.checkpoint.activityVersion, baseImageDigest: DIGEST, bridgeVersion: 4, members: [{ memberId: 'm', blobPresent: true, digestVerified: !g.checkpoint.corrupt }] },
          { imageDigests: new Set([DIGEST]), bridgeVersion: 4 }, m.now, MAX_AGE);
        const decision = decideOnHostLoss(g.lc, assessment, { attempts: ev.attempts, maxAttempts: MAX_ATTEMPTS });
        if (decision.action === 'lost') { groupEvent(m, g, { type: 'lost', reason: decision.reason }); delete g.evacuation; break; }
        if (decision.action === 'none') break;
        if (target === undefined) {
          if (m.now > ev.deadlineMs) { groupEvent(m, g, { type: 'lost', reason: 'no_eligible_host' }); delete g.evacuation; }
          break;
        }
        expect(target.lifecycle.state).toBe('READY');
        expect(groupEvent(m, g, { type: 'migration_started', targetHostId: target.hostId, assessment: assessment! })).toBe(true);
        continue;
      }
      // restore
      const mig = g.lc.migration!;
      expect(mig.targetHostId).not.toBe(g.lc.hostId);
      if (g.checkpoint?.corrupt) { groupEvent(m, g, { type: 'lost', reason: 'checkpoint_corrupt' }); delete g.evacuation; break; }
      const ok = m.hosts.get(mig.targetHostId)!.state === 'READY' && (restoreOk[r++ % restoreOk.length] ?? true);
      if (ok) {
        expect(g.everUnclean && g.lc.stop?.clean !== true).toBe(false);
        const gen = g.lc.generation;
        expect(groupEvent(m, g, { type: 'migration_completed', targetHostId: mig.targetHostId })).toBe(true);
        expect(g.lc.generation).toBe(gen + 1);
        delete g.evacuation;
        break;
      }
      const attempts = (g.evacuation?.attempts ?? 0) + 1;
      groupEvent(m, g, { type: 'migration_aborted' });
      g.evacuation = { ...(g.evacuation ?? { kind: 'planned', source: 'operator_drain', sourceHostId: g.lc.hostId, startedAtMs: m.now, deadlineMs: m.now + DEADLINE, triedHostIds: [] }), attempts, triedHostIds: [...(g.evacuation?.triedHostIds ?? []), mig.targetHostId] } as Evacuation;
      if (decideAfterRestoreFailure({ attempts, maxAttempts: MAX_ATTEMPTS }).action === 'lost') { groupEvent(m, g, { type: 'lost', reason: 'restore_failed' }); delete g.evacuation; break; }
    }
  }
  for (const id of HOSTS) {
    const lc = m.hosts.get(id)!;
    if (lc.state !== 'DRAINING') continue;
    if (!m.groups.some((g) => g.lc.state !== 'LOST' && g.lc.state !== 'DESTROYED' && (g.lc.hostId === id || g.lc.migration?.targetHostId === id))) hostEvent(m, id, { type: 'removed' });
  }
}

function apply(m: Model, c: Cmd): void {
  const g = 'g' in c ? m.groups[c.g % Math.max(1, m.groups.length)] : undefined;
  const h = 'h' in c ? HOSTS[c.h]! : undefined;
  switch (c.t) {
    case 'open': {
      const target = chooseHost(candidatesOf(m), { members: 1 });
      if (target === undefined || m.groups.length >= 10) return;
      expect(target.lifecycle.state).toBe('READY');
      const grp: ModelGroup = { id: `g${m.groups.length}`, lc: createGroup(target.hostId, m.now), phase: 'FRESH', everUnclean: false };
      groupEvent(m, grp, { type: 'started' });
      m.groups.push(grp);
      return;
    }
    case 'turn':
      if (g && g.evacuation === undefined && g.lc.state === 'RUNNING' && groupEvent(m, g, { type: 'turn_completed' })) g.phase = 'RETAINED';
      return;
    case 'begin':
      if (g && g.evacuation === undefined && g.lc.state === 'RUNNING' && g.phase !== 'IN_TURN') g.phase = 'IN_TURN';
      return;
    case 'stop':
      if (g && g.evacuation === undefined && g.lc.state === 'RUNNING') stopGroup(m, g, c.clean);
      return;
    case 'corrupt':
      if (g?.checkpoint) g.checkpoint.corrupt = true;
      return;
    case 'drain': return hostEvent(m, h!, { type: 'drain_requested', source: 'operator_drain' });
    case 'kill': return hostEvent(m, h!, { type: 'declared_dead', source: 'docker_data_lost' });
    case 'silent':
      hostEvent(m, h!, { type: 'heartbeat_missed' });
      return hostEvent(m, h!, { type: 'declared_dead', source: 'heartbeat_lost' });
    case 'back': {
      const lc = m.hosts.get(h!)!;
      if (lc.state !== 'DEAD' && lc.state !== 'REMOVED') return;
      hostEvent(m, h!, { type: 'registered', epoch: lc.epoch + 1 });
      return hostEvent(m, h!, { type: 'attestation_passed' });
    }
    case 'time':
      m.now += c.ms;
      return;
    case 'pass':
      return pass(m, c.restoreOk);
  }
}

function invariants(m: Model): void {
  for (const g of m.groups) {
    if (g.lc.state === 'LOST') expect(g.lc.lostReason).toBeDefined();
    if (g.lc.state === 'MIGRATING') expect(g.lc.migration?.targetHostId).not.toBe(g.lc.hostId);
    // An unclean group is never migrated (R-G2): its generation stays 1.
    if (g.everUnclean && g.lc.stop?.clean !== true && g.lc.state !== 'LOST') expect(g.lc.generation).toBe(1);
  }
}

describe('migration controller decisions (model-based)', () => {
  it('keeps its invariants and finishes every evacuation over random event sequences', () => {
    fc.assert(
      fc.property(fc.array(cmd, { minLength: 10, maxLength: 80 }), (cmds) => {
        const m: Model = { now: 1_000, hosts: new Map(HOSTS.map((id) => [id, { state: 'READY', epoch: 1 } as HostLifecycle])), groups: [] };
        for (const c of cmds) {
          apply(m, c);
          invariants(m);
        }
        // Settle: time passes beyond every deadline and passes run until nothing changes.
        for (let i = 0; i < 20; i++) {
          m.now += DEADLINE + TURN_WAIT + 1;
          pass(m, [true, false, true]);
          invariants(m);
        }
        for (const g of m.groups) {
          const host = m.hosts.get(g.lc.hostId)!;
          const terminal = g.lc.state === 'LOST' || g.lc.state === 'DESTROYED';
          expect(g.lc.state).not.toBe('MIGRATING');
          if (!terminal) {
            // Nothing left behind on a host that went away: moved (on a live host) or LOST.
            expect(host.state).toBe('READY');
            expect(g.evacuation).toBeUndefined();
          }
        }
      }),
      { numRuns: PROPERTY_RUNS },
    );
    for (const label of ['migration_completed', 'migration_aborted', 'lost:unclean_stop', 'lost:host_lost_running', 'lost:checkpoint_corrupt', 'lost:restore_failed']) {
      expect(seen.get(label) ?? 0, label).toBeGreaterThan(0);
    }
  });
});
