// `npm start` on embedded defaults: the control plane launches its own nats-server (JetStream,
// data under the state dir), opens the store and serves /healthz, /readyz and /metrics.
// Runs the real entry point as a child process, exactly as scripts/start does (with plaintext gRPC
// on loopback, SANDBOXFLEET_GRPC_INSECURE=1, as `npm start` sets it; without TLS files or that
// flag the process refuses to start, R-R5).
// Its /metrics is also where the alert rules (R-I4) are checked against the metric names and
// labels the code really exports, with a host registered over NATS as an agent would.
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import * as grpc from '@grpc/grpc-js';
import { connect } from '@nats-io/transport-node';
import { parse } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { toolPath } from '../../../src/config/tools.ts';
import { AgentSubjects } from '../../../src/core/agent-subjects.ts';
import { LOST_SESSION_REASONS } from '../../../src/core/loss.ts';
import { AdminServiceClient, ListHostsRequest, type ListHostsResponse } from '../../../src/gen/sandboxfleet/v1/admin.ts';
import { Heartbeat, Registration, RegistrationAck } from '../../../src/gen/sandboxfleet/v1/agent.ts';
import { API_SHA } from '../../../src/gen/api-sha.ts';

let child: ChildProcess;
let stateDir: string;
let opsUrl: string;
let grpcAddress: string;
let natsUrl: string;

beforeAll(async () => {
  stateDir = await mkdtemp(join(tmpdir(), 'sf-cp-'));
  child = spawn(process.execPath, ['--import', 'tsx', 'cmd/control-plane/main.ts'], {
    env: { ...process.env, SANDBOXFLEET_STATE_DIR: stateDir, SANDBOXFLEET_HTTP_PORT: '0', SANDBOXFLEET_NATS_URL: '', SANDBOXFLEET_GRPC_INSECURE: '1', SANDBOXFLEET_GRPC_HOST: '127.0.0.1', SANDBOXFLEET_GRPC_PORT: '0' },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  opsUrl = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('control plane did not become ready in 60 s')), 60_000);
    child.once('exit', (code) => reject(new Error(`control plane exited early with code ${code}`)));
    createInterface({ input: child.stdout! }).on('line', (line) => {
      const entry = JSON.parse(line) as { msg?: string; ops?: string; grpc?: string; nats?: string };
      if (entry.msg === 'control plane ready' && entry.ops) {
        clearTimeout(timer);
        grpcAddress = entry.grpc ?? '';
        natsUrl = entry.nats ?? '';
        resolve(entry.ops);
      }
    });
  });
});

afterAll(async () => {
  if (child.exitCode === null) {
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGTERM');
    await exited;
  }
  await rm(stateDir, { recursive: true, force: true });
});

describe('control plane on embedded defaults', () => {
  it('serves health, readiness and the sandboxfleet metric catalogue', async () => {
    expect((await fetch(`${opsUrl}/healthz`)).status).toBe(200);
    expect((await fetch(`${opsUrl}/readyz`)).status).toBe(200);
    const metrics = await (await fetch(`${opsUrl}/metrics`)).text();
    expect(metrics).toContain('sandboxfleet_lost_sessions_total');
    expect(metrics).toContain('sandboxfleet_attestation_refusals_total');
    expect((await fetch(`${opsUrl}/nope`)).status).toBe(404);
  });

  it('serves gRPC on the loopback address it logged', async () => {
    expect(grpcAddress).toMatch(/^127\.0\.0\.1:\d+$/);
    const client = new AdminServiceClient(grpcAddress, grpc.credentials.createInsecure());
    const hosts = await new Promise<ListHostsResponse>((resolve, reject) =>
      client.listHosts(ListHostsRequest.fromPartial({}), (err, res) => (err ? reject(err) : resolve(res))),
    );
    expect(hosts.hosts).toEqual([]);
    client.close();
  });

  it('exports every metric, label and label value its alert rules use, and lints clean under promtool', async () => {
    // A host registers as an agent would (with a build SHA the policy does not know: UNATTESTED,
    // one attestation refusal), heartbeats, and sends one heartbeat of a wrong epoch (fenced).
    const nc = await connect({ servers: natsUrl, name: 'fake-agent' });
    try {
      const reg = Registration.fromPartial({
        hostId: 'probe-host', agentInstanceId: 'probe-1', sentAtUnixMs: Date.now(), capacity: { maxMembers: 1 },
        attestation: { agentBuildSha: 'not-a-released-build', apiSha: API_SHA, engineVersion: '28.0.0', storageDriver: 'overlay2', imageRef: 'sandbox:test', imageDigest: 'sha256:00' },
      });
      const ack = RegistrationAck.decode((await nc.request(AgentSubjects.register, Registration.encode(reg).finish(), { timeout: 15_000 })).data);
      expect(ack.admitted).toBe(false);
      const hb = (hostEpoch: number, sequence: number) => Heartbeat.encode(Heartbeat.fromPartial({ hostId: 'probe-host', hostEpoch, sequence, sentAtUnixMs: Date.now() })).finish();
      nc.publish(AgentSubjects.heartbeat('probe-host'), hb(ack.hostEpoch, 1));
      nc.publish(AgentSubjects.heartbeat('probe-host'), hb(ack.hostEpoch + 7, 1));
      await nc.flush();
    } finally {
      await nc.close();
    }
    // The leader's passes set its gauges (the checkpoint maximum age comes from the retention pass).
    const wanted = [
      'sandboxfleet_host_heartbeat_age_seconds{host="probe-host"}', 'sandboxfleet_fenced_reports_total{kind="heartbeat"} 1', 'sandboxfleet_hosts{state="UNATTESTED"} 1',
      'sandboxfleet_checkpoint_max_age_seconds 86400',
    ];
    let text = '';
    for (const end = Date.now() + 30_000; Date.now() < end; await new Promise((r) => setTimeout(r, 250))) {
      text = await (await fetch(`${opsUrl}/metrics`)).text();
      if (wanted.every((w) => text.includes(w))) break;
    }
    for (const w of wanted) expect(text, w).toContain(w);
    const scraped = parseExposition(text);

    // Every LOST reason exists at 0 before any loss (the LOST alert uses increase()).
    for (const reason of LOST_SESSION_REASONS) expect(scraped.some((s) => s.name === 'sandboxfleet_lost_sessions_total' && s.labels.reason === reason), reason).toBe(true);

    const rules = (parse(await readFile(resolve('helm/sandbox-fleet/files/alerts.yaml'), 'utf8')) as { groups: { rules: AlertRule[] }[] }).groups.flatMap((g) => g.rules);
    expect(rules.length).toBeGreaterThanOrEqual(8);
    const used = new Set<string>();
    for (const rule of rules) {
      const where = `${rule.alert}: ${rule.expr}`;
      // The check below understands selectors, `by (...)` and $labels; anything else needs a look.
      expect(rule.expr, where).not.toMatch(/\b(without|on|ignoring|group_left|group_right)\s*\(/);
      const byLabels = [...rule.expr.matchAll(/\bby\s*\(([^)]*)\)/g)].flatMap((m) => m[1]!.split(',').map((l) => l.trim()).filter(Boolean));
      const selectors = [...rule.expr.matchAll(/\b(sandboxfleet_[a-z0-9_]+)\s*(?:\{([^}]*)\})?/g)];
      expect(selectors.length, where).toBeGreaterThan(0);
      for (const [, name, matchers] of selectors) {
        used.add(name!);
        const series = scraped.filter((s) => s.name === name);
        expect(series.length, `${where}: ${name} is not exported`).toBeGreaterThan(0);
        for (const [, label, op, value] of (matchers ?? '').matchAll(/(\w+)\s*(=~|!=|!~|=)\s*"([^"]*)"/g)) {
          if (op === '=') expect(series.some((s) => s.labels[label!] === value), `${where}: no ${name}{${label}="${value}"}`).toBe(true);
          else expect(series.some((s) => label! in s.labels), `${where}: ${name} has no label ${label}`).toBe(true);
        }
        for (const label of byLabels) expect(series.every((s) => label in s.labels), `${where}: ${name} has no label ${label} to group by`).toBe(true);
      }
      // Labels the annotations print must survive the aggregation.
      const printed = [...JSON.stringify(rule.annotations ?? {}).matchAll(/\$labels\.(\w+)/g)].map((m) => m[1]!);
      for (const label of printed) expect([...byLabels, ...Object.keys(rule.labels ?? {})], `${where}: prints $labels.${label}`).toContain(label);
    }
    expect(used.size).toBeGreaterThanOrEqual(9);

    // promtool parses and lints the exposition (prom-client's own nodejs_* defaults excluded: their
    // names are not ours to choose).
    const ours = text.split('\n').filter((l) => !l.includes('sandboxfleet_process_')).join('\n');
    const lint = await new Promise<{ code: number; out: string }>((done) => {
      const child = execFile(toolPath('promtool'), ['check', 'metrics'], { timeout: 30_000 }, (err, stdout, stderr) => done({ code: err === null ? 0 : 1, out: stdout + stderr }));
      child.stdin!.end(ours);
    });
    expect(lint.code, lint.out).toBe(0);
  });

  it('shuts down cleanly on SIGTERM, stopping its nats-server', async () => {
    const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
    child.kill('SIGTERM');
    expect(await exited).toBe(0);
  });
});

interface AlertRule {
  readonly alert: string;
  readonly expr: string;
  readonly labels?: Record<string, string>;
  readonly annotations?: Record<string, string>;
}

/** Samples of a Prometheus text exposition: metric name and labels (values are not needed here). */
function parseExposition(text: string): { name: string; labels: Record<string, string> }[] {
  const out: { name: string; labels: Record<string, string> }[] = [];
  for (const line of text.split('\n')) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+\S+$/.exec(line);
    if (m === null) continue;
    const labels: Record<string, string> = {};
    for (const [, k, v] of (m[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[k!] = v!;
    out.push({ name: m[1]!, labels });
  }
  return out;
}
