// The leader-kept gauges behind the alerts (R-I3, R-I4), on a real control plane over a real
// nats-server (no Docker needed: host, heartbeat, group and checkpoint records are written to the
// KV buckets as the registry and the agents would), with the DEFAULT timings and a virtual clock:
// - the heartbeat age keeps growing after a host is DEAD (10 s TTL + 10 s grace), so
//   SandboxFleetHeartbeatMissing (30 s for 2 min) fires — checked by promtool on the sampled values;
//   a REMOVED host, or one whose record is gone, drops its series;
// - the retention pass exports the checkpoint exposure and the configured maximum age, and
//   SandboxFleetCheckpointStale fires on those values before the maximum age is reached.
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import type { NatsConnection } from '@nats-io/transport-node';
import { parse, stringify } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ControlPlaneConfigSchema } from '../../../src/config/control-plane.ts';
import { toolPath } from '../../../src/config/tools.ts';
import { CONTROL_PLANE_BUCKETS } from '../../../src/control-plane/buckets.ts';
import { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { applyHostEvent } from '../../../src/control-plane/hosts.ts';
import type { CheckpointRecord, GroupRecord, HostRecord } from '../../../src/control-plane/records.ts';
import { collectCheckpoints } from '../../../src/control-plane/retention.ts';
import { Keys } from '../../../src/control-plane/state.ts';
import type { GroupLifecycle } from '../../../src/core/index.ts';
import { API_SHA } from '../../../src/gen/api-sha.ts';
import { silentLogger } from '../../../src/observability/logger.ts';
import { FleetMetrics } from '../../../src/observability/metrics.ts';
import { ChunkStore } from '../../../src/store/chunk-store.ts';
import { StateStore } from '../../../src/store/connection.ts';
import { startTestNats, type TestNats } from '../../support/nats.ts';

const ALERTS = resolve('helm/sandbox-fleet/files/alerts.yaml');
const T0 = 1_800_000_000_000;
const H = 3_600_000;

let nats: TestNats;
let nc: NatsConnection;
let store: StateStore<typeof CONTROL_PLANE_BUCKETS>;
let plane: ControlPlane;
let scratch: string;
let clock = T0;
const metrics = new FleetMetrics();
// Defaults only: the alert thresholds must work with what an operator gets out of the box.
const config = ControlPlaneConfigSchema.parse({});

beforeAll(async () => {
  scratch = await mkdtemp(join(tmpdir(), 'sf-obs-'));
  nats = await startTestNats();
  nc = await nats.connect('control-plane');
  store = await StateStore.open(nc, { buckets: CONTROL_PLANE_BUCKETS });
  const chunks = await ChunkStore.open(nc);
  plane = new ControlPlane({ config, nc, store, chunks, metrics, logger: silentLogger(), apiSha: API_SHA, replicaId: 'cp-obs', now: () => clock, autoReconcile: false });
  // The read model only: this test drives the liveness loop and GC by hand.
  await plane.fleet.start();
}, 60_000);

afterAll(async () => {
  plane?.fleet.stop();
  await nats?.cleanup();
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

async function gauge(name: string, labels: Record<string, string> = {}): Promise<number | undefined> {
  const values = (await metrics.registry.getSingleMetric(name)?.get())?.values ?? [];
  return values.find((v) => Object.entries(labels).every(([k, x]) => v.labels[k] === x))?.value;
}

function host(hostId: string): HostRecord {
  return {
    hostId, lifecycle: { state: 'READY', epoch: 1 },
    attestation: { agentSha: 'a', apiSha: API_SHA, dockerVersion: '28', storageDriver: 'overlay2', imageRef: 'sandbox', imageDigest: 'sha256:00', bridgeVersion: 4, mismatches: [] },
    agentInstanceId: `${hostId}-1`, registeredAtMs: T0, maxMembers: 8, updatedAtMs: T0,
  };
}

/** A heartbeat as the registry records it (heartbeats live in the read model's memory). */
async function beat(hostId: string, sequence: number): Promise<void> {
  plane.fleet.recordHeartbeat({ hostId, epoch: 1, sequence, receivedAtMs: clock, usedMembers: 0, maxMembers: 8, containers: [] });
  await Promise.resolve();
}

/**
 * Runs promtool on one shipped alert (expression, `for` and labels exactly as in alerts.yaml; the
 * annotations are left out, the chart's own promtool tests check them) against the given series.
 */
async function promtoolAlertTest(alert: string, interval: string, series: { series: string; values: string }[], checks: { eval_time: string; exp_alerts: { exp_labels: Record<string, string> }[] }[]): Promise<{ code: number; out: string }> {
  const source = parse(await readFile(ALERTS, 'utf8')) as { groups: { name: string; rules: Record<string, unknown>[] }[] };
  const rules = source.groups.flatMap((g) => g.rules).filter((r) => r.alert === alert).map(({ annotations: _annotations, ...rest }) => rest);
  expect(rules, alert).toHaveLength(1);
  const rulesFile = join(scratch, `${alert}.rules.yaml`);
  const testFile = join(scratch, `${alert}.test.yaml`);
  await writeFile(rulesFile, stringify({ groups: [{ name: 'one', rules }] }));
  await writeFile(testFile, stringify({
    rule_files: [rulesFile],
    evaluation_interval: interval,
    tests: [{ interval, input_series: series, alert_rule_test: checks.map((c) => ({ alertname: alert, ...c })) }],
  }));
  return new Promise((done) => {
    execFile(toolPath('promtool'), ['test', 'rules', testFile], { cwd: scratch, timeout: 60_000 }, (err, stdout, stderr) => {
      done({ code: err === null ? 0 : typeof err.code === 'number' ? err.code : 1, out: stdout + stderr });
    });
  });
}

describe('heartbeat age (default timings: 10 s TTL, 10 s grace)', () => {
  it('keeps growing after the host is DEAD, so the missing-heartbeat alert fires; a beating host stays low', async () => {
    await plane.repos.hosts.create(Keys.host('host-silent'), host('host-silent'));
    await plane.repos.hosts.create(Keys.host('host-beating'), host('host-beating'));
    await beat('host-silent', 1);
    await beat('host-beating', 1);
    plane.liveness.reset();
    // One liveness pass per (virtual) second, as the leader runs them; a Prometheus scrape every 15 s.
    const silent: number[] = [];
    const beating: number[] = [];
    let deadAtS: number | undefined;
    for (let s = 1; s <= 240; s++) {
      clock = T0 + s * 1000;
      if (s % 2 === 0) await beat('host-beating', s);
      await plane.fleet.sync();
      await plane.liveness.tick();
      if (deadAtS === undefined && (await plane.repos.hosts.get(Keys.host('host-silent')))?.value.lifecycle.state === 'DEAD') deadAtS = s;
      if (s % 15 === 0) {
        silent.push((await gauge('sandboxfleet_host_heartbeat_age_seconds', { host: 'host-silent' }))!);
        beating.push((await gauge('sandboxfleet_host_heartbeat_age_seconds', { host: 'host-beating' }))!);
      }
    }
    expect(deadAtS, 'declared DEAD after TTL + grace').toBeGreaterThanOrEqual(20);
    expect(deadAtS).toBeLessThan(40);
    // The true age, every scrape, also long after DEAD.
    expect(silent).toEqual(Array.from({ length: 16 }, (_, i) => 15 * (i + 1)));
    expect(Math.max(...beating)).toBeLessThanOrEqual(2);

    const labels = 'instance="cp-0:9464", job="sandbox-fleet"';
    const r = await promtoolAlertTest('SandboxFleetHeartbeatMissing', '15s', [
      { series: `sandboxfleet_host_heartbeat_age_seconds{host="host-silent", ${labels}}`, values: silent.join(' ') },
      { series: `sandboxfleet_host_heartbeat_age_seconds{host="host-beating", ${labels}}`, values: beating.join(' ') },
    ], [
      { eval_time: '1m', exp_alerts: [] },
      { eval_time: '3m', exp_alerts: [{ exp_labels: { severity: 'warning', host: 'host-silent' } }] },
    ]);
    expect(r.code, r.out).toBe(0);
  });

  it('drops the series of a REMOVED host and of a host whose record is gone', async () => {
    await applyHostEvent(plane.ctx.hosts, 'host-silent', { type: 'removed' }, 'operator remove', 1);
    clock += 1000;
    await plane.fleet.sync();
      await plane.liveness.tick();
    expect(await gauge('sandboxfleet_host_heartbeat_age_seconds', { host: 'host-silent' })).toBeUndefined();
    expect(await gauge('sandboxfleet_host_heartbeat_age_seconds', { host: 'host-beating' })).toBeDefined();

    const rec = await plane.repos.hosts.get(Keys.host('host-beating'));
    await plane.repos.hosts.delete(Keys.host('host-beating'), rec!.revision);
    clock += 1000;
    await plane.fleet.sync();
      await plane.liveness.tick();
    expect(await gauge('sandboxfleet_host_heartbeat_age_seconds', { host: 'host-beating' })).toBeUndefined();
  });
});

describe('checkpoint exposure (default maximum age: 24 h)', () => {
  function group(groupId: string, lc: Partial<GroupLifecycle>, latestCheckpointId?: string): GroupRecord {
    const lifecycle: GroupLifecycle = { state: 'STOPPED', hostId: 'host-a', generation: 1, activityVersion: 2, lastActivityAtMs: clock - 30 * H, stop: { clean: true }, ...lc };
    return {
      groupId, conversationId: `conv-${groupId}`, lifecycle, members: [{ session: { memberId: 'm1', cli: 'claude_code', phase: 'RETAINED', savedLocator: 'sess-1', completedTurns: 1 } as GroupRecord['members'][number]['session'] }],
      ...(latestCheckpointId !== undefined ? { latestCheckpointId } : {}), starts: 1, stops: 1, createdAtMs: clock - 40 * H, updatedAtMs: clock,
    };
  }
  function checkpoint(groupId: string, checkpointId: string, ageMs: number): CheckpointRecord {
    return { checkpointId, groupId, placementGeneration: 1, activityVersion: 2, sourceHostId: 'host-a', sourceEpoch: 1, createdAtMs: clock - ageMs, baseImageDigest: 'sha256:00', bridgeVersion: 4, members: [{ memberId: 'm1', layerDigest: 'sha256:11', sizeBytes: 10 }], totalBytes: 10 };
  }

  it('reports the oldest restorable checkpoint of the stopped groups, those without one, and the maximum age', async () => {
    const groups = [group('g-fresh', {}, 'c-fresh'), group('g-old', {}, 'c-old'), group('g-none', {}), group('g-running', { state: 'RUNNING', stop: undefined }, 'c-running')];
    const checkpoints = [checkpoint('g-fresh', 'c-fresh', 1 * H), checkpoint('g-old', 'c-old', 20 * H), checkpoint('g-running', 'c-running', 29 * H)];
    for (const g of groups) await plane.repos.groups.create(Keys.group(g.groupId), g);
    for (const c of checkpoints) await plane.repos.checkpoints.create(Keys.checkpoint(c.groupId, c.checkpointId), c);

    const result = await collectCheckpoints(plane.ctx);
    expect(result.deleted).toEqual([]);
    expect(await gauge('sandboxfleet_checkpoint_oldest_age_seconds')).toBe(20 * 3600);
    expect(await gauge('sandboxfleet_stopped_groups_without_checkpoint')).toBe(1);
    expect(await gauge('sandboxfleet_checkpoint_max_age_seconds')).toBe(24 * 3600);

    // 20 h is below the 24 h maximum but past 80% of it: the alert must already fire.
    const labels = 'instance="cp-0:9464", job="sandbox-fleet"';
    const r = await promtoolAlertTest('SandboxFleetCheckpointStale', '1m', [
      { series: `sandboxfleet_checkpoint_oldest_age_seconds{${labels}}`, values: `${(await gauge('sandboxfleet_checkpoint_oldest_age_seconds'))!}x20` },
      { series: `sandboxfleet_checkpoint_max_age_seconds{${labels}}`, values: `${(await gauge('sandboxfleet_checkpoint_max_age_seconds'))!}x20` },
    ], [
      { eval_time: '5m', exp_alerts: [] },
      { eval_time: '15m', exp_alerts: [{ exp_labels: { severity: 'warning' } }] },
    ]);
    expect(r.code, r.out).toBe(0);

    // The stale group is restarted: nothing stopped is old any more.
    const g = await plane.repos.groups.get(Keys.group('g-old'));
    await plane.repos.groups.update(Keys.group('g-old'), { ...g!.value, lifecycle: { ...g!.value.lifecycle, state: 'RUNNING', stop: undefined } as GroupLifecycle }, g!.revision);
    await collectCheckpoints(plane.ctx);
    expect(await gauge('sandboxfleet_checkpoint_oldest_age_seconds')).toBe(1 * 3600);
  });
});
