// The operator's day on a real Kubernetes cluster (R-I5, R-H5, R-I4): a two-node cluster started on
// this machine (test/support/kube-cluster.ts, scripts/test-cluster: kubelets, containerd, CoreDNS,
// kube-proxy, a dockerd per node), the images built here from the checkout and imported into each
// node (test/support/cluster-images.ts), the sandbox image loaded into each node's Docker, and then,
// as an operator would: `helm install` of helm/sandbox-fleet with ci/test-cluster-values.yaml (every
// pod Ready, the Lease held, PrometheusRule/ServiceMonitor accepted by their published CRDs);
// `kubectl sandbox hosts/groups/verify`; conversations through the runner API over `kubectl
// port-forward`; `kubectl cordon` + `kubectl drain` of node-b moves its groups to node-a with their
// sessions (the next turn is RESTORED and finds the session file); node-b crashes (kubelet and agent
// killed), its agent pod and Node object are deleted, and the group that was running there is LOST
// with a reason; Debian's Prometheus, scraping what the chart's ServiceMonitor selects and
// evaluating the chart's rule file, fires SandboxFleetSessionsLost at once with the promised labels
// and runbook, and SandboxFleetHeartbeatMissing goes pending, then firing, and resolves once the host
// is removed; every query of the chart's Grafana dashboard returns data; `helm upgrade` applies a
// changed value and `helm uninstall` leaves nothing behind.
//
// No address outside this machine is contacted: the cluster lives in a network namespace with no
// route out (scripts/test-cluster explains), images are imported (pullPolicy Never), and every
// connection from this process goes to 127.0.0.1 (tunnels, port-forwards) or to unix sockets.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import Docker from 'dockerode';
import { parse } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { toolsDir } from '../../../src/config/tools.ts';
import { ContextState, GroupState } from '../../../src/gen/sandboxfleet/v1/common.ts';
import { RunnerClient } from '../../../src/runner-sdk/index.ts';
import { buildClusterImages, importIntoContainerd, REPO_ROOT, type ClusterImages } from '../../support/cluster-images.ts';
import { successEvidence } from '../../support/evidence.ts';
import { run, startTestCluster, type Run, type TestCluster } from '../../support/kube-cluster.ts';
import { nativeSessionPath } from '../../support/native-session.ts';
import { provisionSandboxImage, type SandboxImage } from '../../support/sandbox-image.ts';

const CHART = resolve(REPO_ROOT, 'helm/sandbox-fleet');
const VALUES = join(CHART, 'ci/test-cluster-values.yaml');
const NS = 'fleet';
const RELEASE = 'sf';
const FULLNAME = 'sf-sandbox-fleet';
const CRDS = ['monitoring.coreos.com_prometheusrules.yaml', 'monitoring.coreos.com_servicemonitors.yaml'];

// Kubernetes objects are read structurally; these are the few fields the assertions touch.
type Obj = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

let cluster: TestCluster;
let images: ClusterImages;
let sandbox: SandboxImage;
let scratch: string;
let runner: RunnerClient;
let grpcPort = 0;
let promPort = 0;
const background: ChildProcess[] = [];
const timings: Record<string, number> = {};
const t0 = Date.now();

async function ok(r: Promise<Run>, what: string): Promise<string> {
  const done = await r;
  expect(done.code, `${what}: ${done.stderr}${done.stdout}`).toBe(0);
  return done.stdout;
}

async function getJson(args: readonly string[]): Promise<Obj> {
  return JSON.parse(await ok(cluster.kubectl([...args, '-o', 'json']), `kubectl ${args.join(' ')}`)) as Obj;
}

async function waitFor<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 60_000, everyMs = 500): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe().catch(() => undefined);
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/** `kubectl sandbox …` exactly as an operator types it: kubectl finds the plugin on PATH. */
let pluginPath = '';
function kubectlSandbox(args: readonly string[]): Promise<Run> {
  return cluster.kubectl(['sandbox', '--server', `127.0.0.1:${grpcPort}`, '--insecure', ...args], { env: { PATH: `${pluginPath}:${process.env.PATH ?? ''}` }, timeoutMs: 60_000 });
}

/** `kubectl port-forward` to a pod; resolves with the local port of each remote port. */
async function portForward(pod: string, ports: readonly number[]): Promise<number[]> {
  const child = spawn(cluster.tool('kubectl'), ['-n', NS, 'port-forward', '--address', '127.0.0.1', `pod/${pod}`, ...ports.map((p) => `:${p}`)], {
    env: { ...process.env, KUBECONFIG: cluster.kubeconfig }, stdio: ['ignore', 'pipe', 'pipe'],
  });
  background.push(child);
  const found = new Map<number, number>();
  let out = '';
  return new Promise((resolvePorts, reject) => {
    const timer = setTimeout(() => reject(new Error(`port-forward ${pod}: ${out}`)), 30_000);
    const read = (b: Buffer): void => {
      out += b.toString();
      for (const m of out.matchAll(/Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)/g)) found.set(Number(m[2]), Number(m[1]));
      if (ports.every((p) => found.has(p))) {
        clearTimeout(timer);
        resolvePorts(ports.map((p) => found.get(p) ?? 0));
      }
    };
    child.stdout?.on('data', read);
    child.stderr?.on('data', read);
    child.once('exit', () => reject(new Error(`port-forward ${pod} exited: ${out}`)));
  });
}

async function pods(component?: string): Promise<Obj[]> {
  const list = await getJson(['-n', NS, 'get', 'pods', '-l', `app.kubernetes.io/instance=${RELEASE}${component !== undefined ? `,app.kubernetes.io/component=${component}` : ''}`]);
  return list.items as Obj[];
}

function ready(pod: Obj): boolean {
  return pod.metadata.deletionTimestamp === undefined && (pod.status.conditions as Obj[] | undefined)?.some((c) => c.type === 'Ready' && c.status === 'True') === true;
}

async function group(groupId: string): Promise<Obj> {
  return (await runner.getGroupState({ groupId })).group as Obj;
}

/** One turn as a runner drives it: begin, the CLI writes its session in the member (through the fleet's Exec), complete. */
async function turn(groupId: string, locator: string): Promise<{ hostId: string; contextState: ContextState; sessionBefore: string }> {
  const begun = await runner.beginTurn({ groupId, memberId: 'm1' });
  const path = nativeSessionPath('claude_code', locator);
  const exec = await runner.exec({
    groupId, memberId: 'm1', timeoutMs: 30_000,
    argv: ['/bin/sh', '-c', 'cat "$2" 2>/dev/null; mkdir -p "$1" && printf \'{"type":"user","sessionId":"%s"}\\n\' "$3" >> "$2"', 'sh', path.slice(0, path.lastIndexOf('/')), path, locator],
  });
  let stdout = '';
  let exitCode: number | undefined;
  for await (const event of exec.output()) {
    if (event.kind === 'stdout') stdout += event.data.toString();
    else if (event.kind === 'exit') exitCode = event.exit.exitCode;
  }
  expect(exitCode).toBe(0);
  await runner.completeTurn({ groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: locator, evidence: successEvidence() });
  return { hostId: begun.hostId, contextState: begun.contextState, sessionBefore: stdout };
}

async function prometheus(path: string): Promise<Obj> {
  const res = await fetch(`http://127.0.0.1:${promPort}${path}`);
  expect(res.status).toBe(200);
  return (await res.json()) as Obj;
}

async function activeAlerts(name: string): Promise<Obj[]> {
  return ((await prometheus('/api/v1/alerts')).data.alerts as Obj[]).filter((a) => a.labels.alertname === name);
}

/**
 * Debian's Prometheus inside the cluster's namespace, evaluating the chart's own rule file and
 * scraping what the chart's ServiceMonitors select, read back from the cluster: the Services their
 * selector matches, the endpoints of those Services on the port the monitor names, its path. Debian
 * builds Prometheus without Kubernetes discovery, so this test does the discovery the operator would:
 * it writes the endpoints to a file_sd file every second (Prometheus re-reads it), so a replica that
 * moves (the drain) is followed.
 */
let discovery: NodeJS.Timeout | undefined;
async function startPrometheus(): Promise<void> {
  const monitors = (await getJson(['-n', NS, 'get', 'servicemonitors'])).items as Obj[];
  expect(monitors.map((m) => m.metadata.name).sort()).toEqual([`${FULLNAME}-control-plane`, `${FULLNAME}-host-agent`]);
  const dir = join(cluster.dir, 'prometheus');
  mkdirSync(dir, { recursive: true });
  const targetsFile = (m: Obj): string => join(dir, `${m.metadata.name as string}.json`);
  const discover = async (): Promise<void> => {
    for (const m of monitors) {
      const selector = Object.entries(m.spec.selector.matchLabels as Record<string, string>).map(([k, v]) => `${k}=${v}`).join(',');
      const services = ((await getJson(['-n', NS, 'get', 'services', '-l', selector])).items as Obj[]).map((svc) => svc.metadata.name as string);
      const targets: Obj[] = [];
      for (const service of services) {
        const slices = (await getJson(['-n', NS, 'get', 'endpointslices', '-l', `kubernetes.io/service-name=${service}`])).items as Obj[];
        for (const slice of slices) {
          const port = (slice.ports as Obj[] | null ?? []).find((p) => p.name === m.spec.endpoints[0].port);
          if (port === undefined) continue;
          for (const ep of (slice.endpoints as Obj[] | null ?? []).filter((e) => e.conditions?.ready === true)) {
            targets.push({ targets: [`${ep.addresses[0] as string}:${port.port as number}`], labels: { service, pod: ep.targetRef?.name ?? '', node: ep.nodeName ?? '' } });
          }
        }
      }
      writeFileSync(`${targetsFile(m)}.tmp`, JSON.stringify(targets));
      renameSync(`${targetsFile(m)}.tmp`, targetsFile(m));
    }
  };
  await discover();
  const config = {
    global: { scrape_interval: '1s', evaluation_interval: '1s', scrape_timeout: '1s' },
    rule_files: [join(CHART, 'files/alerts.yaml')],
    scrape_configs: monitors.map((m) => ({
      job_name: m.metadata.name,
      metrics_path: m.spec.endpoints[0].path,
      file_sd_configs: [{ files: [targetsFile(m)], refresh_interval: '1s' }],
    })),
  };
  writeFileSync(join(dir, 'prometheus.yml'), JSON.stringify(config));
  const child = cluster.spawnInside('prometheus', ['--config.file', join(dir, 'prometheus.yml'), '--storage.tsdb.path', join(dir, 'data'), '--web.listen-address', '127.0.0.1:9090', '--storage.tsdb.retention.time', '1h'], join(cluster.dir, 'logs', 'prometheus.log'));
  background.push(child);
  promPort = await cluster.tunnel('127.0.0.1:9090');
  let busy = false;
  discovery = setInterval(() => {
    if (busy) return;
    busy = true;
    discover().catch(() => undefined).finally(() => {
      busy = false;
    });
  }, 1_000);
  // Both control-plane replicas are scraped before anything happens, so the LOST counters have history.
  await waitFor('Prometheus scraping both control-plane replicas', async () => {
    const targets = (await prometheus('/api/v1/targets')).data.activeTargets as Obj[];
    const up = targets.filter((t) => t.labels.job === `${FULLNAME}-control-plane` && t.health === 'up');
    return up.length === 2 ? up : undefined;
  }, 60_000);
}

beforeAll(async () => {
  scratch = mkdtempSync(join(tmpdir(), 'sf-cluster-'));
  pluginPath = join(scratch, 'plugins');
  mkdirSync(pluginPath);
  // kubectl finds `kubectl sandbox` as kubectl-sandbox on PATH (package.json "bin").
  symlinkSync(join(REPO_ROOT, 'cmd/sandboxctl/sandboxctl.mjs'), join(pluginPath, 'kubectl-sandbox'));
  const imagesStart = Date.now();
  let imagesMs = 0;
  [cluster, images] = await Promise.all([startTestCluster(), buildClusterImages(scratch).then((i) => {
    imagesMs = Date.now() - imagesStart;
    return i;
  })]);
  timings.clusterReadyMs = cluster.readyMs;
  timings.imagesBuildMs = imagesMs;
  const importStart = Date.now();
  await Promise.all(cluster.nodes.map(async (node) => {
    for (const image of [images.controlPlane, images.hostAgent, images.nats]) await importIntoContainerd(node.containerdSocket, image);
  }));
  sandbox = await provisionSandboxImage(cluster.nodes.map((node) => new Docker({ socketPath: node.dockerSocket })), { bridgeVersion: 4 });
  timings.imagesImportMs = Date.now() - importStart;
  const crdDir = join(toolsDir(), 'share/prometheus-operator-crds');
  await ok(cluster.kubectl(['apply', '--server-side', ...CRDS.flatMap((f) => ['-f', join(crdDir, f)])]), 'apply CRDs');
  await ok(cluster.kubectl(['wait', '--for=condition=Established', '--timeout=60s', 'crd/prometheusrules.monitoring.coreos.com', 'crd/servicemonitors.monitoring.coreos.com']), 'CRDs established');
  // The embedded NATS' volume: a local PersistentVolume on node-a (no provisioner here).
  const pvPath = join(cluster.dir, 'pv/nats');
  mkdirSync(pvPath, { recursive: true });
  await ok(cluster.kubectl(['apply', '-f', '-'], { input: JSON.stringify({
    apiVersion: 'v1', kind: 'List', items: [
      { apiVersion: 'storage.k8s.io/v1', kind: 'StorageClass', metadata: { name: 'sfk-local' }, provisioner: 'kubernetes.io/no-provisioner', volumeBindingMode: 'WaitForFirstConsumer' },
      { apiVersion: 'v1', kind: 'PersistentVolume', metadata: { name: 'sfk-nats' }, spec: {
        capacity: { storage: '1Gi' }, accessModes: ['ReadWriteOnce'], persistentVolumeReclaimPolicy: 'Retain', storageClassName: 'sfk-local', local: { path: pvPath },
        nodeAffinity: { required: { nodeSelectorTerms: [{ matchExpressions: [{ key: 'kubernetes.io/hostname', operator: 'In', values: ['node-a'] }] }] } },
      } },
    ],
  }) }), 'storage');
}, 600_000);

afterAll(async () => {
  runner?.close();
  if (discovery !== undefined) clearInterval(discovery);
  for (const child of background) if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
  timings.wholeTestMs = Date.now() - t0;
  console.log(`cluster test timings: ${JSON.stringify(timings)}`);
  await cluster?.stop();
  rmSync(scratch, { recursive: true, force: true });
}, 180_000);

describe('the operator on a real two-node cluster', () => {
  let nodeAPlane = '';
  const movedGroups: { groupId: string; locator: string }[] = [];

  it('helm install: the control plane (2 replicas, one Lease holder), an agent on each node and NATS all Ready; the monitoring objects are accepted', async () => {
    expect(await ok(cluster.kubectl(['version', '-o', 'json']), 'version')).toContain('"gitVersion": "v1.37.2"');
    const started = Date.now();
    await ok(cluster.helm([
      'install', RELEASE, CHART, '-n', NS, '--create-namespace', '-f', VALUES,
      '--set', `attestation.allowedAgentShas={${images.buildSha}}`, '--set', `attestation.allowedImageDigests={${sandbox.imageId}}`,
      '--set', `hostAgent.sandboxImage.ref=${sandbox.reference}`, '--set', `hostAgent.sandboxImage.id=${sandbox.imageId}`,
      '--wait', '--timeout', '180s',
    ], { timeoutMs: 200_000 }), 'helm install');
    timings.helmInstallMs = Date.now() - started;
    // `helm --wait` accepts a DaemonSet with maxUnavailable pods not Ready: wait for every pod.
    await ok(cluster.kubectl(['-n', NS, 'wait', '--for=condition=Ready', 'pod', '-l', `app.kubernetes.io/instance=${RELEASE}`, '--timeout=120s'], { timeoutMs: 130_000 }), 'pods Ready');
    timings.installToAllReadyMs = Date.now() - started;

    const all = await pods();
    for (const pod of all) expect(ready(pod), pod.metadata.name).toBe(true);
    const planes = all.filter((p) => p.metadata.labels['app.kubernetes.io/component'] === 'control-plane');
    const agents = all.filter((p) => p.metadata.labels['app.kubernetes.io/component'] === 'host-agent');
    expect(planes).toHaveLength(2);
    expect(agents.map((p) => p.spec.nodeName).sort()).toEqual(['node-a', 'node-b']);
    expect(agents.every((p) => p.spec.hostPID === true)).toBe(true);
    expect(all.filter((p) => p.metadata.labels['app.kubernetes.io/component'] === 'nats').map((p) => p.spec.nodeName)).toEqual(['node-a']);
    const lease = await waitFor('the leader Lease', async () => {
      const l = await getJson(['-n', NS, 'get', 'lease', `${FULLNAME}-leader`]);
      return typeof l.spec?.holderIdentity === 'string' && l.spec.holderIdentity !== '' ? l : undefined;
    });
    expect(planes.map((p) => p.metadata.name)).toContain(lease.spec.holderIdentity);
    expect((await getJson(['-n', NS, 'get', 'prometheusrule', `${FULLNAME}-alerts`])).spec.groups[0].rules.length).toBeGreaterThanOrEqual(8);
    expect((await getJson(['-n', NS, 'get', 'configmap', `${FULLNAME}-dashboard`])).metadata.labels.grafana_dashboard).toBe('1');

    // The operator's connection: a port-forward to the replica on node-a (node-b is drained later).
    nodeAPlane = planes.find((p) => p.spec.nodeName === 'node-a')?.metadata.name ?? planes[0]!.metadata.name;
    grpcPort = (await portForward(nodeAPlane, [7443]))[0] ?? 0;
    runner = new RunnerClient({ address: `127.0.0.1:${grpcPort}`, insecureLocalDev: true, deadlineMs: 90_000 });
    await startPrometheus();
  }, 300_000);

  it('kubectl sandbox hosts, groups and verify: both nodes READY with the released build', async () => {
    const hosts = await waitFor('both hosts READY', async () => {
      const r = await kubectlSandbox(['hosts']);
      return /node-a\s+READY/.test(r.stdout) && /node-b\s+READY/.test(r.stdout) ? r.stdout : undefined;
    });
    expect(hosts).toContain(images.buildSha.slice(0, 12));
    const verify = await kubectlSandbox(['verify']);
    expect(verify.code, verify.stderr).toBe(0);
    expect(verify.stdout).toContain('verify: OK');
    expect(verify.stdout).toContain(images.buildSha);
    const groups = await kubectlSandbox(['groups']);
    expect(groups.code, groups.stderr).toBe(0);
    // The CLI also runs from the released image itself, i.e. with the production dependencies only
    // (`npm ci --omit=dev`: it loads `yaml`, which must therefore be a runtime dependency).
    const inImage = await cluster.kubectl(['-n', NS, 'exec', nodeAPlane, '--', 'node', 'cmd/sandboxctl/sandboxctl.mjs', '--server', '127.0.0.1:7443', '--insecure', '-o', 'yaml', 'hosts'], { timeoutMs: 60_000 });
    expect(inImage.code, inImage.stderr).toBe(0);
    expect(inImage.stdout).toMatch(/hostId: node-a/);
  }, 120_000);

  it('conversations through the runner API run on both nodes', async () => {
    const placed = new Map<string, string[]>();
    // At least four conversations, and on both nodes (placement decides where; eight at most).
    for (let i = 0; i < 8 && !(i >= 4 && placed.has('node-a') && placed.has('node-b')); i++) {
      const { group: opened } = await runner.openGroup({ conversationId: `conv-${i}`, members: [{ memberId: 'm1', cli: 'claude-code' }] });
      const locator = `sess-${i}`;
      const first = await turn(opened!.groupId, locator);
      expect(first.contextState).toBe(ContextState.NEW);
      placed.set(first.hostId, [...(placed.get(first.hostId) ?? []), opened!.groupId]);
      if (first.hostId === 'node-b') movedGroups.push({ groupId: opened!.groupId, locator });
    }
    expect([...placed.keys()].sort()).toEqual(['node-a', 'node-b']);
    const listed = await kubectlSandbox(['groups']);
    for (const ids of placed.values()) for (const id of ids) expect(listed.stdout).toContain(id);
  }, 180_000);

  it('kubectl cordon + drain node-b moves its groups to node-a with their sessions: the next turn is RESTORED', async () => {
    expect(movedGroups.length).toBeGreaterThan(0);
    const started = Date.now();
    await ok(cluster.kubectl(['cordon', 'node-b']), 'cordon');
    await ok(cluster.kubectl(['drain', 'node-b', '--ignore-daemonsets', '--delete-emptydir-data', '--timeout=180s'], { timeoutMs: 200_000 }), 'drain');
    timings.kubectlDrainMs = Date.now() - started;
    for (const { groupId } of movedGroups) {
      await waitFor(`${groupId} moved to node-a`, async () => {
        const g = await group(groupId);
        return g.state === GroupState.STOPPED && g.hostId === 'node-a' ? g : undefined;
      }, 120_000);
    }
    timings.groupsMovedMs = Date.now() - started;
    for (const { groupId, locator } of movedGroups) {
      const next = await turn(groupId, locator);
      expect(next).toMatchObject({ contextState: ContextState.RESTORED, hostId: 'node-a' });
      // The native session written on node-b is in the member on node-a.
      expect(next.sessionBefore).toContain(`"sessionId":"${locator}"`);
    }
    // The evicted control-plane replica is back, on node-a; the DaemonSet's agent on node-b stayed.
    await waitFor('2 control-plane replicas Ready', async () => {
      const planes = (await pods('control-plane')).filter(ready);
      return planes.length === 2 ? planes : undefined;
    }, 120_000);
  }, 400_000);

  it('node-b crashes; its agent pod and Node object are deleted: the group running there is LOST with a reason, and Prometheus pages', async () => {
    await ok(cluster.kubectl(['uncordon', 'node-b']), 'uncordon');
    // The drained host was retired (REMOVED); its agent registers again with a new epoch when restarted.
    const agentB = async (): Promise<Obj | undefined> => (await pods('host-agent')).find((p) => p.spec.nodeName === 'node-b');
    await ok(cluster.kubectl(['-n', NS, 'delete', 'pod', (await agentB())!.metadata.name, '--wait=true']), 'restart agent on node-b');
    await waitFor('node-b READY again', async () => (/node-b\s+READY/.test((await kubectlSandbox(['hosts'])).stdout) ? true : undefined), 90_000);

    // A conversation whose turn is in flight on node-b (new groups go to the emptier node).
    let running: { groupId: string } | undefined;
    for (let i = 0; i < 6 && running === undefined; i++) {
      const { group: opened } = await runner.openGroup({ conversationId: `conv-run-${i}`, members: [{ memberId: 'm1', cli: 'claude-code' }] });
      const begun = await runner.beginTurn({ groupId: opened!.groupId, memberId: 'm1' });
      if (begun.hostId === 'node-b') running = { groupId: opened!.groupId };
    }
    expect(running).toBeDefined();
    expect((await group(running!.groupId)).state).toBe(GroupState.RUNNING);

    // The crash: node-b's kubelet dies and its agent container is killed through node-b's own
    // containerd (no graceful stop). Then the operator removes what is left.
    const crashAt = Date.now();
    process.kill(cluster.daemonPid('node-b-kubelet'), 'SIGKILL');
    const nodeB = cluster.nodes.find((x) => x.name === 'node-b')!;
    const listed = await run('ctr', ['--address', nodeB.containerdSocket, '-n', 'k8s.io', 'containers', 'ls', '-q', 'labels."io.kubernetes.container.name"==host-agent']);
    const agentContainers = listed.stdout.split('\n').filter(Boolean);
    expect(agentContainers.length).toBeGreaterThan(0);
    for (const id of agentContainers) await run('ctr', ['--address', nodeB.containerdSocket, '-n', 'k8s.io', 'tasks', 'kill', '-s', 'SIGKILL', id]);
    await ok(cluster.kubectl(['-n', NS, 'delete', 'pod', (await agentB())!.metadata.name, '--force', '--grace-period=0']), 'delete agent pod');
    await ok(cluster.kubectl(['delete', 'node', 'node-b', '--wait=true']), 'delete node');

    const lost = await waitFor('the running group LOST', async () => {
      const g = await group(running!.groupId);
      return g.state === GroupState.LOST ? g : undefined;
    }, 120_000);
    timings.crashToLostMs = Date.now() - crashAt;
    expect(lost.lossReason).toBe('host_lost_running');
    const shown = await kubectlSandbox(['groups', '--state', 'lost']);
    expect(shown.stdout).toContain(running!.groupId);
    expect(shown.stdout).toContain('host_lost_running');

    // SandboxFleetSessionsLost has no `for`: it fires at once (never pending), by reason, with the
    // severity and the runbook of the chart's rule file.
    const rule = (parse(readFileSync(join(CHART, 'files/alerts.yaml'), 'utf8')) as Obj).groups[0].rules.find((r: Obj) => r.alert === 'SandboxFleetSessionsLost') as Obj;
    const seen = new Set<string>();
    const firing = await waitFor('SandboxFleetSessionsLost firing', async () => {
      const alerts = await activeAlerts('SandboxFleetSessionsLost');
      for (const a of alerts) seen.add(a.state as string);
      return alerts.find((a) => a.state === 'firing' && a.labels.reason === 'host_lost_running');
    }, 60_000, 250);
    timings.lostToAlertFiringMs = Date.now() - crashAt - timings.crashToLostMs;
    expect([...seen]).toEqual(['firing']);
    expect(firing.labels).toMatchObject({ alertname: 'SandboxFleetSessionsLost', severity: 'critical', reason: 'host_lost_running' });
    expect(firing.annotations.runbook).toBe(rule.annotations.runbook);
    expect(firing.annotations.summary).toBe('Sandbox sessions declared LOST (reason host_lost_running)');
  }, 400_000);

  it("every query of the chart's Grafana dashboard runs on the real Prometheus over series the control plane really exported", async () => {
    const dashboard = JSON.parse(readFileSync(join(CHART, 'files/dashboard.json'), 'utf8')) as Obj;
    const exprs = (dashboard.panels as Obj[]).flatMap((p) => (p.targets as Obj[]).map((t) => ({ panel: p.title as string, expr: t.expr as string })));
    expect(exprs.length).toBeGreaterThanOrEqual(12);
    const query = async (q: string): Promise<Obj[]> => {
      const r = await prometheus(`/api/v1/query?query=${encodeURIComponent(q)}`);
      expect(r.status, q).toBe('success');
      return r.data.result as Obj[];
    };
    let withData = 0;
    for (const { panel, expr } of exprs) {
      // Grafana's range variables as a dashboard over this test's last minutes would set them.
      const q = expr.replaceAll('$__rate_interval', '5m').replaceAll('$__range', '15m');
      // Every series the query reads was scraped from the control plane during this test (the
      // drain, the LOST and the checkpoints made each of them exist).
      for (const name of new Set([...expr.matchAll(/\b(sandboxfleet_[a-z0-9_]+)/g)].map((m) => m[1]!))) {
        expect((await query(`count_over_time(${name}{job="${FULLNAME}-control-plane"}[15m])`)).length, `${panel}: ${name} was never scraped`).toBeGreaterThan(0);
      }
      if ((await query(q)).length > 0) withData += 1;
    }
    // A rate over a histogram the evicted leader filled in its last seconds can be empty; the rest
    // of the panels show this test's events.
    expect(withData, 'panels with data').toBeGreaterThanOrEqual(exprs.length - 2);
  }, 400_000);

  it('SandboxFleetHeartbeatMissing for the crashed host goes pending, then firing, and resolves once the host is removed', async () => {
    const states: string[] = [];
    const note = (a: Obj | undefined): void => {
      const s = a?.state as string | undefined;
      if (s !== undefined && states.at(-1) !== s) states.push(s);
    };
    const forB = async (): Promise<Obj | undefined> => (await activeAlerts('SandboxFleetHeartbeatMissing')).find((a) => a.labels.host === 'node-b');
    await waitFor('HeartbeatMissing pending', async () => {
      const a = await forB();
      note(a);
      return a !== undefined ? a : undefined;
    }, 120_000, 1_000);
    const firing = await waitFor('HeartbeatMissing firing (after its 2 min `for`)', async () => {
      const a = await forB();
      note(a);
      return a?.state === 'firing' ? a : undefined;
    }, 200_000, 1_000);
    expect(states).toEqual(['pending', 'firing']);
    expect(firing.labels).toMatchObject({ severity: 'warning', host: 'node-b' });
    // As its runbook says: a host that is gone for good keeps firing until removed.
    const removed = await kubectlSandbox(['remove', 'node-b', '--force', '--reason', 'node crashed']);
    expect(removed.code, removed.stderr + removed.stdout).toBe(0);
    await waitFor('HeartbeatMissing resolved', async () => ((await forB()) === undefined ? true : undefined), 60_000, 1_000);
  }, 400_000);

  it('SandboxFleetSessionsLost resolves ten minutes after the last LOST, as documented: promtool replays the series this Prometheus scraped', async () => {
    // Ten minutes are not waited for in real time: the LOST counters Prometheus scraped from the
    // control plane during this test are replayed by `promtool test rules` against the chart's rule
    // file, held at their last values for eleven more minutes.
    const end = Math.floor(Date.now() / 1000);
    const start = end - Math.ceil((Date.now() - t0) / 1000);
    const range = await prometheus(`/api/v1/query_range?query=${encodeURIComponent('sandboxfleet_lost_sessions_total')}&start=${start}&end=${end}&step=1s`);
    const series = range.data.result as { metric: Record<string, string>; values: [number, string][] }[];
    expect(series.length).toBeGreaterThan(0);
    const steps = end - start + 1;
    let lostAt = -1;
    const input = series.map(({ metric, values }) => {
      const at = new Map(values.map(([t, v]) => [Math.round(t) - start, v]));
      const samples = Array.from({ length: steps }, (_, i) => at.get(i) ?? '_');
      if (metric.reason === 'host_lost_running') {
        const first = samples.findIndex((v) => v !== '_' && Number(v) > 0);
        if (first >= 0 && (lostAt < 0 || first < lostAt)) lostAt = first;
      }
      const last = samples.at(-1) ?? '_';
      const labels = Object.entries(metric).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(', ');
      return { series: `sandboxfleet_lost_sessions_total{${labels}}`, values: last === '_' ? samples.join(' ') : `${samples.join(' ')} ${last}+0x660` };
    });
    expect(lostAt, 'the LOST of this test is in the scraped series').toBeGreaterThan(0);
    const rule = (parse(readFileSync(join(CHART, 'files/alerts.yaml'), 'utf8')) as Obj).groups[0].rules.find((r: Obj) => r.alert === 'SandboxFleetSessionsLost') as Obj;
    const annotations = Object.fromEntries(Object.entries(rule.annotations as Record<string, string>).map(([k, v]) => [k, v.replaceAll('{{ $labels.reason }}', 'host_lost_running').replaceAll('{{ $value | printf "%.0f" }}', '1')]));
    const firing = [{ exp_labels: { severity: 'critical', reason: 'host_lost_running' }, exp_annotations: annotations }];
    const lastSample = steps - 1;
    const tests = {
      rule_files: [join(CHART, 'files/alerts.yaml')],
      evaluation_interval: '1s',
      tests: [{
        interval: '1s',
        input_series: input,
        alert_rule_test: [
          { eval_time: `${lostAt + 5}s`, alertname: 'SandboxFleetSessionsLost', exp_alerts: firing },
          // Still within ten minutes of the LOST: firing.
          { eval_time: `${lostAt + 9 * 60}s`, alertname: 'SandboxFleetSessionsLost', exp_alerts: firing },
          // Ten minutes without a new LOST (and with history older than the window): resolved.
          { eval_time: `${Math.max(lastSample, lostAt) + 10 * 60 + 30}s`, alertname: 'SandboxFleetSessionsLost', exp_alerts: [] },
        ],
      }],
    };
    const file = join(scratch, 'lost-replay.test.yaml');
    writeFileSync(file, JSON.stringify(tests));
    const replay = await run('promtool', ['test', 'rules', file], { timeoutMs: 120_000 });
    expect(replay.code, replay.stdout + replay.stderr).toBe(0);
    expect(replay.stdout).toContain('SUCCESS');
  }, 180_000);

  it('helm upgrade applies a changed value; helm uninstall leaves nothing behind', async () => {
    await ok(cluster.helm(['upgrade', RELEASE, CHART, '-n', NS, '--reuse-values', '--set', 'controlPlane.logLevel=debug', '--wait', '--timeout', '180s'], { timeoutMs: 200_000 }), 'helm upgrade');
    const deployment = await getJson(['-n', NS, 'get', 'deployment', `${FULLNAME}-control-plane`]);
    expect((deployment.spec.template.spec.containers[0].env as Obj[]).find((e) => e.name === 'LOG_LEVEL')?.value).toBe('debug');
    const planes = (await pods('control-plane')).filter(ready);
    expect(planes).toHaveLength(2);
    for (const p of planes) expect((p.spec.containers[0].env as Obj[]).find((e) => e.name === 'LOG_LEVEL')?.value).toBe('debug');

    await ok(cluster.helm(['uninstall', RELEASE, '-n', NS, '--wait', '--timeout', '180s'], { timeoutMs: 200_000 }), 'helm uninstall');
    const kinds = 'all,configmaps,secrets,serviceaccounts,roles,rolebindings,poddisruptionbudgets,networkpolicies,servicemonitors,prometheusrules,persistentvolumeclaims,leases';
    // Nothing: the Lease is the chart's, and the CI values delete the NATS claim with its server
    // (nats.server.storage.deleteOnUninstall). The namespace's own objects are not the release's.
    const expected: string[] = [];
    let names: string[] = [];
    await waitFor('nothing of the release left', async () => {
      const left = (await getJson(['-n', NS, 'get', kinds])).items as Obj[];
      names = left.map((o) => `${o.kind}/${o.metadata.name}`).filter((name) => name !== 'ConfigMap/kube-root-ca.crt' && name !== 'ServiceAccount/default').sort();
      return names.join() === expected.join() ? names : undefined;
    }, 90_000, 1_000).catch(() => undefined);
    expect(names).toEqual(expected);
    const clusterWide = (await getJson(['get', 'clusterroles,clusterrolebindings', '-l', `app.kubernetes.io/instance=${RELEASE}`])).items as Obj[];
    expect(clusterWide).toEqual([]);
  }, 400_000);
});
