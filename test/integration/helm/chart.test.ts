// The Helm chart (R-I5) and its alert rules (R-I4), checked with the real tools: `helm lint
// --strict`, `helm template` parsed and inspected object by object, the values schema refusing
// bad values, the embedded NATS config accepted by the pinned nats-server, and the one rule file
// both checked and unit-tested by promtool — including a wrong expectation that must fail, so
// this test can fail. The attestation policy (R-H2) is required: every render below passes one
// (POLICY) except those that check the refusal of an empty one. No Kubernetes API server here:
// test/integration/cluster/operator-day.test.ts installs, upgrades and uninstalls the chart on a
// real two-node cluster.
import { execFile, spawn } from 'node:child_process';
import { cp, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parse, parseAllDocuments } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connect, nkeyAuthenticator } from '@nats-io/transport-node';
import { natsUserEntry } from '../../../src/cli/commands.ts';
import { loadControlPlaneConfig } from '../../../src/config/control-plane.ts';
import { toolPath } from '../../../src/config/tools.ts';
import { hostPermissions } from '../../../src/core/agent-subjects.ts';
import { newNkeyUser } from '../../../src/store/nats-auth.ts';
import { FleetMetrics } from '../../../src/observability/metrics.ts';

const CHART = resolve('helm/sandbox-fleet');
const ALERTS = join(CHART, 'files/alerts.yaml');
const ALERT_TESTS = join(CHART, 'tests/alerts.test.yaml');
const PRODUCTION_VALUES = join(CHART, 'ci/production-values.yaml');
const RELEASE = 'sf';
const NAMESPACE = 'fleet';
const FULLNAME = 'sf-sandbox-fleet';
// This helm build defaults to Kubernetes v1.20 when no cluster is reachable; the chart needs ≥1.27.
const KUBE_VERSION = '1.31.0';
// An attestation policy (R-H2): without one the chart refuses to render.
const AGENT_SHA = 'a'.repeat(40);
const OTHER_AGENT_SHA = 'b'.repeat(64);
const IMAGE_ID = `sha256:${'c'.repeat(64)}`;

interface Run {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs a tool and reports its exit code instead of throwing, so refusals can be asserted. */
function run(file: string, args: readonly string[], cwd = CHART): Promise<Run> {
  return new Promise((done) => {
    execFile(file, args, { cwd, maxBuffer: 16 * 1024 * 1024, timeout: 60_000 }, (err, stdout, stderr) => {
      const code = err === null ? 0 : typeof err.code === 'number' ? err.code : 1;
      done({ code, stdout, stderr });
    });
  });
}

// Kubernetes objects are read structurally; these are the few fields the assertions touch.
type Obj = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

/** `helm template` with the test policy first, so later -f/--set override it. */
async function template(args: readonly string[] = []): Promise<Obj[]> {
  return templateWithout([...policy, ...args]);
}

async function templateWithout(args: readonly string[]): Promise<Obj[]> {
  const r = await run(helm, ['template', RELEASE, CHART, '--namespace', NAMESPACE, '--kube-version', KUBE_VERSION, ...args]);
  expect(r.stderr).toBe('');
  expect(r.code).toBe(0);
  return parseAllDocuments(r.stdout)
    .map((doc) => {
      expect(doc.errors).toEqual([]);
      return doc.toJS() as Obj | null;
    })
    .filter((o): o is Obj => o !== null);
}

function find(objects: Obj[], kind: string, name: string): Obj {
  const found = objects.find((o) => o.kind === kind && o.metadata.name === name);
  if (!found) throw new Error(`no ${kind}/${name} in ${objects.map((o) => `${o.kind}/${o.metadata.name}`).join(', ')}`);
  return found;
}

/** The one container of a pod spec (every workload of this chart has exactly one). */
function container(pod: Obj): Obj {
  const containers = pod.containers as Obj[];
  expect(containers).toHaveLength(1);
  return containers[0] as Obj;
}

function env(container: Obj): Map<string, Obj> {
  return new Map((container.env as Obj[]).map((e) => [e.name as string, e]));
}

let helm: string;
let promtool: string;
let natsServer: string;
let scratch: string;
/** `-f <policy.yaml>`: the attestation policy every render needs. */
let policy: string[];

beforeAll(async () => {
  helm = toolPath('helm');
  promtool = toolPath('promtool');
  natsServer = toolPath('nats-server');
  scratch = await mkdtemp(join(tmpdir(), 'sf-helm-'));
  const file = join(scratch, 'policy.yaml');
  await writeFile(file, `attestation:\n  allowedAgentShas: [${AGENT_SHA}, ${OTHER_AGENT_SHA}]\n  allowedImageDigests: ["${IMAGE_ID}"]\n`);
  policy = ['-f', file];
});

afterAll(async () => {
  await rm(scratch, { recursive: true, force: true });
});

describe('helm lint', () => {
  it('passes --strict with the default values plus a policy, and with the production values', async () => {
    for (const extra of [policy, ['-f', PRODUCTION_VALUES]]) {
      const r = await run(helm, ['lint', '--strict', CHART, ...extra]);
      expect(r.code, r.stdout + r.stderr).toBe(0);
      expect(r.stdout).toContain('0 chart(s) failed');
    }
  });

  it('reports the missing attestation policy of the bare defaults', async () => {
    // Lint mode only logs a template's `fail` (helm does so on purpose, for `required` values);
    // `helm template`/`install` refuse — see "values the chart refuses".
    const r = await run(helm, ['lint', '--strict', CHART]);
    expect(r.stdout + r.stderr).toContain('Fail: attestation.allowedImageDigests is empty');
  });
});

describe('helm package', () => {
  it('packages the rule file the PrometheusRule reads, and leaves the promtool tests and CI values out', async () => {
    const out = join(scratch, 'package');
    const r = await run(helm, ['package', CHART, '--destination', out]);
    expect(r.code, r.stderr).toBe(0);
    const list = await run('tar', ['-tzf', join(out, 'sandbox-fleet-0.1.0.tgz')], scratch);
    expect(list.code).toBe(0);
    const files = list.stdout.split('\n').filter(Boolean);
    expect(files).toEqual(expect.arrayContaining(['sandbox-fleet/files/alerts.yaml', 'sandbox-fleet/values.schema.json', 'sandbox-fleet/templates/NOTES.txt']));
    expect(files.filter((f) => f.startsWith('sandbox-fleet/tests/') || f.startsWith('sandbox-fleet/ci/'))).toEqual([]);
  });
});

describe('helm template with default values', () => {
  let objects: Obj[];
  beforeAll(async () => {
    objects = await template();
  });

  it('renders the expected objects and nothing behind a disabled flag', () => {
    const names = objects.map((o) => `${o.kind}/${o.metadata.name}`).sort();
    expect(names).toEqual(
      [
        'ClusterRole/fleet-sf-sandbox-fleet-node-reader',
        'ClusterRoleBinding/fleet-sf-sandbox-fleet-node-reader',
        'ConfigMap/sf-sandbox-fleet-nats',
        'DaemonSet/sf-sandbox-fleet-host-agent',
        'Deployment/sf-sandbox-fleet-control-plane',
        'Lease/sf-sandbox-fleet-leader',
        'NetworkPolicy/sf-sandbox-fleet-nats',
        'PodDisruptionBudget/sf-sandbox-fleet-control-plane',
        'Role/sf-sandbox-fleet-leader-election',
        'RoleBinding/sf-sandbox-fleet-leader-election',
        'Service/sf-sandbox-fleet-control-plane',
        'Service/sf-sandbox-fleet-host-agent',
        'Service/sf-sandbox-fleet-nats',
        'ServiceAccount/sf-sandbox-fleet-control-plane',
        'ServiceAccount/sf-sandbox-fleet-host-agent',
        'StatefulSet/sf-sandbox-fleet-nats',
      ].sort(),
    );
    for (const o of objects) {
      expect(o.metadata.labels['app.kubernetes.io/instance']).toBe(RELEASE);
      if (o.kind !== 'ClusterRole' && o.kind !== 'ClusterRoleBinding') expect(o.metadata.namespace).toBe(NAMESPACE);
    }
  });

  it('runs the control plane as ≥2 hardened, probed, spread replicas wired to NATS and mTLS', () => {
    const deploy = find(objects, 'Deployment', `${FULLNAME}-control-plane`);
    expect(deploy.spec.replicas).toBe(2);
    const pod = deploy.spec.template.spec;
    expect(pod.serviceAccountName).toBe(`${FULLNAME}-control-plane`);
    expect(pod.securityContext).toMatchObject({ runAsNonRoot: true, seccompProfile: { type: 'RuntimeDefault' } });
    expect(pod.topologySpreadConstraints[0]).toMatchObject({ topologyKey: 'kubernetes.io/hostname', maxSkew: 1 });
    expect(pod.topologySpreadConstraints[0].labelSelector.matchLabels).toEqual(deploy.spec.selector.matchLabels);

    const c = container(pod);
    expect(c.ports).toEqual([
      { name: 'grpc', containerPort: 7443, protocol: 'TCP' },
      { name: 'ops', containerPort: 9464, protocol: 'TCP' },
    ]);
    expect(c.livenessProbe.httpGet).toEqual({ path: '/healthz', port: 'ops' });
    expect(c.readinessProbe.httpGet).toEqual({ path: '/readyz', port: 'ops' });
    expect(c.securityContext).toEqual({ allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: { drop: ['ALL'] } });
    expect(c.resources.requests).toMatchObject({ cpu: '200m', memory: '256Mi' });

    const e = env(c);
    expect(e.get('SANDBOXFLEET_NATS_URL')?.value).toBe(`nats://${FULLNAME}-nats.${NAMESPACE}.svc:4222`);
    expect(e.get('SANDBOXFLEET_STORE_REPLICAS')?.value).toBe('1');
    expect(e.get('SANDBOXFLEET_HTTP_HOST')?.value).toBe('0.0.0.0');
    expect(e.get('SANDBOXFLEET_HTTP_PORT')?.value).toBe('9464');
    expect(e.get('SANDBOXFLEET_GRPC_PORT')?.value).toBe('7443');
    expect(e.get('SANDBOXFLEET_LEASE_NAME')?.value).toBe(`${FULLNAME}-leader`);
    expect(e.get('SANDBOXFLEET_POD_NAME')?.valueFrom).toEqual({ fieldRef: { fieldPath: 'metadata.name' } });
    expect(e.get('SANDBOXFLEET_TLS_RUNNER_CA_FILE')?.value).toBe('/etc/sandboxfleet/runner-ca/ca.crt');
    expect(e.get('SANDBOXFLEET_TLS_ADMIN_CA_FILE')?.value).toBe('/etc/sandboxfleet/admin-ca/ca.crt');
    expect(e.has('SANDBOXFLEET_GRPC_INSECURE')).toBe(false);
    // R-H2: the policy, in the exact form src/config/control-plane.ts parses.
    expect(e.get('SANDBOXFLEET_ALLOWED_AGENT_SHAS')?.value).toBe(`${AGENT_SHA},${OTHER_AGENT_SHA}`);
    expect(e.get('SANDBOXFLEET_ALLOWED_IMAGE_DIGESTS')?.value).toBe(IMAGE_ID);
    const config = loadControlPlaneConfig(Object.fromEntries([...e].filter(([, v]) => typeof v.value === 'string').map(([k, v]) => [k, v.value as string])));
    expect(config).toMatchObject({ allowedAgentShas: [AGENT_SHA, OTHER_AGENT_SHA], allowedImageDigests: [IMAGE_ID] });
    // The build SHA is the image's own (baked in by the Dockerfile), never the chart's word.
    expect(e.has('SANDBOXFLEET_BUILD_SHA')).toBe(false);
    const secrets = (pod.volumes as Obj[]).filter((v) => v.secret).map((v) => v.secret.secretName);
    expect(secrets).toEqual([`${FULLNAME}-grpc-tls`, `${FULLNAME}-runner-ca`, `${FULLNAME}-admin-ca`]);

    const pdb = find(objects, 'PodDisruptionBudget', `${FULLNAME}-control-plane`);
    expect(pdb.spec).toEqual({ maxUnavailable: 1, selector: { matchLabels: deploy.spec.selector.matchLabels } });

    const svc = find(objects, 'Service', `${FULLNAME}-control-plane`);
    expect(svc.spec.selector).toEqual(deploy.spec.selector.matchLabels);
    expect((svc.spec.ports as Obj[]).map((p) => [p.name, p.port, p.targetPort])).toEqual([
      ['grpc', 7443, 'grpc'],
      ['metrics', 9464, 'ops'],
    ]);
  });

  it('owns the leader Lease, empty (the control plane writes its holder), so uninstall removes it', () => {
    const lease = find(objects, 'Lease', `${FULLNAME}-leader`);
    expect(lease.apiVersion).toBe('coordination.k8s.io/v1');
    expect(lease.spec).toEqual({});
    const deploy = find(objects, 'Deployment', `${FULLNAME}-control-plane`);
    expect(env(container(deploy.spec.template.spec)).get('SANDBOXFLEET_LEASE_NAME')?.value).toBe(lease.metadata.name);
  });

  it('keeps the NATS volume claim on uninstall unless deleteOnUninstall says otherwise', async () => {
    expect(find(objects, 'StatefulSet', `${FULLNAME}-nats`).spec.persistentVolumeClaimRetentionPolicy).toBeUndefined();
    const deleting = await template(['--set', 'nats.server.storage.deleteOnUninstall=true']);
    expect(find(deleting, 'StatefulSet', `${FULLNAME}-nats`).spec.persistentVolumeClaimRetentionPolicy).toEqual({ whenDeleted: 'Delete', whenScaled: 'Retain' });
  });

  it('grants the control plane Node reads and its own Lease, nothing more', () => {
    const cr = find(objects, 'ClusterRole', `${NAMESPACE}-${FULLNAME}-node-reader`);
    expect(cr.rules).toEqual([{ apiGroups: [''], resources: ['nodes'], verbs: ['get', 'list', 'watch'] }]);
    const role = find(objects, 'Role', `${FULLNAME}-leader-election`);
    // No `create`: the chart owns the Lease (an uninstall must not see it written again).
    expect(role.rules).toEqual([
      { apiGroups: ['coordination.k8s.io'], resources: ['leases'], resourceNames: [`${FULLNAME}-leader`], verbs: ['get', 'update'] },
    ]);
    for (const binding of [find(objects, 'ClusterRoleBinding', `${NAMESPACE}-${FULLNAME}-node-reader`), find(objects, 'RoleBinding', `${FULLNAME}-leader-election`)]) {
      expect(binding.subjects).toEqual([{ kind: 'ServiceAccount', name: `${FULLNAME}-control-plane`, namespace: NAMESPACE }]);
    }
    expect(find(objects, 'ServiceAccount', `${FULLNAME}-host-agent`).automountServiceAccountToken).toBe(false);
  });

  it('runs one privileged host agent per labelled Docker node with the socket and data root mounted', () => {
    const ds = find(objects, 'DaemonSet', `${FULLNAME}-host-agent`);
    const pod = ds.spec.template.spec;
    expect(pod.nodeSelector).toEqual({ 'sandbox-fleet.io/docker-host': 'true' });
    expect(pod.automountServiceAccountToken).toBe(false);
    const c = container(pod);
    expect(c.securityContext).toMatchObject({ privileged: true, readOnlyRootFilesystem: true });
    expect(env(c).get('SANDBOXFLEET_HOST_ID')?.valueFrom).toEqual({ fieldRef: { fieldPath: 'spec.nodeName' } });
    expect(env(c).get('SANDBOXFLEET_IMAGE_REF')?.value).toBe('sandbox-fleet/sandbox:0.1.0');
    // The agent reports the SHA baked into its image; the chart never overrides it.
    expect(env(c).has('SANDBOXFLEET_BUILD_SHA')).toBe(false);
    expect(env(c).has('SANDBOXFLEET_AGENT_SHA')).toBe(false);
    const volumes = new Map((pod.volumes as Obj[]).map((v) => [v.name as string, v]));
    expect(volumes.get('docker-socket')?.hostPath).toEqual({ path: '/var/run/docker.sock', type: 'Socket' });
    expect(volumes.get('docker-data')?.hostPath).toEqual({ path: '/var/lib/docker', type: 'Directory' });
    const mounts = new Map((c.volumeMounts as Obj[]).map((m) => [m.name as string, m.mountPath as string]));
    // Same path inside as on the host: the engine reports upper dirs as host paths.
    expect(mounts.get('docker-data')).toBe('/var/lib/docker');
    expect(mounts.get('docker-socket')).toBe('/var/run/docker.sock');
    // Exec'd member processes are signalled by their host pid: the node's PID namespace.
    expect(pod.hostPID).toBe(true);
    // The restore chunk cache outlives the pod, on the node.
    expect(volumes.get('layer-cache')?.hostPath).toEqual({ path: '/var/lib/sandboxfleet/chunk-cache', type: 'DirectoryOrCreate' });
    expect(mounts.get('layer-cache')).toBe('/var/lib/sandboxfleet/chunk-cache');
    expect(env(c).get('SANDBOXFLEET_LAYER_CACHE_DIR')?.value).toBe('/var/lib/sandboxfleet/chunk-cache');
    expect(env(c).has('SANDBOXFLEET_LAYER_CACHE_MAX_BYTES')).toBe(false);
    expect(c.livenessProbe.httpGet).toEqual({ path: '/healthz', port: 'ops' });
    expect(c.readinessProbe.httpGet).toEqual({ path: '/readyz', port: 'ops' });
  });

  it('ships an embedded NATS config that the pinned nats-server accepts', async () => {
    const cm = find(objects, 'ConfigMap', `${FULLNAME}-nats`);
    const conf = cm.data['nats.conf'] as string;
    expect(conf).toMatch(/sync_interval: always/);
    const file = join(scratch, 'nats.conf');
    await writeFile(file, conf);
    const r = await run(natsServer, ['-t', '-c', file]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr + r.stdout).toContain('is valid');
    const sts = find(objects, 'StatefulSet', `${FULLNAME}-nats`);
    expect(sts.spec.replicas).toBe(1);
    expect(sts.spec.template.spec.containers[0].securityContext.readOnlyRootFilesystem).toBe(true);
  });
});

describe('helm template with NATS users (R-I2, R-R5)', () => {
  it('renders users that a real nats-server enforces: no credential refused, a host limited to its own subjects, the control plane unrestricted', async () => {
    const cp = newNkeyUser();
    const hostA = newNkeyUser();
    const users = [{ nkey: cp.publicKey }, natsUserEntry(hostA.publicKey, hostPermissions('host-a'))];
    const valuesFile = join(scratch, 'auth-values.json');
    await writeFile(valuesFile, JSON.stringify({ controlPlane: { natsCredentialsSecret: 'cp-nats-creds' }, nats: { server: { authorization: { users } } } }));
    const objects = await template(['-f', valuesFile]);
    const policy = find(objects, 'NetworkPolicy', `${FULLNAME}-nats`);
    expect(policy.spec.ingress[0].ports).toEqual([{ port: 4222, protocol: 'TCP' }]);
    // The rendered config, with the pod's paths and ports replaced by this machine's.
    const port = 14000 + Math.floor(Math.random() * 2000);
    const conf = (find(objects, 'ConfigMap', `${FULLNAME}-nats`).data['nats.conf'] as string)
      .replace('port: 4222', `port: ${port}`).replace('http_port: 8222', 'http_port: -1')
      .replace('store_dir: /data', `store_dir: ${join(scratch, 'auth-js')}`).replace('pid_file: /tmp/nats.pid', `pid_file: ${join(scratch, 'auth.pid')}`);
    const file = join(scratch, 'auth-nats.conf');
    await writeFile(file, conf);
    const server = spawn(natsServer, ['-c', file, '-a', '127.0.0.1'], { stdio: ['ignore', 'ignore', 'pipe'] });
    let serverLog = '';
    server.stderr.on('data', (d: Buffer) => { serverLog += d.toString(); });
    try {
      const url = `nats://127.0.0.1:${port}`;
      const connectAs = async (seed?: Uint8Array) => {
        for (let i = 0; ; i++) {
          try {
            return await connect({ servers: url, timeout: 2_000, ...(seed !== undefined ? { authenticator: nkeyAuthenticator(seed) } : {}) });
          } catch (err) {
            if (i > 40 || !/connection refused|ECONNREFUSED/i.test(String(err))) throw new Error(`${String(err)}; nats-server said: ${serverLog.slice(-2000)}`);
            await new Promise((r) => setTimeout(r, 250));
          }
        }
      };
      const cpConn = await connectAs(new TextEncoder().encode(cp.seed));
      await expect(connectAs()).rejects.toThrow(/authorization/i);
      const hostConn = await connectAs(new TextEncoder().encode(hostA.seed));
      try {
        // Allowed: its own heartbeat subject, seen by the control plane.
        const sub = cpConn.subscribe('sf.host.host-a.heartbeat', { max: 1 });
        await cpConn.flush();
        hostConn.publish('sf.host.host-a.heartbeat', 'beat');
        for await (const m of sub) expect(m.string()).toBe('beat');
        // Refused: another host's commands.
        const errors: string[] = [];
        void (async () => { for await (const st of hostConn.status()) if (st.type === 'error') errors.push(String(st.error)); })();
        hostConn.subscribe('sf.host.host-b.cmd');
        await hostConn.flush();
        await new Promise((r) => setTimeout(r, 300));
        expect(errors.join(' ')).toMatch(/Permissions Violation for Subscription to "sf\.host\.host-b\.cmd"/);
      } finally {
        await Promise.allSettled([cpConn.close(), hostConn.close()]);
      }
    } finally {
      server.kill('SIGTERM');
    }
  });
});

describe('helm template with alerts and ServiceMonitor enabled', () => {
  let objects: Obj[];
  beforeAll(async () => {
    objects = await template(['--set', 'alerts.enabled=true', '--set', 'metrics.serviceMonitor.enabled=true']);
  });

  it('ships files/alerts.yaml unchanged as the PrometheusRule, labelled for kube-prometheus-stack', async () => {
    const rule = find(objects, 'PrometheusRule', `${FULLNAME}-alerts`);
    expect(rule.apiVersion).toBe('monitoring.coreos.com/v1');
    expect(rule.metadata.labels.release).toBe('kube-prometheus-stack');
    const source = parse(await readFile(ALERTS, 'utf8')) as Obj;
    expect(rule.spec.groups).toEqual(source.groups);
    const alerts = (rule.spec.groups as Obj[]).flatMap((g) => (g.rules as Obj[]).map((r) => r.alert as string));
    expect(alerts).toEqual(expect.arrayContaining(['SandboxFleetSessionsLost', 'SandboxFleetHostsUnattested', 'SandboxFleetCheckpointStale', 'SandboxFleetHeartbeatMissing', 'SandboxFleetCheckpointGcStarved']));
    for (const r of (rule.spec.groups as Obj[]).flatMap((g) => g.rules as Obj[])) {
      expect(Object.keys(r.annotations).sort()).toEqual(['description', 'runbook', 'summary']);
      expect(['critical', 'warning']).toContain(r.labels.severity);
    }
  });

  it('scrapes the control plane and agent metrics ports through matching Services', () => {
    for (const component of ['control-plane', 'host-agent']) {
      const sm = find(objects, 'ServiceMonitor', `${FULLNAME}-${component}`);
      expect(sm.metadata.labels.release).toBe('kube-prometheus-stack');
      const svc = find(objects, 'Service', `${FULLNAME}-${component}`);
      expect(svc.metadata.labels).toMatchObject(sm.spec.selector.matchLabels);
      expect(sm.spec.namespaceSelector).toEqual({ matchNames: [NAMESPACE] });
      expect(sm.spec.endpoints[0]).toMatchObject({ port: 'metrics', path: '/metrics' });
      expect((svc.spec.ports as Obj[]).some((p) => p.name === 'metrics')).toBe(true);
    }
  });

  it('takes the Prometheus selector label from values', async () => {
    const custom = await template(['--set', 'alerts.enabled=true', '--set', 'alerts.labels.release=monitoring', '--set', 'metrics.serviceMonitor.enabled=true', '--set', 'metrics.serviceMonitor.labels.release=monitoring']);
    expect(find(custom, 'PrometheusRule', `${FULLNAME}-alerts`).metadata.labels.release).toBe('monitoring');
    expect(find(custom, 'ServiceMonitor', `${FULLNAME}-control-plane`).metadata.labels.release).toBe('monitoring');
  });
});

describe('Grafana dashboard', () => {
  const DASHBOARD = join(CHART, 'files/dashboard.json');

  it('ships files/dashboard.json unchanged in a ConfigMap with the sidecar label, only when enabled', async () => {
    expect((await template()).some((o) => o.kind === 'ConfigMap' && o.metadata.name === `${FULLNAME}-dashboard`)).toBe(false);
    const objects = await template(['--set', 'grafana.dashboard.enabled=true', '--set', 'grafana.dashboard.annotations.grafana_folder=Fleet']);
    const cm = find(objects, 'ConfigMap', `${FULLNAME}-dashboard`);
    expect(cm.metadata.labels.grafana_dashboard).toBe('1');
    expect(cm.metadata.annotations).toEqual({ grafana_folder: 'Fleet' });
    expect(JSON.parse(cm.data['sandbox-fleet.json'] as string)).toEqual(JSON.parse(await readFile(DASHBOARD, 'utf8')));
  });

  it('queries only metrics and labels of the catalogue, in valid PromQL, for every panel the issue names', async () => {
    const dashboard = JSON.parse(await readFile(DASHBOARD, 'utf8')) as Obj;
    const exprs = (dashboard.panels as Obj[]).flatMap((p) => (p.targets as Obj[]).map((t) => ({ panel: p.title as string, expr: t.expr as string })));
    // prom-client's metric objects carry their label names.
    const catalogue = new Map(new FleetMetrics().registry.getMetricsAsArray().map((m) => [(m as Obj).name as string, (m as Obj).labelNames as string[]]));
    const used = new Set<string>();
    for (const { panel, expr } of exprs) {
      const where = `${panel}: ${expr}`;
      const names = [...expr.matchAll(/\b(sandboxfleet_[a-z0-9_]+)/g)].map((m) => m[1]!.replace(/_(bucket|sum|count)$/, ''));
      expect(names.length, where).toBeGreaterThan(0);
      for (const name of names) {
        used.add(name);
        expect(catalogue.has(name), `${where}: ${name} is not exported`).toBe(true);
        const labels = new Set<string>(catalogue.get(name) ?? []);
        if (/_bucket\b/.test(expr)) labels.add('le');
        for (const m of expr.matchAll(/\bby\s*\(([^)]*)\)/g)) {
          for (const label of m[1]!.split(',').map((l) => l.trim()).filter(Boolean)) expect(labels.has(label), `${where}: ${name} has no label ${label}`).toBe(true);
        }
      }
    }
    // Context states per turn, LOST by reason, checkpoint age and size, migrations and their
    // duration, heartbeat age per host, unprotected groups.
    for (const name of ['sandboxfleet_turns_total', 'sandboxfleet_lost_sessions_total', 'sandboxfleet_checkpoint_oldest_age_seconds', 'sandboxfleet_checkpoint_bytes_total',
      'sandboxfleet_migrations_total', 'sandboxfleet_migration_duration_seconds', 'sandboxfleet_host_heartbeat_age_seconds', 'sandboxfleet_unprotected_groups']) expect(used, name).toContain(name);
    // promtool parses every query (Grafana's range variables given a value) as a recording rule.
    const rules = { groups: [{ name: 'dashboard', rules: exprs.map(({ expr }, i) => ({ record: `dashboard:query_${i}`, expr: expr.replaceAll('$__rate_interval', '1m').replaceAll('$__range', '1h') })) }] };
    const file = join(scratch, 'dashboard-rules.yaml');
    await writeFile(file, JSON.stringify(rules));
    const r = await run(promtool, ['check', 'rules', file]);
    expect(r.code, r.stdout + r.stderr).toBe(0);
    expect(r.stdout).toContain(`SUCCESS: ${exprs.length} rules found`);
  });
});

describe('helm template with the production values', () => {
  it('uses the external NATS cluster with 3 store replicas, pinned digests and per-node credentials', async () => {
    const objects = await template(['-f', PRODUCTION_VALUES]);
    expect(objects.some((o) => o.kind === 'StatefulSet')).toBe(false);
    const deploy = find(objects, 'Deployment', `${FULLNAME}-control-plane`);
    expect(deploy.spec.replicas).toBe(3);
    const cp = container(deploy.spec.template.spec);
    expect(cp.image).toBe('registry.example.com/sandbox-fleet/control-plane@sha256:' + '1'.repeat(64));
    expect(env(cp).get('SANDBOXFLEET_NATS_URL')?.value).toBe('nats://nats.nats.svc:4222');
    expect(env(cp).get('SANDBOXFLEET_STORE_REPLICAS')?.value).toBe('3');
    expect(env(cp).get('SANDBOXFLEET_NATS_CREDS')?.value).toBe('/etc/sandboxfleet/nats-creds/creds');
    expect(env(cp).get('SANDBOXFLEET_NATS_CA')?.value).toBe('/etc/sandboxfleet/nats-ca/ca.crt');
    expect(env(cp).get('SANDBOXFLEET_ALLOWED_AGENT_SHAS')?.value).toBe('4'.repeat(40));
    expect(env(cp).get('SANDBOXFLEET_ALLOWED_IMAGE_DIGESTS')?.value).toBe('sha256:' + '3'.repeat(64));

    const agent = container(find(objects, 'DaemonSet', `${FULLNAME}-host-agent`).spec.template.spec);
    // Agents administer no stream (R-R5): replicas are the control plane's setting only.
    expect(env(agent).has('SANDBOXFLEET_STORE_REPLICAS')).toBe(false);
    expect(env(agent).get('SANDBOXFLEET_NATS_CREDS')?.value).toBe('/etc/sandboxfleet/nats-creds/host.creds');
    expect(env(agent).get('SANDBOXFLEET_IMAGE_ID')?.value).toBe('sha256:' + '3'.repeat(64));
    expect(objects.some((o) => o.kind === 'PrometheusRule')).toBe(true);
  });
});

describe('values the chart refuses', () => {
  async function refused(args: readonly string[], withPolicy = true): Promise<string> {
    const r = await run(helm, ['template', RELEASE, CHART, '--kube-version', KUBE_VERSION, ...(withPolicy ? policy : []), ...args]);
    expect(r.code).not.toBe(0);
    expect(r.stdout).toBe('');
    return r.stderr;
  }

  async function valuesFile(name: string, body: string): Promise<string> {
    const file = join(scratch, name);
    await writeFile(file, body);
    return file;
  }

  it('refuses a single control-plane replica unless allowSingleReplica is set', async () => {
    const stderr = await refused(['-f', await valuesFile('single.yaml', 'controlPlane:\n  replicas: 1\n')]);
    expect(stderr).toMatch(/at '\/controlPlane\/replicas': minimum: got 1, want 2/);
    const ok = await template(['--set', 'controlPlane.replicas=1', '--set', 'controlPlane.allowSingleReplica=true']);
    expect(find(ok, 'Deployment', `${FULLNAME}-control-plane`).spec.replicas).toBe(1);
    const lint = await run(helm, ['lint', '--strict', CHART, '--set', 'controlPlane.replicas=1']);
    expect(lint.code).not.toBe(0);
  });

  it('refuses unknown keys at every level it defines', async () => {
    expect(await refused(['-f', await valuesFile('typo.yaml', 'controlPlane:\n  replicaz: 3\n')])).toMatch(/at '\/controlPlane': additional properties 'replicaz' not allowed/);
    expect(await refused(['--set', 'metricz.enabled=true'])).toMatch(/additional properties 'metricz' not allowed/);
    expect(await refused(['--set', 'hostAgent.docker.socket=/x'])).toMatch(/at '\/hostAgent\/docker': additional properties 'socket' not allowed/);
  });

  it('refuses malformed values', async () => {
    expect(await refused(['--set', 'nats.embedded=false', '--set', 'nats.external.url=http://nats:4222'])).toMatch(/\/nats\/external\/url/);
    expect(await refused(['--set', 'hostAgent.sandboxImage.id=latest'])).toMatch(/\/hostAgent\/sandboxImage\/id/);
    expect(await refused(['--set', 'controlPlane.grpcPort=70000'])).toMatch(/\/controlPlane\/grpcPort/);
  });

  it('refuses an empty attestation policy (no host could become READY) with a message that says what to set', async () => {
    const digests = `attestation.allowedImageDigests={${IMAGE_ID}}`;
    const shas = `attestation.allowedAgentShas={${AGENT_SHA}}`;
    expect(await refused([], false)).toMatch(/attestation\.allowedImageDigests is empty, so no host could ever become READY .*attestation\.allowEmptyPolicy=true/);
    expect(await refused(['--set', shas], false)).toContain('attestation.allowedImageDigests is empty');
    expect(await refused(['--set', digests], false)).toMatch(/attestation\.allowedAgentShas is empty: list the exact git SHA/);
    // A pinned sandbox image the policy refuses would leave every chart-managed host UNATTESTED.
    expect(await refused(['--set', `hostAgent.sandboxImage.id=sha256:${'d'.repeat(64)}`])).toContain(`hostAgent.sandboxImage.id sha256:${'d'.repeat(64)} is not in attestation.allowedImageDigests`);
    // Malformed entries are refused by the schema.
    expect(await refused(['--set', 'attestation.allowedAgentShas={deadbeef}'], false)).toMatch(/\/attestation\/allowedAgentShas\/0/);
    expect(await refused(['--set', `attestation.allowedImageDigests={${'c'.repeat(64)}}`], false)).toMatch(/\/attestation\/allowedImageDigests\/0/);
  });

  it('renders an empty policy only when allowEmptyPolicy says so', async () => {
    const objects = await templateWithout(['--set', 'attestation.allowEmptyPolicy=true']);
    const e = env(container(find(objects, 'Deployment', `${FULLNAME}-control-plane`).spec.template.spec));
    expect(e.get('SANDBOXFLEET_ALLOWED_AGENT_SHAS')?.value).toBe('');
    expect(e.get('SANDBOXFLEET_ALLOWED_IMAGE_DIGESTS')?.value).toBe('');
  });

  it('refuses inconsistent NATS wiring with a message that says what to do', async () => {
    expect(await refused(['--set', 'nats.embedded=false'])).toContain('nats.external.url is required when nats.embedded is false');
    expect(await refused(['--set', 'store.replicas=3'])).toContain('store.replicas=3 needs a replicated NATS cluster');
    expect(await refused(['--set', 'nats.external.url=nats://n:4222'])).toContain('nats.external.url is set but nats.embedded is true');
    expect(await refused(['--set', 'hostAgent.natsCredentialsHostPath=/etc/n/c.creds', '--set', 'hostAgent.natsCredentialsSecret=s'])).toContain('are exclusive');
  });
});

describe('NOTES.txt', () => {
  // helm renders NOTES only on install (which needs a cluster); a scratch copy of the chart
  // renders the same text through a ConfigMap so its branches can be read here.
  async function notes(args: readonly string[], withPolicy = true): Promise<string> {
    const copy = join(scratch, `notes-${args.length}`);
    await cp(CHART, copy, { recursive: true });
    await cp(join(copy, 'templates/NOTES.txt'), join(copy, 'files/notes.txt'));
    await writeFile(join(copy, 'templates/notes-probe.yaml'), 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: {{ tpl (.Files.Get "files/notes.txt") . | quote }}\n');
    const r = await run(helm, ['template', RELEASE, copy, '--kube-version', KUBE_VERSION, '--show-only', 'templates/notes-probe.yaml', ...(withPolicy ? policy : []), ...args]);
    expect(r.code, r.stderr).toBe(0);
    return (parse(r.stdout) as Obj).data.notes as string;
  }

  it('warns about the single-node NATS and names the mTLS Secrets to create', async () => {
    const text = await notes([]);
    expect(text).toContain('WARNING: NATS runs in-chart as ONE node');
    expect(text).toContain(`${FULLNAME}-grpc-tls`);
    expect(text).toContain('set alerts.enabled=true');
    const production = await notes(['-f', PRODUCTION_VALUES]);
    expect(production).not.toContain('WARNING');
    expect(production).toContain('sandbox-fleet-runner-ca');
    expect(production).toContain(`Attestation (R-H2): hosts are admitted with agent build(s) ${'4'.repeat(40)}`);
  });

  it('warns that no host becomes READY when installed with an empty policy on purpose', async () => {
    const text = await notes(['--set', 'attestation.allowEmptyPolicy=true'], false);
    expect(text).toContain('WARNING: installed with an empty attestation policy (attestation.allowEmptyPolicy=true).\nNo sandbox image id is allowed (attestation.allowedImageDigests): NO host becomes READY.');
    expect(text).toMatch(/only agents of the control plane's own\s+build SHA are allowed/);
  });
});

describe('alert rules under promtool', () => {
  it('are a valid rule file', async () => {
    const r = await run(promtool, ['check', 'rules', ALERTS]);
    expect(r.code, r.stdout + r.stderr).toBe(0);
    // Every rule of the file was read (none lost to an indentation slip).
    const rules = ((parse(await readFile(ALERTS, 'utf8')) as Obj).groups as Obj[]).flatMap((g) => g.rules as Obj[]);
    expect(rules.length).toBeGreaterThanOrEqual(9);
    expect(r.stdout).toContain(`SUCCESS: ${rules.length} rules found`);
  });

  it('use only metric names of the R-I3 catalogue', async () => {
    const catalogue = new Set((await new FleetMetrics().registry.getMetricsAsJSON()).map((m) => m.name));
    const source = parse(await readFile(ALERTS, 'utf8')) as Obj;
    const exprs = (source.groups as Obj[]).flatMap((g) => (g.rules as Obj[]).map((r) => r.expr as string));
    const used = new Set(exprs.flatMap((e) => e.match(/sandboxfleet_[a-z_]+/g) ?? []));
    expect(used.size).toBeGreaterThanOrEqual(6);
    for (const name of used) expect(catalogue, name).toContain(name);
  });

  it('pass their unit tests (each alert fires and stays silent where it should)', async () => {
    const r = await run(promtool, ['test', 'rules', ALERT_TESTS]);
    expect(r.code, r.stdout + r.stderr).toBe(0);
    expect(r.stdout).toContain('SUCCESS');
  });

  it('fail the unit tests when an expectation is wrong', async () => {
    const original = await readFile(ALERT_TESTS, 'utf8');
    const wrong = original.replace('rule_files:\n  - ../files/alerts.yaml', `rule_files:\n  - ${ALERTS}`).replace('reason: host_lost_running', 'reason: no_checkpoint');
    expect(wrong).not.toBe(original);
    const file = join(scratch, 'wrong.test.yaml');
    await writeFile(file, wrong);
    const r = await run(promtool, ['test', 'rules', file], scratch);
    expect(r.code).not.toBe(0);
    expect(r.stdout + r.stderr).toMatch(/FAILED:[\s\S]*SandboxFleetSessionsLost/);
  });
});
