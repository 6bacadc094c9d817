// The one host-id rule (R-H1, R-I2, R-R4): a host id is a Kubernetes node name, and every place a
// host id is parsed or mapped agrees — registration, the manifest schema, the NATS subject token,
// the per-host permissions, the KV key. Properties over ids built like Kubernetes node names
// (test/support/host-ids.ts), not from the product's regex.
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { AgentSubjects, hostIdFromSubject, hostIdFromToken, hostIdToken, hostInboxPrefix, hostPermissions, manifestSubject } from '../../../src/core/agent-subjects.ts';
import { validateCheckpointManifest } from '../../../src/core/checkpoint-manifest.ts';
import { ID_RULES, isHostId, parseHostId } from '../../../src/core/ids.ts';
import { eventSubjectToken } from '../../../src/control-plane/events.ts';
import { Keys } from '../../../src/control-plane/state.ts';
import { eventFilterSubject } from '../../../src/store/event-log.ts';
import { hostIdArb, isKubernetesNodeName } from '../../support/host-ids.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

/** A NATS subject token: not empty, no separator, no wildcard, no whitespace. */
const NATS_TOKEN = /^[^\s.*>]+$/;

const manifestFrom = (hostId: string): unknown => ({
  schemaVersion: 1, checkpointId: 'cp-1', groupId: 'g-1', placementGeneration: 1, source: { hostId, epoch: 1 }, createdAtMs: 2,
  cleanStop: { stoppedAtMs: 1, lastTurnCompletedAtMs: 1, stateRevision: 1, members: [{ memberId: 'm1', exitCode: 0, exitedWithinGrace: true }] },
  members: [{ memberId: 'm1', cliKind: 'claude-code', savedLocator: 's-1', nativeSessionPaths: [], layer: { digest: `sha256:${'a'.repeat(64)}`, size: 1, chunks: [{ digest: `sha256:${'b'.repeat(64)}`, size: 1 }] } }],
  baseImageDigest: `sha256:${'c'.repeat(64)}`, bridgeVersion: '4',
});
const manifestAccepts = (hostId: string): boolean => {
  try {
    validateCheckpointManifest(manifestFrom(hostId));
    return true;
  } catch {
    return false;
  }
};

describe('host ids are Kubernetes node names (R-H1)', () => {
  it('admits the node names clusters really use, and the fleet\'s own', () => {
    for (const id of [
      'ip-10-0-1-23.ec2.internal', // EKS
      'ip-10-0-1-23.eu-west-1.compute.internal',
      'gke-prod-default-pool-3f2a9c1d-x7kq', // GKE
      'aks-nodepool1-12345678-vmss000000', // AKS
      '10.0.1.23',
      'host-a', 'reg-good', 'h1',
      `${'a'.repeat(63)}.${'b'.repeat(63)}.${'c'.repeat(63)}.${'d'.repeat(61)}`, // 253
      'x'.repeat(253), // Kubernetes bounds the whole name, not each label
    ]) {
      expect(parseHostId(id).ok, id).toBe(true);
      expect(manifestAccepts(id), id).toBe(true);
    }
  });

  it('refuses what is not a node name: case, "_", empty labels, edge hyphens, subject/key metacharacters, > 253', () => {
    const cases: Array<[string, string]> = [
      ['Host-A', 'invalid_characters'], // refused, not folded: see ID_RULES.hostId
      ['IP-10-0-1-23.ec2.internal', 'invalid_characters'],
      ['host_a', 'invalid_characters'],
      ['-a', 'invalid_characters'], ['a-', 'invalid_characters'], ['a.-b', 'invalid_characters'], ['a-.b', 'invalid_characters'],
      ['.a', 'invalid_characters'], ['a.', 'invalid_characters'], ['a..b', 'invalid_characters'],
      ['a~b', 'invalid_characters'], ['a=b', 'invalid_characters'], ['a*b', 'invalid_characters'], ['a>b', 'invalid_characters'],
      ['a b', 'invalid_characters'], ['a/b', 'invalid_characters'], ['a$b', 'invalid_characters'],
      ['', 'empty_value'],
      ['x'.repeat(254), 'value_too_long'],
    ];
    for (const [id, reason] of cases) {
      const r = parseHostId(id);
      expect(r.ok, id).toBe(false);
      if (!r.ok) expect(r.error.reason, id).toBe(reason);
      expect(manifestAccepts(id), id).toBe(false);
      expect(() => hostIdToken(id), id).toThrow();
      expect(() => hostPermissions(id), id).toThrow();
    }
    expect(ID_RULES.hostId.maxLength).toBe(253);
  });

  it('is exactly Kubernetes\' DNS-1123 subdomain rule (property)', () => {
    const near = fc.stringMatching(/^[aB0_.~=*-]{0,12}$/);
    fc.assert(fc.property(fc.oneof(hostIdArb, near, fc.string({ maxLength: 260 })), (s) => {
      expect(isHostId(s), s).toBe(isKubernetesNodeName(s));
      expect(manifestAccepts(s), s).toBe(isKubernetesNodeName(s));
    }), { numRuns: PROPERTY_RUNS });
  });
});

describe('every admitted host id maps to NATS and KV one-to-one (R-I2)', () => {
  it('round-trips through its subject token, a valid token (property)', () => {
    fc.assert(fc.property(hostIdArb, (id) => {
      expect(isHostId(id)).toBe(true);
      const token = hostIdToken(id);
      expect(token).toMatch(NATS_TOKEN);
      expect(hostIdFromToken(token)).toBe(id);
      for (const subject of [AgentSubjects.heartbeat(id), AgentSubjects.notices(id), AgentSubjects.commands(id)]) {
        expect(subject.split('.')).toHaveLength(4);
        expect(hostIdFromSubject(subject)).toBe(id);
      }
      expect(AgentSubjects.probeCallback(id).split('.')).toEqual(['sf', 'probe', token]);
      expect(manifestSubject(id, 'g-1', 'c-1').split('.')).toEqual(['sf', 'manifest', token, 'g-1', 'c-1']);
      expect(hostInboxPrefix(id)).toMatch(NATS_TOKEN);
      // The audit log files the host's events under one valid token (the event store accepts it).
      expect(eventFilterSubject({ subjectKind: 'host', subjectId: eventSubjectToken(id) }).split('.')).toEqual(['sf', 'events', 'host', eventSubjectToken(id)]);
      // Every subject the credentials name is well formed: tokens are non-empty and wildcards whole.
      const perms = hostPermissions(id);
      for (const p of [...perms.publish, ...perms.subscribe]) {
        for (const t of p.split('.')) expect(t === '*' || t === '>' || NATS_TOKEN.test(t), `${p}`).toBe(true);
      }
    }), { numRuns: PROPERTY_RUNS });
  });

  it('no two admitted ids share a subject token, an inbox, a KV key or an event subject (property)', () => {
    fc.assert(fc.property(hostIdArb, hostIdArb, (a, b) => {
      fc.pre(a !== b);
      expect(hostIdToken(a)).not.toBe(hostIdToken(b));
      expect(hostInboxPrefix(a)).not.toBe(hostInboxPrefix(b));
      expect(Keys.host(a)).not.toBe(Keys.host(b));
      expect(eventSubjectToken(a)).not.toBe(eventSubjectToken(b));
    }), { numRuns: PROPERTY_RUNS });
  });

  it('a host named like another host\'s event digest does not share its audit trail', () => {
    const long = `${'a'.repeat(200)}.b`;
    const digestToken = eventSubjectToken(long);
    expect(digestToken.length).toBeLessThanOrEqual(128);
    expect(isHostId(digestToken)).toBe(false);
    expect(isHostId(digestToken.replace('_', ''))).toBe(true);
    expect(eventSubjectToken(digestToken.replace('_', ''))).not.toBe(digestToken);
  });

  it('reads back no host from a token that is not the image of a host id', () => {
    for (const t of ['', 'Host-A', 'a~~b', '~a', 'a~', 'a_b', 'a.b', '*', '>']) expect(hostIdFromToken(t), t).toBeUndefined();
    expect(hostIdFromSubject('sf.host.ip-10-0-1-23~ec2~internal.heartbeat')).toBe('ip-10-0-1-23.ec2.internal');
    expect(hostIdFromSubject('sf.host.HOST-A.heartbeat')).toBeUndefined();
  });
});
