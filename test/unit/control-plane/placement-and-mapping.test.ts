// Pure control-plane rules: placement only on READY, attested hosts with room, spread by load
// (R-H2..R-H4); which evacuation a host state calls for (R-H5, R-G6); runner evidence → turn end
// (R-S5, R-S6); configuration bounds.
import { describe, expect, it } from 'vitest';
import { ControlPlaneConfigSchema, loadControlPlaneConfig } from '../../../src/config/control-plane.ts';
import { evacuationFor } from '../../../src/control-plane/migration-controller.ts';
import { chooseHost, eligibleHosts, type HostCandidate } from '../../../src/control-plane/placement.ts';
import type { HostRecord } from '../../../src/control-plane/records.ts';
import { turnEndFromEvidence } from '../../../src/control-plane/runner-backend.ts';
import { Keys } from '../../../src/control-plane/state.ts';

const D = `sha256:${'b'.repeat(64)}`;
const host = (hostId: string, state: HostCandidate['lifecycle']['state'], used = 0, extra: Partial<HostCandidate> = {}): HostCandidate => ({
  hostId, lifecycle: { state, epoch: 1 }, maxMembers: 4, usedMembers: used, imageDigest: D, bridgeVersion: 4, ...extra,
});

describe('placement', () => {
  it('never picks DRAINING, SUSPECT, DEAD, UNATTESTED, REMOVED or unproven hosts', () => {
    const hosts = [host('d', 'DRAINING'), host('s', 'SUSPECT'), host('x', 'DEAD'), host('u', 'UNATTESTED'), host('r', 'REMOVED'), host('nb', 'READY', 0, { bridgeVersion: undefined })];
    expect(chooseHost(hosts, { members: 1 })).toBeUndefined();
  });

  it('spreads to the least loaded READY host and respects capacity and exclusions', () => {
    const hosts = [host('a', 'READY', 3), host('b', 'READY', 1), host('c', 'READY', 2)];
    expect(chooseHost(hosts, { members: 1 })?.hostId).toBe('b');
    expect(chooseHost(hosts, { members: 1, exclude: new Set(['b']) })?.hostId).toBe('c');
    expect(chooseHost(hosts, { members: 2 })?.hostId).toBe('b');
    expect(eligibleHosts(hosts, { members: 3 }).map((h) => h.hostId)).toEqual(['b']);
  });

  it('judges room by the larger of the records and the host\'s own report, and spreads by the records', () => {
    // a: empty by the records, full by its heartbeat (containers of LOST groups it keeps); b, c by both.
    const hosts = [host('a', 'READY', 0, { reportedMembers: 4 }), host('b', 'READY', 2, { reportedMembers: 1 }), host('c', 'READY', 1, { reportedMembers: 3 })];
    expect(eligibleHosts(hosts, { members: 1 }).map((h) => h.hostId)).toEqual(['b', 'c']);
    expect(chooseHost(hosts, { members: 1 })?.hostId).toBe('c');
    expect(chooseHost(hosts, { members: 2 })?.hostId).toBe('b');
    expect(chooseHost(hosts, { members: 3 })).toBeUndefined();
  });

  it('restores only onto hosts with the checkpoint image digest and bridge version (R-G4)', () => {
    const hosts = [host('a', 'READY', 0, { imageDigest: `sha256:${'c'.repeat(64)}` }), host('b', 'READY', 2)];
    expect(chooseHost(hosts, { members: 1, imageDigest: D, bridgeVersion: 4 })?.hostId).toBe('b');
    expect(chooseHost(hosts, { members: 1, imageDigest: D, bridgeVersion: 3 })).toBeUndefined();
  });
});

describe('evacuationFor', () => {
  const rec = (state: HostRecord['lifecycle']['state'], goingAway?: HostRecord['lifecycle']['goingAway']) => ({ lifecycle: { state, epoch: 2, ...(goingAway ? { goingAway } : {}) } }) as HostRecord;
  it('maps host states to planned/unplanned departures', () => {
    expect(evacuationFor(rec('READY'))).toBeUndefined();
    expect(evacuationFor(rec('SUSPECT'))).toBeUndefined();
    expect(evacuationFor(rec('DRAINING', 'lease_ending'))).toEqual({ kind: 'planned', source: 'lease_ending' });
    expect(evacuationFor(rec('DEAD', 'docker_data_lost'))).toEqual({ kind: 'unplanned', source: 'docker_data_lost' });
    // No host record (yet): nothing proves the host is gone, so no evacuation is decided (R-R6).
    expect(evacuationFor(undefined)).toBeUndefined();
  });
});

describe('turnEndFromEvidence', () => {
  const base = { kind: 'result' as const, nativeTurnEnded: true, succeeded: true, cleanupFinished: true, transportUsable: true, locatorUsable: true, processExited: false, exitConfirmed: false };
  it('a disconnect, timeout, cancel or rejection is never a turn end (R-S5)', () => {
    expect(turnEndFromEvidence({ ...base, kind: 'disconnect', nativeTurnEnded: false })).toEqual({ kind: 'not_ended', cause: 'transport_disconnect' });
    expect(turnEndFromEvidence({ ...base, kind: 'timeout', nativeTurnEnded: false })).toEqual({ kind: 'not_ended', cause: 'timeout' });
    expect(turnEndFromEvidence({ ...base, kind: 'rejected', nativeTurnEnded: false })).toEqual({ kind: 'not_ended', cause: 'command_rejected' });
  });
  it('a Claude api_retry ends the turn and the process exits (R-S6)', () => {
    expect(turnEndFromEvidence({ ...base, kind: 'api_retry', succeeded: false })).toMatchObject({ kind: 'ended', success: false, processExits: true });
  });
  it('an unusable locator makes the transport unusable for keeping the session', () => {
    expect(turnEndFromEvidence({ ...base, succeeded: false, locatorUsable: false })).toMatchObject({ kind: 'ended', transportUsable: false });
  });
});

describe('keys and config', () => {
  it('encodes ids into KV keys one-to-one', () => {
    expect(Keys.host('node.example.com')).toBe('node=example=com');
    expect(Keys.conversation('conv:1')).not.toContain(':');
    expect(Keys.idempotency('open', 'k')).toMatch(/^open\.[0-9a-f]{64}$/);
  });
  it('parses lists and rejects a TTL not above the heartbeat interval', () => {
    const c = loadControlPlaneConfig({ SANDBOXFLEET_ALLOWED_IMAGE_DIGESTS: `${D}, ${D}` });
    expect(c.allowedImageDigests).toEqual([D, D]);
    expect(c.allowedStorageDrivers).toEqual(['overlay2']);
    expect(() => loadControlPlaneConfig({ SANDBOXFLEET_HEARTBEAT_INTERVAL_MS: '5000', SANDBOXFLEET_HEARTBEAT_TTL_MS: '4000' })).toThrow(/heartbeatTtlMs/);
    expect(ControlPlaneConfigSchema.safeParse({ restoreMaxAttempts: 0 }).success).toBe(false);
  });
  it('takes a Codex CLI profile, but not one that keeps its process between turns (one codex exec per turn)', () => {
    const c = loadControlPlaneConfig({ SANDBOXFLEET_CLI_PROFILES: JSON.stringify({ codex: { binary: 'codex', env: {}, keepProcess: false } }) });
    expect(c.cliProfiles.codex?.binary).toBe('codex');
    expect(() => loadControlPlaneConfig({ SANDBOXFLEET_CLI_PROFILES: JSON.stringify({ codex: { binary: 'codex', env: {}, keepProcess: true } }) })).toThrow(/keepProcess/);
  });
});
