// Real Docker "hosts" for integration tests: each is its own dockerd (own data root, exec root,
// pidfile, socket, and its own managed containerd), so two or three can run side by side on one
// machine and play separate fleet hosts. Network-safe flags only (no bridge, no iptables).
// Cleanup is defensive: earlier runs that died may have left daemons, shims, cgroups and overlay
// mounts behind; startDockerHost() reaps those whose owning test process is gone.
import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, openSync, closeSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import Docker from 'dockerode';
import { toolPath } from '../../src/config/tools.ts';

const execFileP = promisify(execFile);

/** Every host directory starts with this prefix under /tmp; short, because unix socket paths are limited to 108 bytes. */
const HOST_DIR_PREFIX = '/tmp/sf-';
const OWNER_FILE = 'owner.pid';

export interface DockerHost {
  /** Human name used in logs and assertions (e.g. "host-a"). */
  readonly name: string;
  /** Root of everything this host owns: data root, exec root, socket, pidfile, log. */
  readonly dir: string;
  readonly socketPath: string;
  readonly dataRoot: string;
  readonly execRoot: string;
  readonly pidFile: string;
  readonly logPath: string;
  /** dockerode client bound to this host's socket. */
  readonly docker: Docker;
  /** pid of the dockerd process (a new one after restart()). */
  readonly pid: number;
  /** SIGTERM, wait, SIGKILL fallback; kills leftover containerd/shims/container processes. Idempotent. */
  stop(): Promise<void>;
  /** stop(), then unmount leftovers and delete the whole host directory. Idempotent. */
  destroy(): Promise<void>;
  /**
   * A node whose disk was wiped: SIGKILL dockerd, reap its containerd, shims and container
   * processes, then unmount and delete its data root and exec root. The host directory, socket
   * path and log stay, so restart() can bring a fresh, empty engine back on the same paths.
   */
  wipe(): Promise<void>;
  /** A fresh dockerd on the same socket and paths (after wipe() or stop()); waits for /_ping. */
  restart(): Promise<void>;
}

export interface StartDockerHostOptions {
  readonly name?: string;
  /** How long to wait for /_ping to answer. */
  readonly startTimeoutMs?: number;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

function readPid(file: string): number | undefined {
  try {
    const pid = Number.parseInt(readFileSync(file, 'utf8').trim(), 10);
    return Number.isInteger(pid) && pid > 0 ? pid : undefined;
  } catch {
    return undefined;
  }
}

function cmdline(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ');
  } catch {
    return '';
  }
}

function allPids(): number[] {
  return readdirSync('/proc').filter((e) => /^\d+$/.test(e)).map(Number);
}

/** Kill a pid only if its command line mentions our host dir: never a process we did not start. */
function killIfOurs(pid: number, dir: string, signal: NodeJS.Signals): void {
  if (cmdline(pid).includes(`${dir}/`)) {
    try {
      process.kill(pid, signal);
    } catch {
      // already gone
    }
  }
}

/**
 * Kill whatever a dead or killed dockerd may have left: its managed containerd, containerd shims
 * (their command line names our exec root), and container processes (found through the cgroup v1
 * hierarchy "/docker/<id>" for every container id in our data root), then remove those cgroups.
 */
function killLeftovers(dir: string): void {
  for (const pid of allPids()) killIfOurs(pid, dir, 'SIGKILL');
  const containersDir = join(dir, 'data', 'containers');
  const ids = existsSync(containersDir) ? readdirSync(containersDir) : [];
  if (ids.length === 0 || !existsSync('/sys/fs/cgroup')) return;
  const controllers = readdirSync('/sys/fs/cgroup');
  for (const id of ids) {
    for (const ctl of controllers) {
      const cg = join('/sys/fs/cgroup', ctl, 'docker', id);
      if (!existsSync(cg)) continue;
      try {
        for (const line of readFileSync(join(cg, 'cgroup.procs'), 'utf8').split('\n')) {
          const pid = Number.parseInt(line, 10);
          if (pid > 0) {
            try {
              process.kill(pid, 'SIGKILL');
            } catch {
              // already gone
            }
          }
        }
      } catch {
        // controller without cgroup.procs, or already removed
      }
    }
  }
}

async function removeCgroups(dir: string): Promise<void> {
  const containersDir = join(dir, 'data', 'containers');
  const ids = existsSync(containersDir) ? readdirSync(containersDir) : [];
  if (ids.length === 0 || !existsSync('/sys/fs/cgroup')) return;
  for (const ctl of readdirSync('/sys/fs/cgroup')) {
    for (const id of ids) {
      const cg = join('/sys/fs/cgroup', ctl, 'docker', id);
      // rmdir of a cgroup fails while processes are still exiting: retry briefly.
      for (let i = 0; i < 20 && existsSync(cg); i++) {
        try {
          rmSync(cg, { recursive: false, force: true });
        } catch {
          try {
            await execFileP('rmdir', [cg]);
          } catch {
            await sleep(50);
          }
        }
      }
    }
  }
}

/** Mount points at or below dir, deepest first (mountinfo field 5 is the mount point; spaces arrive as \040). */
function mountsUnder(dir: string): string[] {
  const lines = readFileSync('/proc/self/mountinfo', 'utf8').split('\n');
  const points = lines
    .map((l) => l.split(' ')[4])
    .filter((p): p is string => p !== undefined)
    .map((p) => p.replace(/\\040/g, ' '))
    .filter((p) => p === dir || p.startsWith(`${dir}/`));
  return [...new Set(points)].sort((a, b) => b.length - a.length);
}

/**
 * dockerd leaves overlay, shm and netns mounts (and overlay2's private self-bind) under its roots
 * when it dies hard; rm -rf cannot remove a mount point. Lazy-unmount them deepest first.
 */
async function unmountUnder(dir: string): Promise<void> {
  for (let round = 0; round < 5; round++) {
    const points = mountsUnder(dir);
    if (points.length === 0) return;
    for (const p of points) {
      try {
        await execFileP('umount', ['-l', p]);
      } catch {
        // may already be gone via a parent's lazy unmount
      }
    }
  }
}

async function removeHostDir(dir: string): Promise<void> {
  killLeftovers(dir);
  await removeCgroups(dir);
  await unmountUnder(dir);
  rmSync(dir, { recursive: true, force: true });
}

/**
 * Reap host dirs of earlier test processes that died without cleaning up. A dir is stale when its
 * owner (the test process that started it) is gone; dirs of live owners (other test files or other
 * people's runs going on right now) are left alone.
 */
export async function reapStaleHosts(): Promise<string[]> {
  const reaped: string[] = [];
  for (const entry of readdirSync('/tmp')) {
    const dir = join('/tmp', entry);
    if (!dir.startsWith(HOST_DIR_PREFIX)) continue;
    const owner = readPid(join(dir, OWNER_FILE));
    if (owner !== undefined && isAlive(owner)) continue;
    if (owner === undefined && !existsSync(join(dir, 'd.sock')) && !existsSync(join(dir, 'data'))) continue;
    const dockerd = readPid(join(dir, 'dockerd.pid'));
    if (dockerd !== undefined && isAlive(dockerd)) {
      killIfOurs(dockerd, dir, 'SIGKILL');
      await sleep(100);
    }
    await removeHostDir(dir);
    reaped.push(dir);
  }
  return reaped;
}

async function ping(socketPath: string): Promise<boolean> {
  const docker = new Docker({ socketPath, timeout: 2000 });
  try {
    await docker.ping();
    return true;
  } catch {
    return false;
  }
}

function waitExit(child: ChildProcess, pid: number, timeoutMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null || !isAlive(pid)) return resolve(true);
    const timer = setTimeout(() => {
      child.off('exit', onExit);
      resolve(!isAlive(pid));
    }, timeoutMs);
    const onExit = (): void => {
      clearTimeout(timer);
      resolve(true);
    };
    child.once('exit', onExit);
  });
}

function tail(file: string, lines = 30): string {
  try {
    return readFileSync(file, 'utf8').trim().split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}

interface DockerdPaths {
  readonly dir: string;
  readonly socketPath: string;
  readonly dataRoot: string;
  readonly execRoot: string;
  readonly pidFile: string;
  readonly logPath: string;
  readonly configFile: string;
}

/** Spawn dockerd on `p` and wait until it answers /_ping; on failure it is killed and the log tail thrown. */
async function launchDockerd(p: DockerdPaths, name: string, startTimeoutMs: number): Promise<{ child: ChildProcess; pid: number }> {
  const args = [
    '--data-root', p.dataRoot,
    '--exec-root', p.execRoot,
    '--pidfile', p.pidFile,
    '--config-file', p.configFile,
    '-H', `unix://${p.socketPath}`,
    '--bridge=none', '--iptables=false', '--ip-masq=false', '--ip-forward=false', '--ip6tables=false',
    '--storage-driver', 'overlay2',
    // dockerd stops running containers on shutdown with this timeout; tests want it quick.
    '--shutdown-timeout', '3',
  ];
  const logFd = openSync(p.logPath, 'a');
  let child: ChildProcess;
  try {
    child = spawn(toolPath('dockerd'), args, { detached: true, stdio: ['ignore', logFd, logFd] });
  } finally {
    closeSync(logFd);
  }
  child.unref();
  const pid = child.pid;
  if (pid === undefined) throw new Error(`dockerd for ${name} did not start (see ${p.logPath})`);

  const deadline = Date.now() + startTimeoutMs;
  while (Date.now() < deadline) {
    if (child.exitCode !== null || child.signalCode !== null) break;
    if (existsSync(p.socketPath) && (await ping(p.socketPath))) return { child, pid };
    await sleep(100);
  }
  if (isAlive(pid)) killIfOurs(pid, p.dir, 'SIGKILL');
  throw new Error(`dockerd for ${name} did not answer /_ping:\n${tail(p.logPath)}`);
}

/**
 * Start one dockerd as a separate host and wait until it answers /_ping. Each dockerd spawns its
 * own managed containerd (socket under its exec root): verified to run 2–3 side by side.
 */
export async function startDockerHost(options: StartDockerHostOptions = {}): Promise<DockerHost> {
  await reapStaleHosts();
  const name = options.name ?? 'host';
  const startTimeoutMs = options.startTimeoutMs ?? 30_000;
  const dir = mkdtempSync(HOST_DIR_PREFIX);
  writeFileSync(join(dir, OWNER_FILE), `${process.pid}\n`);
  const paths: DockerdPaths = {
    dir,
    socketPath: join(dir, 'd.sock'),
    dataRoot: join(dir, 'data'),
    execRoot: join(dir, 'x'),
    pidFile: join(dir, 'dockerd.pid'),
    logPath: join(dir, 'dockerd.log'),
    // An explicit empty config file: dockerd otherwise reads /etc/docker/daemon.json, whose settings
    // (hosts, data-root, bridge) would conflict with the flags or with other hosts.
    configFile: join(dir, 'daemon.json'),
  };
  writeFileSync(paths.configFile, '{}\n');
  let child: ChildProcess;
  let pid: number;
  try {
    ({ child, pid } = await launchDockerd(paths, name, startTimeoutMs));
  } catch (err) {
    await removeHostDir(dir).catch(() => undefined);
    throw err;
  }

  let stopped = false;
  let destroyed = false;
  const stop = async (): Promise<void> => {
    if (stopped) return;
    stopped = true;
    if (isAlive(pid)) {
      try {
        process.kill(pid, 'SIGTERM');
      } catch {
        // already gone
      }
      // dockerd stops its containers (up to --shutdown-timeout each, in parallel) and its containerd.
      if (!(await waitExit(child, pid, 20_000))) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // already gone
        }
        await waitExit(child, pid, 5_000);
      }
    }
    killLeftovers(dir);
  };
  const destroy = async (): Promise<void> => {
    if (destroyed) return;
    destroyed = true;
    await stop();
    await removeHostDir(dir);
  };
  const wipe = async (): Promise<void> => {
    if (destroyed) throw new Error(`${name} is destroyed`);
    stopped = true;
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // already gone
    }
    await waitExit(child, pid, 5_000);
    // What the killed dockerd left (containerd, shims, container processes and their cgroups, found
    // through the data root), then the mounts under the roots, then the roots themselves.
    killLeftovers(dir);
    await removeCgroups(dir);
    for (const root of [paths.dataRoot, paths.execRoot]) {
      await unmountUnder(root);
      rmSync(root, { recursive: true, force: true });
    }
    rmSync(paths.pidFile, { force: true });
  };
  const restart = async (): Promise<void> => {
    if (destroyed) throw new Error(`${name} is destroyed`);
    if (!stopped) throw new Error(`${name}: restart() of a running dockerd (stop() or wipe() it first)`);
    ({ child, pid } = await launchDockerd(paths, name, startTimeoutMs));
    stopped = false;
  };
  return {
    name,
    dir,
    socketPath: paths.socketPath,
    dataRoot: paths.dataRoot,
    execRoot: paths.execRoot,
    pidFile: paths.pidFile,
    logPath: paths.logPath,
    docker: new Docker({ socketPath: paths.socketPath }),
    get pid() {
      return pid;
    },
    stop,
    destroy,
    wipe,
    restart,
  };
}

/** The name startDockerHosts gives its i-th host: host-a, host-b, … */
export function dockerHostName(i: number): string {
  return `host-${String.fromCharCode(97 + i)}`;
}

/** Start n hosts in parallel (named host-a, host-b, …); if one fails, the others are destroyed. */
export async function startDockerHosts(n: number): Promise<DockerHost[]> {
  const names = Array.from({ length: n }, (_, i) => dockerHostName(i));
  const results = await Promise.allSettled(names.map((name) => startDockerHost({ name })));
  const hosts = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
  const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) {
    await destroyAll(hosts);
    throw failed.reason;
  }
  return hosts;
}

/** Destroy every host, never throwing on the first failure (for afterAll). */
export async function destroyAll(hosts: readonly (DockerHost | undefined)[]): Promise<void> {
  const results = await Promise.allSettled(hosts.map((h) => h?.destroy()));
  const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) throw failed.reason;
}
