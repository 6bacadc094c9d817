// Per-host NATS permissions (R-I2, R-R5) as a property: whatever two distinct host ids, nothing
// host A's credentials allow reaches a subject that belongs to host B (its commands, heartbeats,
// notices, probe callbacks, replies, manifests), and nothing reaches control-plane state at all.
// The subject matcher below is NATS's rule: tokens split on '.', '*' matches one token, a final
// '>' one or more.
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { AgentSubjects, CHECKPOINT_STREAMS, hostInboxPrefix, hostPermissions, manifestSubject } from '../../../src/core/agent-subjects.ts';
import { hostIdArb } from '../../support/host-ids.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';


function matches(pattern: string, subject: string): boolean {
  const p = pattern.split('.');
  const s = subject.split('.');
  for (let i = 0; i < p.length; i++) {
    if (p[i] === '>') return i === p.length - 1 && s.length > i;
    if (i >= s.length) return false;
    if (p[i] !== '*' && p[i] !== s[i]) return false;
  }
  return p.length === s.length;
}
const allowed = (patterns: readonly string[], subject: string): boolean => patterns.some((p) => matches(p, subject));

/** Subjects of `hostId` that no other host may use. */
function ownSubjects(hostId: string): { publish: string[]; subscribe: string[] } {
  return {
    publish: [AgentSubjects.heartbeat(hostId), AgentSubjects.notices(hostId), AgentSubjects.probeCallback(hostId), manifestSubject(hostId, 'g-1', 'c-1')],
    subscribe: [AgentSubjects.commands(hostId), `${hostInboxPrefix(hostId)}.abc123`],
  };
}

// Host ids as the one rule admits them (Kubernetes node names), look-alike pairs included.
const hostId = hostIdArb;

describe('hostPermissions', () => {
  it('allows a host its own subjects', () => {
    fc.assert(
      fc.property(hostId, (id) => {
        const perms = hostPermissions(id);
        const own = ownSubjects(id);
        for (const s of own.publish) expect(allowed(perms.publish, s), s).toBe(true);
        for (const s of own.subscribe) expect(allowed(perms.subscribe, s), s).toBe(true);
        expect(allowed(perms.publish, AgentSubjects.register)).toBe(true);
        expect(allowed(perms.publish, 'sf.chunk.0123abcd')).toBe(true);
        // Reads of the chunk and manifest streams only: a direct get, and the leader's get for a
        // direct get's "none" (a replica that has not caught up).
        expect(allowed(perms.publish, `$JS.API.STREAM.MSG.GET.${CHECKPOINT_STREAMS.chunks}`)).toBe(true);
        expect(allowed(perms.publish, `$JS.API.STREAM.MSG.GET.${CHECKPOINT_STREAMS.manifests}`)).toBe(true);
        expect(perms.allowResponses).toBe(true);
      }),
      { numRuns: PROPERTY_RUNS },
    );
  });

  it("never allows one host another host's subjects", () => {
    fc.assert(
      fc.property(hostId, hostId, (a, b) => {
        fc.pre(a !== b);
        const perms = hostPermissions(a);
        const theirs = ownSubjects(b);
        for (const s of theirs.publish) expect(allowed(perms.publish, s), `${a} publishing ${s}`).toBe(false);
        for (const s of theirs.subscribe) expect(allowed(perms.subscribe, s), `${a} subscribing ${s}`).toBe(false);
      }),
      { numRuns: PROPERTY_RUNS },
    );
  });

  it('allows no control-plane state, stream administration, consumers or wildcards over everything', () => {
    const perms = hostPermissions('host-a');
    for (const s of ['$KV.sf_groups_0.g-1', '$KV.sf_hosts.host-a', '$JS.API.STREAM.DELETE.SF_CHUNKS', '$JS.API.STREAM.PURGE.SF_CHECKPOINTS', '$JS.API.STREAM.UPDATE.SF_CHUNKS', '$JS.API.CONSUMER.CREATE.SF_CHUNKS', '$JS.API.STREAM.INFO.KV_sf_groups_0', '$JS.API.DIRECT.GET.KV_sf_hosts', '$JS.API.STREAM.MSG.GET.KV_sf_hosts', '$JS.API.STREAM.MSG.GET.SF_EVENTS', 'sf.events.group.g-1', '_INBOX.abc']) {
      expect(allowed(perms.publish, s), s).toBe(false);
    }
    for (const s of [AgentSubjects.allHeartbeats, '_INBOX.abc', 'sf.agent.register', '$KV.sf_groups_0.g-1']) expect(allowed(perms.subscribe, s), s).toBe(false);
    for (const p of [...perms.publish, ...perms.subscribe]) expect(p === '>' || p.startsWith('>') || p === '$JS.API.>').toBe(false);
  });
});
