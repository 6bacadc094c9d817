// END TO END for the operator CLI (R-I7, R-H7, R-H5, R-G3..R-G5): the real `sandboxctl` binary
// (child process: the launcher cmd/sandboxctl/sandboxctl.mjs, run as `kubectl-sandbox` through a
// symlink on PATH from another directory, the way kubectl finds plugins) over mTLS with an admin certificate
// → the API server with the real admin handlers → a real ControlPlane → real NATS, real host
// agents and real dockerd hosts (fleet-harness.ts; nothing mocked). Covers: hosts table and -o
// json; verify passing on a healthy fleet and exiting non-zero when the reverse probe fails;
// migrate of a clean-stopped group (and its refusal for a running one); drain moving a clean
// stopped group, with the operator's --reason in the host's audit event; events listing the
// transitions in order; destroy; remove --force with its reason.
import { execFile } from 'node:child_process';
import { mkdtemp, rm, symlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve as resolvePath } from 'node:path';
import { parse as parseYaml } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAdminHandlers } from '../../../src/api/admin-handlers.ts';
import { ApiServer } from '../../../src/api/runner-server.ts';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { API_SHA } from '../../../src/gen/api-sha.ts';
import { TEST_AGENT_SHA } from '../../support/agent.ts';
import { createTestPki, type TestPki } from '../../support/certs.ts';
import { SUCCESS, startFleet, type Fleet } from '../control-plane/fleet-harness.ts';

let fleet: Fleet;
let plane: ControlPlane;
let pki: TestPki;
let server: ApiServer;
let pluginDir = '';
let n = 0;
const key = () => `cli-k-${++n}`;

interface Run {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

function sandboxctl(...args: string[]): Promise<Run> {
  const conn = ['--server', `127.0.0.1:${server.port}`, '--ca', join(pki.dir, 'fleet-ca.crt'), '--cert', join(pki.dir, 'admin-1.crt'), '--key', join(pki.dir, 'admin-1.key')];
  return new Promise((resolve) => {
    const env = { ...process.env, PATH: `${pluginDir}:${process.env.PATH ?? ''}` };
    execFile('kubectl-sandbox', [...conn, ...args], { cwd: tmpdir(), env, timeout: 240_000, maxBuffer: 16 * 1024 * 1024 }, (error, stdout, stderr) => {
      const code = error === null ? 0 : typeof (error as { code?: unknown }).code === 'number' ? (error as { code: number }).code : -1;
      resolve({ code, stdout, stderr });
    });
  });
}

async function openStoppedGroup(conversationId: string, locator: string): Promise<string> {
  const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId, members: [{ memberId: 'm1', cli: 'claude_code' }] });
  const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: group.groupId, memberId: 'm1' });
  await fleet.writeSession(begun.hostId, begun.containerId, locator);
  await plane.runner.completeTurn({ idempotencyKey: key(), groupId: group.groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: locator, evidence: SUCCESS });
  const stopped = await plane.runner.stopGroup({ idempotencyKey: key(), groupId: group.groupId });
  expect(stopped.group.stopClean).toBe(true);
  return group.groupId;
}

beforeAll(async () => {
  pluginDir = await mkdtemp(join(tmpdir(), 'sf-kubectl-plugin-'));
  await symlink(resolvePath('cmd/sandboxctl/sandboxctl.mjs'), join(pluginDir, 'kubectl-sandbox'));
  [fleet, pki] = await Promise.all([startFleet(2), createTestPki()]);
  plane = await fleet.startPlane();
  await Promise.all([fleet.startAgentOn('host-a', 0), fleet.startAgentOn('host-b', 1)]);
  for (const h of ['host-a', 'host-b']) await fleet.waitFor(`${h} READY`, async () => ((await fleet.host(h)).lifecycle.state === 'READY' ? true : undefined));
  server = await ApiServer.start({
    runner: plane.runner, admin: createAdminHandlers(plane), address: '127.0.0.1:0',
    security: { mode: 'mtls', mtls: { ca: pki.ca, cert: pki.server.cert, key: pki.server.key } },
  });
}, 240_000);

afterAll(async () => {
  await server?.shutdown(1_000);
  await fleet?.cleanup();
  await pki?.cleanup();
  if (pluginDir !== '') await rm(pluginDir, { recursive: true, force: true });
});

describe('sandboxctl against a real fleet', () => {
  it('lists READY hosts as a table and as JSON', async () => {
    const t = await sandboxctl('hosts');
    expect(t.code).toBe(0);
    const lines = t.stdout.trim().split('\n');
    expect(lines[0]).toMatch(/^HOST\s+STATE\s+EPOCH/);
    for (const h of ['host-a', 'host-b']) expect(lines.find((l) => l.startsWith(h))).toMatch(new RegExp(`^${h}\\s+READY\\s+\\d+`));

    const j = await sandboxctl('-o', 'json', 'hosts');
    expect(j.code).toBe(0);
    const parsed = JSON.parse(j.stdout) as { hosts: { hostId: string; state: string; attestation: { agentBuildSha: string } }[] };
    expect(parsed.hosts.map((h) => [h.hostId, h.state])).toEqual([['host-a', 'HOST_STATE_READY'], ['host-b', 'HOST_STATE_READY']]);

    const y = await sandboxctl('-o', 'yaml', 'hosts', 'host-a');
    expect((parseYaml(y.stdout) as { host: { hostId: string } }).host.hostId).toBe('host-a');
    // Usage errors exit 2; unknown hosts are NOT_FOUND (exit 1).
    expect((await sandboxctl('hosts', '--state', 'bogus')).code).toBe(2);
    const missing = await sandboxctl('hosts', 'host-nope');
    expect(missing.code).toBe(1);
    expect(missing.stderr).toContain('NOT_FOUND host_not_found');
  });

  it('verify passes on a healthy fleet with a reverse probe round trip per host', async () => {
    const v = await sandboxctl('verify');
    expect(v.stderr).toBe('');
    expect(v.code).toBe(0);
    expect(v.stdout).toContain('verify: OK');
    // R-H7: the exact SHAs, in the table itself.
    expect(v.stdout).toMatch(new RegExp(`^host-a\\s+READY\\s+${TEST_AGENT_SHA}\\s+${API_SHA}\\s`, 'm'));
    const j = await sandboxctl('-o', 'json', 'verify');
    const res = JSON.parse(j.stdout) as { ok: boolean; hosts: { hostId: string; ok: boolean; probe: { ok: boolean; answeredBy: string; roundTripMs?: number } }[] };
    expect(res.ok).toBe(true);
    expect(res.hosts.map((h) => [h.hostId, h.ok, h.probe.ok, h.probe.answeredBy])).toEqual([['host-a', true, true, 'cp-1'], ['host-b', true, true, 'cp-1']]);
  });

  let groupId = '';

  it('migrates a clean-stopped group to the named host and refuses a running one', async () => {
    groupId = await openStoppedGroup('cli-conv-1', 'sess-cli-1');
    expect((await fleet.group(groupId)).lifecycle.hostId).toBe('host-a');
    const m = await sandboxctl('-o', 'json', 'migrate', groupId, '--to', 'host-b');
    expect(m.stderr).toBe('');
    expect(m.code).toBe(0);
    const res = JSON.parse(m.stdout) as { group: { state: string; hostId: string }; checkpointId: string };
    expect(res.group).toMatchObject({ state: 'GROUP_STATE_STOPPED', hostId: 'host-b' });
    expect(res.checkpointId).toMatch(/^c-/);
    expect((await fleet.group(groupId)).evacuation).toBeUndefined();

    const { group: running } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId: 'cli-conv-2', members: [{ memberId: 'm1', cli: 'claude_code' }] });
    const refused = await sandboxctl('migrate', running.groupId);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain('FAILED_PRECONDITION invalid_transition');
    const destroyed = await sandboxctl('destroy', running.groupId);
    expect(destroyed.code).toBe(0);
    expect(destroyed.stdout).toContain('DESTROYED');
    expect((await fleet.group(running.groupId)).lifecycle.state).toBe('DESTROYED');
  });

  it('drain moves the clean-stopped group, and events show the transitions in order', async () => {
    const d = await sandboxctl('drain', 'host-b', '--reason', 'kernel upgrade, ticket OPS-42');
    expect(d.code).toBe(0);
    expect(d.stdout).toContain('host host-b DRAINING');
    // The operator's words are in the audit event next to the machine-readable source.
    const hostEvents = await sandboxctl('-o', 'json', 'events', '--subject', 'host/host-b');
    const drained = hostEvents.stdout.trim().split('\n').map((l) => (JSON.parse(l) as { event: { type: string; reason?: string; detail?: Record<string, string> } }).event)
      .filter((x) => x.type === 'host_drain_requested');
    expect(drained).toEqual([expect.objectContaining({ reason: 'operator_drain', detail: expect.objectContaining({ operator_reason: 'kernel upgrade, ticket OPS-42' }) })]);
    await fleet.waitFor('group back on host-a', async () => {
      const g = await fleet.group(groupId);
      return g.lifecycle.state === 'STOPPED' && g.lifecycle.hostId === 'host-a' && g.evacuation === undefined ? true : undefined;
    }, 120_000);

    const e = await sandboxctl('-o', 'json', 'events', '--subject', `group/${groupId}`);
    expect(e.code).toBe(0);
    const events = e.stdout.trim().split('\n').map((l) => (JSON.parse(l) as { event: { seq: number; type: string; toState?: string; detail?: Record<string, string> } }).event);
    const seqs = events.map((x) => x.seq);
    expect(seqs).toEqual([...seqs].sort((a, b) => a - b));
    const types = events.map((x) => x.type);
    const order = ['group_created', 'group_started', 'group_stopped', 'checkpoint_created', 'group_migration_started', 'group_migration_completed', 'evacuation_started', 'group_migration_started', 'group_migration_completed'];
    let at = -1;
    for (const t of order) {
      const next = types.indexOf(t, at + 1);
      expect({ t, found: next > at }).toEqual({ t, found: true });
      at = next;
    }
    const table = await sandboxctl('events', '--subject', `group/${groupId}`);
    expect(table.stdout).toMatch(/group_migration_completed MIGRATING→STOPPED/);

    const cps = await sandboxctl('-o', 'yaml', 'checkpoints', '--group', groupId);
    expect(cps.code).toBe(0);
    const parsed = parseYaml(cps.stdout) as { checkpoints: { manifest: { groupId: string }; latest?: boolean }[] };
    expect(parsed.checkpoints.length).toBeGreaterThan(0);
    expect(parsed.checkpoints.every((c) => c.manifest.groupId === groupId)).toBe(true);

    const groups = await sandboxctl('groups', '--host', 'host-a');
    expect(groups.stdout).toMatch(new RegExp(`${groupId}\\s+cli-conv-1\\s+STOPPED\\s+host-a`));
  });

  it('verify exits non-zero when a host agent does not answer the reverse probe', async () => {
    await fleet.waitFor('host-b REMOVED', async () => ((await fleet.host('host-b')).lifecycle.state === 'REMOVED' ? true : undefined), 60_000);
    // host-b is REMOVED (not verified by default); host-a loses its agent.
    await fleet.stopAgent('host-a');
    const v = await sandboxctl('verify', '--probe-timeout', '1500');
    expect(v.code).toBe(1);
    expect(v.stdout).toContain('verify: MISMATCH');
    expect(v.stdout).toMatch(/host-a: reverse probe:/);

    const r = await sandboxctl('remove', 'host-a', '--force', '--reason', 'decommissioned');
    expect(r.code).toBe(0);
    const events = await sandboxctl('events', '--subject', 'host/host-a');
    expect(events.stdout).toMatch(/host_removed \S+→REMOVED {2}reason=operator_remove \(force\) .*operator_reason=decommissioned/);
  });
});
