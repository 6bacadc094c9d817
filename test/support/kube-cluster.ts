// Test helper: a real two-node Kubernetes cluster on this machine (scripts/test-cluster does the
// work and says what it touches): etcd, kube-apiserver, controller-manager, scheduler, CoreDNS,
// kube-proxy, and two kubelet nodes, each with its own containerd and its own dockerd for sandboxes.
// Everything runs inside a network namespace without a route out; this helper reaches it from the
// host only through unix-socket tunnels to 127.0.0.1 (scripts/netns-tunnel.mjs). stop() runs
// `test-cluster down`, which undoes everything; a cluster whose test process died is reaped by the
// next start.
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createWriteStream, readFileSync } from 'node:fs';
import { connect, createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { toolsDir } from '../../src/config/tools.ts';
import { REPO_ROOT } from './cluster-images.ts';

const SCRIPT = join(REPO_ROOT, 'scripts/test-cluster');
const TUNNEL = join(REPO_ROOT, 'scripts/netns-tunnel.mjs');

export interface ClusterNode {
  readonly name: string;
  /** The node's dockerd (the fleet's sandboxes), reachable from the host by its path. */
  readonly dockerSocket: string;
  readonly containerdSocket: string;
}

export interface Run {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

export interface TestCluster {
  readonly dir: string;
  readonly netns: string;
  /** Admin kubeconfig whose server is the host-side tunnel to the API server. */
  readonly kubeconfig: string;
  /** The API server's address inside the namespace (what pods and in-namespace clients use). */
  readonly apiUrl: string;
  readonly caFile: string;
  readonly adminToken: string;
  readonly nodes: readonly ClusterNode[];
  /** Wall time of `test-cluster up`: start to both nodes Ready. */
  readonly readyMs: number;
  /** A Go-built tool of scripts/bootstrap (kubectl, helm, ...). */
  tool(name: string): string;
  kubectl(args: readonly string[], options?: RunOptions): Promise<Run>;
  helm(args: readonly string[], options?: RunOptions): Promise<Run>;
  /** Start a long-running process inside the cluster's network namespace; stopped by stop(). */
  spawnInside(command: string, args: readonly string[], logFile: string): ChildProcess;
  /** A 127.0.0.1 port on the host that reaches `host:port` inside the namespace. */
  tunnel(hostPort: string): Promise<number>;
  /** The pid of a daemon the script started (e.g. `node-b-kubelet`). */
  daemonPid(name: string): number;
  stop(): Promise<void>;
}

export interface RunOptions {
  readonly env?: NodeJS.ProcessEnv;
  readonly timeoutMs?: number;
  readonly input?: string;
}

export function run(file: string, args: readonly string[], options: RunOptions = {}): Promise<Run> {
  return new Promise((resolve) => {
    const child = execFile(file, args, { env: options.env ?? process.env, maxBuffer: 64 * 1024 * 1024, timeout: options.timeoutMs ?? 120_000 }, (err, stdout, stderr) => {
      const code = err === null ? 0 : typeof err.code === 'number' ? err.code : 1;
      resolve({ code, stdout, stderr });
    });
    if (options.input !== undefined) child.stdin?.end(options.input);
  });
}

function parseEnv(text: string): Map<string, string> {
  return new Map(text.split('\n').filter((l) => l.includes('=')).map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));
}

export async function startTestCluster(): Promise<TestCluster> {
  // A cluster left by a test process that died is torn down first (the script checks its owner).
  await run('bash', [SCRIPT, 'reap'], { timeoutMs: 120_000 });
  const dir = `/tmp/sfk-${randomBytes(3).toString('hex')}`;
  const started = Date.now();
  const up = await run('bash', [SCRIPT, 'up', dir, String(process.pid)], { timeoutMs: 300_000 });
  const readyMs = Date.now() - started;
  if (up.code !== 0) {
    const logs = (() => {
      try {
        return ['kubelet', 'containerd'].map((d) => `--- node-a-${d}\n${readFileSync(join(dir, 'logs', `node-a-${d}.log`), 'utf8').slice(-3000)}`).join('\n');
      } catch {
        return '';
      }
    })();
    await run('bash', [SCRIPT, 'down', dir]);
    throw new Error(`test-cluster up failed (${up.code}):\n${up.stderr.slice(-4000)}\n${logs}`);
  }
  const env = parseEnv(readFileSync(join(dir, 'env'), 'utf8'));
  const netns = env.get('NETNS') ?? '';
  const nodes = (env.get('NODES') ?? '').split(' ').filter(Boolean).map((name) => {
    const key = name.replace(/-/g, '_');
    return { name, dockerSocket: env.get(`DOCKER_SOCKET_${key}`) ?? '', containerdSocket: env.get(`CONTAINERD_SOCKET_${key}`) ?? '' };
  });
  const kubeconfig = join(dir, 'kubeconfig');
  const adminToken = /token: (\S+)/.exec(readFileSync(kubeconfig, 'utf8'))?.[1] ?? '';
  const tool = (name: string): string => join(toolsDir(), 'bin', name);
  const children: ChildProcess[] = [];
  const servers: Server[] = [];
  const withKubeconfig = (options: RunOptions): RunOptions => ({ ...options, env: { ...process.env, ...options.env, KUBECONFIG: kubeconfig } });
  const spawnInside = (command: string, args: readonly string[], logFile: string): ChildProcess => {
    const child = spawn('ip', ['netns', 'exec', netns, command, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    const log = createWriteStream(logFile);
    child.stdout?.pipe(log);
    child.stderr?.pipe(log);
    children.push(child);
    return child;
  };
  let tunnels = 0;
  const tunnel = async (hostPort: string): Promise<number> => {
    const socket = join(dir, `tunnel-${++tunnels}.sock`);
    spawnInside('node', [TUNNEL, 'in', socket, hostPort], join(dir, 'logs', `tunnel-${tunnels}.log`));
    for (let i = 0; ; i++) {
      const ok = await new Promise<boolean>((resolve) => {
        const c = connect(socket, () => {
          c.destroy();
          resolve(true);
        });
        c.on('error', () => resolve(false));
      });
      if (ok) break;
      if (i > 100) throw new Error(`tunnel to ${hostPort} did not start`);
      await new Promise((r) => setTimeout(r, 100));
    }
    const server = createServer((client) => {
      const upstream = connect(socket);
      client.pipe(upstream).pipe(client);
      const close = (): void => {
        client.destroy();
        upstream.destroy();
      };
      client.on('error', close);
      upstream.on('error', close);
    });
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const address = server.address();
    return typeof address === 'object' && address !== null ? address.port : 0;
  };
  return {
    dir,
    netns,
    kubeconfig,
    apiUrl: `https://${env.get('API_IP') ?? ''}:6443`,
    caFile: join(dir, 'pki/ca.crt'),
    adminToken,
    nodes,
    readyMs,
    tool,
    kubectl: (args, options = {}) => run(tool('kubectl'), args, withKubeconfig(options)),
    helm: (args, options = {}) => run(tool('helm'), args, withKubeconfig(options)),
    spawnInside,
    tunnel,
    daemonPid: (name) => Number.parseInt(readFileSync(join(dir, 'pids', name), 'utf8'), 10),
    async stop() {
      for (const s of servers) s.close();
      for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGTERM');
      const down = await run('bash', [SCRIPT, 'down', dir], { timeoutMs: 120_000 });
      if (down.code !== 0) throw new Error(`test-cluster down failed: ${down.stderr}`);
    },
  };
}
