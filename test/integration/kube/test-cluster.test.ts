// The test cluster itself (scripts/test-cluster, test/support/kube-cluster.ts): two nodes Ready in
// a bounded, measured time with version-stamped binaries; a pod runs on each node (CNI, cgroups,
// volumes); the network namespace has no route out, so a connection to an outside address fails
// before any packet is sent; and `down` leaves the machine as it found it: no namespace, no mount,
// no cgroup, the kubelet's sysctls restored, the directories it created removed, no pinned pod
// network namespace in /run/netns.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { afterAll, describe, expect, it } from 'vitest';
import { run, startTestCluster, type TestCluster } from '../../support/kube-cluster.ts';

const SYSCTLS = ['vm/overcommit_memory', 'kernel/panic', 'kernel/panic_on_oops'];
const HOST_DIRS = ['/var/lib/kubelet', '/var/log/pods', '/var/log/containers', '/var/lib/cni', '/run/sandboxfleet', '/var/lib/sandboxfleet', '/usr/libexec/kubernetes'];

interface MachineState {
  readonly sysctls: string[];
  readonly netns: string[];
  readonly hostDirs: boolean[];
}

function machineState(): MachineState {
  return {
    sysctls: SYSCTLS.map((s) => readFileSync(`/proc/sys/${s}`, 'utf8').trim()),
    netns: existsSync('/run/netns') ? readdirSync('/run/netns').sort() : [],
    hostDirs: HOST_DIRS.map((d) => existsSync(d)),
  };
}

let cluster: TestCluster | undefined;

afterAll(async () => {
  await cluster?.stop();
});

describe('the two-node test cluster', () => {
  it('starts, runs pods on both nodes, has no route out, and is torn down without a trace', async () => {
    const before = machineState();
    cluster = await startTestCluster();
    const { dir, netns } = cluster;
    console.log(`test cluster: both nodes Ready ${cluster.readyMs} ms after start`);
    expect(cluster.readyMs).toBeLessThan(120_000);
    const version = JSON.parse((await cluster.kubectl(['version', '-o', 'json'])).stdout) as { serverVersion: { gitVersion: string } };
    expect(version.serverVersion.gitVersion).toBe('v1.37.2');

    // A pod on each node, from the locally imported pause image (never pulled).
    // (The controller-manager creates the namespace's default ServiceAccount a moment after start.)
    for (const node of ['node-a', 'node-b']) {
      let r = await cluster.kubectl(['run', `probe-${node}`, '--image=sandbox-fleet.test/pause:v1.37.2', '--image-pull-policy=Never', '--restart=Never', `--overrides={"spec":{"nodeName":"${node}"}}`]);
      for (let i = 0; i < 60 && r.stderr.includes('serviceaccount "default" not found'); i++) {
        await new Promise((resolve) => setTimeout(resolve, 500));
        r = await cluster.kubectl(['run', `probe-${node}`, '--image=sandbox-fleet.test/pause:v1.37.2', '--image-pull-policy=Never', '--restart=Never', `--overrides={"spec":{"nodeName":"${node}"}}`]);
      }
      expect(r.code, r.stderr).toBe(0);
    }
    const waited = await cluster.kubectl(['wait', '--for=condition=Ready', 'pod/probe-node-a', 'pod/probe-node-b', '--timeout=90s'], { timeoutMs: 100_000 });
    expect(waited.code, waited.stderr).toBe(0);
    const ips = (await cluster.kubectl(['get', 'pods', '-o', 'jsonpath={.items[*].status.podIP}'])).stdout.split(' ');
    expect(ips.sort()).toEqual([expect.stringMatching(/^10\.88\.1\./), expect.stringMatching(/^10\.88\.2\./)]);

    // No default route, and nothing but loopback, the address bridge and the pods' links.
    const routes = await run('ip', ['-n', netns, 'route', 'show', 'table', 'all']);
    expect(routes.stdout).not.toMatch(/^default/m);
    const links = (await run('ip', ['-n', netns, '-o', 'link'])).stdout.split('\n').filter(Boolean).map((l) => l.split(': ')[1]!.split('@')[0]!);
    for (const link of links) expect(link).toMatch(/^(lo|sfk-net|cni-a|cni-b|veth[0-9a-f]+)$/);
    // An address outside: the kernel refuses at once (no route), so no packet is ever sent.
    const outside = await run('ip', ['netns', 'exec', netns, 'node', '-e',
      "require('node:net').connect(80, '192.0.2.1').on('error', (e) => { console.log(e.code); process.exit(0); }).on('connect', () => { console.log('connected'); process.exit(1); })"]);
    expect(outside.stdout.trim()).toBe('ENETUNREACH');

    await cluster.stop();
    cluster = undefined;
    expect(existsSync(dir)).toBe(false);
    expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(dir);
    const id = dir.slice('/tmp/sfk-'.length);
    for (const hierarchy of readdirSync('/sys/fs/cgroup')) {
      const path = `/sys/fs/cgroup/${hierarchy}`;
      if (!existsSync(`${path}/cgroup.procs`)) continue;
      expect(readdirSync(path).filter((d) => d.startsWith(`sfk-${id}-`)), path).toEqual([]);
    }
    expect(machineState()).toEqual(before);
  }, 300_000);
});
