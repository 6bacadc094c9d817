// DockerRuntime: the host agent's only way to touch the local Docker engine (dockerode adapter).
// Member containers are created from a PINNED image id (never a tag: a tag can move, and a
// checkpoint restores onto the exact base image it was taken from, R-G3/R-G5), with network 'none'
// by default, resource limits, and identity labels. Operations are idempotent so a retried command
// (after an agent crash or a lost reply) converges instead of failing: create uses a deterministic
// name, start/stop/remove treat "already done" as success. stop() returns the exit evidence a clean
// stop needs (R-G2): exit code, OOM kill, and whether the engine had to escalate to SIGKILL.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type Docker from 'dockerode';
import { DockerRuntimeError, mapEngineError, statusCodeOf } from './errors.ts';
import { Demuxer, demux, type DemuxedOutput } from './stream.ts';
export { ExecFrameParser } from './stream.ts';

/** Labels that identify a member container; the inventory is rebuilt from these (R-H3, R-H6). */
export const LABELS = {
  group: 'sandboxfleet.group',
  member: 'sandboxfleet.member',
  cli: 'sandboxfleet.cli',
  generation: 'sandboxfleet.generation',
  /** Marks throwaway containers (runOnce, attestation probe) so leftovers can be swept. */
  oneshot: 'sandboxfleet.oneshot',
} as const;

const ID_RE = /^[a-z0-9][a-z0-9_.-]{0,63}$/i;
const CLI_RE = /^[a-z][a-z0-9-]{0,31}$/;
const IMAGE_ID_RE = /^sha256:[0-9a-f]{64}$/;
const ENV_KEY_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;
const MAX_ARGS = 256;
const MAX_ARG_BYTES = 64 * 1024;
/** Docker refuses memory limits below 6 MiB. */
const MIN_MEMORY_BYTES = 6 * 1024 * 1024;
const DEFAULT_OUTPUT_LIMIT = 1024 * 1024;

export type NetworkMode = 'none' | 'host';

export interface ResourceLimits {
  readonly memoryBytes?: number;
  /** CPU quota in units of 1e-9 CPUs (Docker's NanoCpus): 1.5 CPUs = 1_500_000_000. */
  readonly nanoCpus?: number;
  readonly pidsLimit?: number;
}

export interface MemberSpec {
  readonly groupId: string;
  readonly memberId: string;
  /** Native agent CLI kind (claude, codex, pi, opencode, kilo, …). */
  readonly cliKind: string;
  /** The group's placement generation; part of the name so a new placement never reuses an old container. */
  readonly placementGeneration: number;
  /** Pinned image id `sha256:<64 hex>`; tags are refused. */
  readonly imageId: string;
  readonly cmd: readonly string[];
  readonly env?: Readonly<Record<string, string>>;
  readonly user?: string;
  readonly workingDir?: string;
  /** 'none' unless a test needs loopback ('host'). Never a bridge: hosts run without one. */
  readonly networkMode?: NetworkMode;
  readonly limits?: ResourceLimits;
}

/** Identity read back from a container's labels. */
export interface MemberIdentity {
  readonly groupId: string;
  readonly memberId: string;
  readonly cliKind: string;
  readonly placementGeneration: number;
}

export type ContainerStatus = 'created' | 'running' | 'paused' | 'restarting' | 'removing' | 'exited' | 'dead';

export interface ContainerInfo {
  readonly id: string;
  /** Name without Docker's leading slash. */
  readonly name: string;
  readonly imageId: string;
  readonly status: ContainerStatus;
  readonly running: boolean;
  readonly exitCode: number;
  readonly oomKilled: boolean;
  /** ISO time, undefined when never started / never finished. */
  readonly startedAt: string | undefined;
  readonly finishedAt: string | undefined;
  readonly labels: Readonly<Record<string, string>>;
  /** Present when the container carries the sandboxfleet identity labels. */
  readonly member: MemberIdentity | undefined;
  readonly storageDriver: string;
  /** overlay2 writable layer directory; undefined for other drivers. */
  readonly upperDir: string | undefined;
}

/** Evidence of how a container stopped: the input to the clean-stop decision (R-G2). */
export interface StopEvidence {
  readonly containerId: string;
  /** The container was not running when stop was called: nothing was observed, so nothing is proven. */
  readonly alreadyStopped: boolean;
  readonly exitCode: number;
  readonly oomKilled: boolean;
  /** The engine escalated to SIGKILL (observed as a `kill` event with signal 9, or exit 137 at/after the grace). */
  readonly engineKilled: boolean;
  /** Signals the engine sent during this stop, from its `kill` events (15 = TERM, 9 = KILL). */
  readonly signalsSent: readonly number[];
  /**
   * The process exited by itself after SIGTERM within the grace: observed in this call, not OOM-
   * killed, not killed by the engine, not exit 137. False whenever that cannot be proven.
   */
  readonly exitedByItself: boolean;
  readonly graceSeconds: number;
  /** Wall time the stop call took. */
  readonly stopMillis: number;
  readonly finishedAt: string | undefined;
}

export interface ExecOptions {
  readonly user?: string;
  readonly env?: Readonly<Record<string, string>>;
  readonly workingDir?: string;
  /** Bound on the wait; on expiry a `timeout` error is thrown (the process itself is not killed). */
  readonly timeoutMs?: number;
  /** Bytes kept per stream (stdout, stderr). */
  readonly maxOutputBytes?: number;
}

/** A started streaming exec (openExec). */
export interface OpenExec {
  readonly stream: import('node:stream').Duplex;
  /** The exec as the engine sees it now: pid on the host, running, exit code once exited. */
  state(): Promise<{ readonly running: boolean; readonly exitCode: number | null; readonly pid: number }>;
}

export interface ExecResult extends DemuxedOutput {
  readonly exitCode: number;
}

export interface RunOnceSpec {
  readonly imageId: string;
  readonly cmd: readonly string[];
  readonly env?: Readonly<Record<string, string>>;
  readonly user?: string;
  readonly networkMode?: NetworkMode;
  /** Bound on the whole run; on expiry the container is killed and a `timeout` error thrown. */
  readonly timeoutMs?: number;
  readonly maxOutputBytes?: number;
}

export interface EngineInfo {
  readonly version: string;
  readonly apiVersion: string;
  readonly storageDriver: string;
  readonly dockerRootDir: string;
  readonly cgroupVersion: string | undefined;
  readonly kernelVersion: string;
}

export interface ImageInfo {
  readonly id: string;
  readonly repoTags: readonly string[];
  readonly repoDigests: readonly string[];
  readonly labels: Readonly<Record<string, string>>;
}

function invalid(message: string): DockerRuntimeError {
  return new DockerRuntimeError('invalid_input', message);
}

function checkId(what: string, value: string): void {
  if (typeof value !== 'string' || !ID_RE.test(value)) throw invalid(`${what} must match ${ID_RE}: ${JSON.stringify(value)}`);
}

function checkImageId(imageId: string): void {
  if (typeof imageId !== 'string' || !IMAGE_ID_RE.test(imageId)) {
    throw invalid(`image must be a pinned id sha256:<64 hex>, not a tag: ${JSON.stringify(imageId)}`);
  }
}

function checkArgs(what: string, args: readonly string[], allowEmpty = false): void {
  if (!Array.isArray(args) || (!allowEmpty && args.length === 0) || args.length > MAX_ARGS) {
    throw invalid(`${what} must have 1..${MAX_ARGS} entries`);
  }
  for (const a of args) {
    if (typeof a !== 'string' || a.includes('\0') || Buffer.byteLength(a) > MAX_ARG_BYTES) throw invalid(`${what}: invalid argument`);
  }
}

function envList(env: Readonly<Record<string, string>> | undefined): string[] | undefined {
  if (env === undefined) return undefined;
  const list = Object.entries(env).map(([k, v]) => {
    if (!ENV_KEY_RE.test(k)) throw invalid(`env name ${JSON.stringify(k)} is invalid`);
    if (typeof v !== 'string' || v.includes('\0')) throw invalid(`env ${k} has an invalid value`);
    return `${k}=${v}`;
  });
  checkArgs('env', list, true);
  return list;
}

function checkPositiveInt(what: string, v: number | undefined, min: number, max: number): void {
  if (v === undefined) return;
  if (!Number.isSafeInteger(v) || v < min || v > max) throw invalid(`${what} must be an integer in [${min}, ${max}]: ${v}`);
}

function checkLimits(limits: ResourceLimits | undefined): void {
  checkPositiveInt('limits.memoryBytes', limits?.memoryBytes, MIN_MEMORY_BYTES, 2 ** 50);
  checkPositiveInt('limits.nanoCpus', limits?.nanoCpus, 1_000_000, 1024 * 1e9);
  checkPositiveInt('limits.pidsLimit', limits?.pidsLimit, 1, 4_194_304);
}

function checkNetwork(mode: NetworkMode | undefined): NetworkMode {
  const m = mode ?? 'none';
  if (m !== 'none' && m !== 'host') throw invalid(`networkMode must be 'none' or 'host': ${String(m)}`);
  return m;
}

/** Deterministic container name of a member at a placement generation. */
export function memberContainerName(groupId: string, memberId: string, placementGeneration: number): string {
  return `sf-${groupId}-${memberId}-g${placementGeneration}`;
}

function dockerTime(t: string | undefined): string | undefined {
  // Docker reports "0001-01-01T00:00:00Z" for never.
  return t === undefined || t.startsWith('0001-') ? undefined : t;
}

function identityOf(labels: Readonly<Record<string, string>>): MemberIdentity | undefined {
  const groupId = labels[LABELS.group];
  const memberId = labels[LABELS.member];
  const cliKind = labels[LABELS.cli];
  const gen = labels[LABELS.generation];
  if (groupId === undefined || memberId === undefined || cliKind === undefined || gen === undefined) return undefined;
  const placementGeneration = Number(gen);
  if (!Number.isSafeInteger(placementGeneration)) return undefined;
  return { groupId, memberId, cliKind, placementGeneration };
}

function toInfo(raw: Docker.ContainerInspectInfo): ContainerInfo {
  const labels = raw.Config?.Labels ?? {};
  const driver = raw.GraphDriver?.Name ?? '';
  return {
    id: raw.Id,
    name: raw.Name.replace(/^\//, ''),
    imageId: raw.Image,
    status: raw.State.Status as ContainerStatus,
    running: raw.State.Running,
    exitCode: raw.State.ExitCode,
    oomKilled: raw.State.OOMKilled,
    startedAt: dockerTime(raw.State.StartedAt),
    finishedAt: dockerTime(raw.State.FinishedAt),
    labels,
    member: identityOf(labels),
    storageDriver: driver,
    // @types/dockerode models devicemapper's Data; overlay2 carries UpperDir there.
    upperDir: driver === 'overlay2' ? (raw.GraphDriver.Data as unknown as Record<string, string> | undefined)?.UpperDir : undefined,
  };
}

async function readAll(stream: NodeJS.ReadableStream): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of stream as AsyncIterable<Buffer | string>) chunks.push(typeof c === 'string' ? Buffer.from(c) : c);
  return Buffer.concat(chunks);
}

function withTimeout<T>(p: Promise<T>, ms: number, what: string, onTimeout?: () => void): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => {
      onTimeout?.();
      reject(new DockerRuntimeError('timeout', `${what} did not finish within ${ms} ms`));
    }, ms);
    p.then(
      (v) => {
        clearTimeout(timer);
        resolve(v);
      },
      (e: unknown) => {
        clearTimeout(timer);
        reject(e);
      },
    );
  });
}

export class DockerRuntime {
  constructor(private readonly docker: Docker) {}

  /**
   * Create a member container (not started). Idempotent: if the deterministic name already exists
   * with the same identity and image, that container is returned (`created: false`); a different
   * container under the name is a `name_conflict`.
   */
  async createMember(spec: MemberSpec): Promise<{ id: string; name: string; created: boolean }> {
    checkId('groupId', spec.groupId);
    checkId('memberId', spec.memberId);
    if (!CLI_RE.test(spec.cliKind)) throw invalid(`cliKind must match ${CLI_RE}: ${JSON.stringify(spec.cliKind)}`);
    checkPositiveInt('placementGeneration', spec.placementGeneration, 0, Number.MAX_SAFE_INTEGER);
    if (spec.placementGeneration === undefined) throw invalid('placementGeneration is required');
    checkImageId(spec.imageId);
    checkArgs('cmd', spec.cmd);
    checkLimits(spec.limits);
    const networkMode = checkNetwork(spec.networkMode);
    const env = envList(spec.env);
    const name = memberContainerName(spec.groupId, spec.memberId, spec.placementGeneration);
    const labels = {
      [LABELS.group]: spec.groupId,
      [LABELS.member]: spec.memberId,
      [LABELS.cli]: spec.cliKind,
      [LABELS.generation]: String(spec.placementGeneration),
    };
    try {
      const c = await this.docker.createContainer({
        name,
        Image: spec.imageId,
        Cmd: [...spec.cmd],
        Env: env,
        User: spec.user,
        WorkingDir: spec.workingDir,
        Labels: labels,
        StopSignal: 'SIGTERM',
        AttachStdin: false,
        AttachStdout: false,
        AttachStderr: false,
        Tty: false,
        NetworkDisabled: networkMode === 'none',
        HostConfig: {
          NetworkMode: networkMode,
          Memory: spec.limits?.memoryBytes,
          // Equal swap limit: no swap beyond the memory limit.
          MemorySwap: spec.limits?.memoryBytes,
          NanoCpus: spec.limits?.nanoCpus,
          PidsLimit: spec.limits?.pidsLimit,
          RestartPolicy: { Name: 'no' },
          AutoRemove: false,
          Init: false,
        },
      });
      return { id: c.id, name, created: true };
    } catch (err) {
      if (statusCodeOf(err) !== 409) throw mapEngineError(err, `create ${name}`, 'image_not_found');
    }
    const existing = await this.inspect(name);
    const same =
      existing.member?.groupId === spec.groupId &&
      existing.member.memberId === spec.memberId &&
      existing.member.cliKind === spec.cliKind &&
      existing.member.placementGeneration === spec.placementGeneration &&
      existing.imageId === spec.imageId;
    if (!same) throw new DockerRuntimeError('name_conflict', `container ${name} exists with another identity or image (${existing.id})`);
    return { id: existing.id, name, created: false };
  }

  /** Start; a running container counts as success. */
  async start(id: string): Promise<{ alreadyRunning: boolean }> {
    try {
      await this.docker.getContainer(id).start();
      return { alreadyRunning: false };
    } catch (err) {
      if (statusCodeOf(err) === 304) return { alreadyRunning: true };
      throw mapEngineError(err, `start ${id}`);
    }
  }

  /**
   * Stop with SIGTERM and a grace, then SIGKILL (Docker's own escalation), and return the evidence.
   * A container already stopped yields `alreadyStopped` and `exitedByItself: false`: its earlier
   * exit was not observed here, so a clean stop cannot be claimed from it (R-G2).
   */
  async stop(id: string, graceSeconds: number): Promise<StopEvidence> {
    checkPositiveInt('graceSeconds', graceSeconds, 0, 3600);
    const before = await this.inspect(id);
    if (!before.running) return this.evidence(before, true, false, [], graceSeconds, 0);
    const startMs = Date.now();
    const t0 = performance.now();
    let raced = false;
    try {
      await this.docker.getContainer(before.id).stop({ t: graceSeconds });
    } catch (err) {
      // 304: it exited between our inspect and the stop: we did not stop it.
      if (statusCodeOf(err) === 304) raced = true;
      else throw mapEngineError(err, `stop ${id}`);
    }
    const stopMillis = Math.round(performance.now() - t0);
    const after = await this.inspect(before.id);
    if (raced) return this.evidence(after, true, false, [], graceSeconds, stopMillis);
    const untilMs = Date.now();
    // The wall clock was stepped back during the stop (NTP): the window is taken back from now by
    // the monotonic time the stop lasted (and a second), so `since` is never after `until`, which the
    // engine refuses (a stop failed for it and its group stayed STOPPING: chaos seed 4108).
    const sinceMs = untilMs - stopMillis < startMs ? Math.max(0, untilMs - stopMillis - 1_000) : startMs;
    const signals = await this.killSignals(before.id, sinceMs, untilMs);
    // Events are authoritative; the timing rule covers an event the engine may not have kept.
    const engineKilled = signals.includes(9) || (after.exitCode === 137 && stopMillis >= graceSeconds * 1000);
    return this.evidence(after, false, engineKilled, signals, graceSeconds, stopMillis);
  }

  private evidence(
    info: ContainerInfo,
    alreadyStopped: boolean,
    engineKilled: boolean,
    signalsSent: readonly number[],
    graceSeconds: number,
    stopMillis: number,
  ): StopEvidence {
    const exitedByItself = !alreadyStopped && !info.running && !engineKilled && !info.oomKilled && info.exitCode !== 137;
    return {
      containerId: info.id,
      alreadyStopped,
      exitCode: info.exitCode,
      oomKilled: info.oomKilled,
      engineKilled,
      signalsSent,
      exitedByItself,
      graceSeconds,
      stopMillis,
      finishedAt: info.finishedAt,
    };
  }

  /** Signals the engine sent to a container between two times, from its `kill` events (attribute `signal`). */
  private async killSignals(id: string, sinceMs: number, untilMs: number): Promise<number[]> {
    // `until` must not be in the future, or the engine keeps the stream open until then.
    const stream = await this.docker.getEvents({
      since: Math.floor(sinceMs / 1000),
      until: (untilMs / 1000).toFixed(3) as unknown as number,
      filters: { type: ['container'], container: [id], event: ['kill'] },
    });
    const text = (await withTimeout(readAll(stream), 10_000, 'reading engine events')).toString('utf8');
    const signals: number[] = [];
    for (const line of text.split('\n')) {
      if (!line.trim()) continue;
      const ev = JSON.parse(line) as { timeNano?: number; Actor?: { Attributes?: Record<string, string> } };
      if ((ev.timeNano ?? 0) < sinceMs * 1e6) continue;
      const sig = ev.Actor?.Attributes?.signal;
      if (sig !== undefined) signals.push(Number(sig));
    }
    return signals;
  }

  /** Remove (forcefully if asked). Already gone counts as success (`removed: false`). */
  async remove(id: string, options: { force?: boolean } = {}): Promise<{ removed: boolean }> {
    try {
      await this.docker.getContainer(id).remove({ force: options.force ?? false, v: true });
      return { removed: true };
    } catch (err) {
      if (statusCodeOf(err) === 404) return { removed: false };
      throw mapEngineError(err, `remove ${id}`);
    }
  }

  /** Remove throwaway containers a crashed agent may have left (runOnce removes its own otherwise). */
  async removeOneshots(): Promise<number> {
    let ids: string[];
    try {
      ids = (await this.docker.listContainers({ all: true, filters: { label: [LABELS.oneshot] } })).map((c) => c.Id);
    } catch (err) {
      throw mapEngineError(err, 'list containers');
    }
    const removed = await Promise.all(ids.map((id) => this.remove(id, { force: true })));
    return removed.filter((r) => r.removed).length;
  }

  /** Inspect by id or name; `container_not_found` when absent. */
  async inspect(id: string): Promise<ContainerInfo> {
    try {
      return toInfo(await this.docker.getContainer(id).inspect());
    } catch (err) {
      throw mapEngineError(err, `inspect ${id}`);
    }
  }

  /** Inspect, or undefined when the container does not exist. */
  async find(id: string): Promise<ContainerInfo | undefined> {
    try {
      return await this.inspect(id);
    } catch (err) {
      if (err instanceof DockerRuntimeError && err.reason === 'container_not_found') return undefined;
      throw err;
    }
  }

  /** Every sandboxfleet member container on this engine, or only one group's (any state). */
  async listMembers(groupId?: string): Promise<ContainerInfo[]> {
    if (groupId !== undefined) checkId('groupId', groupId);
    const label = groupId === undefined ? LABELS.group : `${LABELS.group}=${groupId}`;
    let ids: string[];
    try {
      ids = (await this.docker.listContainers({ all: true, filters: { label: [label] } })).map((c) => c.Id);
    } catch (err) {
      throw mapEngineError(err, 'list containers');
    }
    const infos = await Promise.all(ids.map((id) => this.find(id)));
    // A container removed between list and inspect is simply gone.
    return infos.filter((i): i is ContainerInfo => i !== undefined);
  }

  /** The overlay2 upper dir (the writable layer) of a container; exists from create on and survives stop. */
  async upperDir(id: string): Promise<string> {
    const info = await this.inspect(id);
    if (info.upperDir === undefined) {
      throw new DockerRuntimeError('unsupported_storage_driver', `container ${id} uses storage driver ${info.storageDriver || '(none)'}, not overlay2`);
    }
    return info.upperDir;
  }

  /**
   * Start a streaming process in a running container (R-I9): the raw hijacked connection (Docker's
   * multiplexed stdout/stderr frames one way — see ExecFrameParser in stream.ts — stdin the other;
   * end() closes stdin), plus the exec's state (host pid, running, exit code) on demand. The caller
   * owns flow control: pause() the stream to stop reading when its consumer is full.
   */
  async openExec(id: string, cmd: readonly string[], options: { env?: Readonly<Record<string, string>>; workingDir?: string; stdin: boolean }): Promise<OpenExec> {
    checkArgs('cmd', cmd);
    try {
      const ex = await this.docker.getContainer(id).exec({
        Cmd: [...cmd],
        Env: envList(options.env),
        WorkingDir: options.workingDir || undefined,
        AttachStdin: options.stdin,
        AttachStdout: true,
        AttachStderr: true,
        Tty: false,
      });
      const stream = (await ex.start({ hijack: true, stdin: options.stdin })) as unknown as import('node:stream').Duplex;
      return {
        stream,
        state: async () => {
          const st = await ex.inspect();
          return { running: st.Running, exitCode: st.ExitCode, pid: st.Pid };
        },
      };
    } catch (err) {
      throw mapEngineError(err, `exec in ${id}`);
    }
  }

  /** Run a command in a running container and capture its output and exit code (bounded). */
  async exec(id: string, cmd: readonly string[], options: ExecOptions = {}): Promise<ExecResult> {
    checkArgs('cmd', cmd);
    const env = envList(options.env);
    const timeoutMs = options.timeoutMs ?? 30_000;
    const limit = options.maxOutputBytes ?? DEFAULT_OUTPUT_LIMIT;
    let stream: NodeJS.ReadWriteStream | undefined;
    try {
      const ex = await this.docker.getContainer(id).exec({
        Cmd: [...cmd],
        Env: env,
        User: options.user,
        WorkingDir: options.workingDir,
        AttachStdin: false,
        AttachStdout: true,
        AttachStderr: true,
        Tty: false,
      });
      const s = (await ex.start({ hijack: true, stdin: false })) as NodeJS.ReadWriteStream;
      stream = s;
      const demuxer = new Demuxer(limit);
      const done = new Promise<void>((resolve, reject) => {
        s.on('data', (chunk: Buffer) => demuxer.push(chunk));
        s.on('end', resolve);
        s.on('close', resolve);
        s.on('error', reject);
      });
      await withTimeout(done, timeoutMs, `exec in ${id}`, () => (s as unknown as { destroy(): void }).destroy());
      // The exit code is recorded just after the output stream closes: poll briefly.
      for (let i = 0; i < 50; i++) {
        const state = await ex.inspect();
        if (!state.Running && state.ExitCode !== null) return { exitCode: state.ExitCode, ...demuxer.result() };
        await new Promise((r) => setTimeout(r, 20));
      }
      throw new DockerRuntimeError('timeout', `exec in ${id}: exit code not reported`);
    } catch (err) {
      (stream as unknown as { destroy?(): void } | undefined)?.destroy?.();
      throw mapEngineError(err, `exec in ${id}`);
    }
  }

  /**
   * Run a command to completion in a throwaway container (network none by default) and remove it.
   * Bounded: on timeout the container is killed and removed, and a `timeout` error thrown.
   */
  async runOnce(spec: RunOnceSpec): Promise<ExecResult> {
    checkImageId(spec.imageId);
    checkArgs('cmd', spec.cmd);
    const env = envList(spec.env);
    const networkMode = checkNetwork(spec.networkMode);
    const timeoutMs = spec.timeoutMs ?? 30_000;
    const name = `sf-oneshot-${randomUUID().slice(0, 12)}`;
    let created: Docker.Container | undefined;
    try {
      created = await this.docker.createContainer({
        name,
        Image: spec.imageId,
        Cmd: [...spec.cmd],
        Env: env,
        User: spec.user,
        Labels: { [LABELS.oneshot]: '1' },
        NetworkDisabled: networkMode === 'none',
        HostConfig: { NetworkMode: networkMode, AutoRemove: false, RestartPolicy: { Name: 'no' } },
      });
      const c = created;
      await c.start();
      const { StatusCode } = (await withTimeout(c.wait() as Promise<{ StatusCode: number }>, timeoutMs, `run in ${spec.imageId}`, () => {
        c.kill().catch(() => undefined);
      })) as { StatusCode: number };
      const logs = (await c.logs({ stdout: true, stderr: true, follow: false })) as unknown as Buffer;
      return { exitCode: StatusCode, ...demux(Buffer.isBuffer(logs) ? logs : Buffer.from(logs), spec.maxOutputBytes ?? DEFAULT_OUTPUT_LIMIT) };
    } catch (err) {
      throw mapEngineError(err, `run in ${spec.imageId}`, 'image_not_found');
    } finally {
      if (created) await this.#removeAndWait(created.id);
    }
  }

  /**
   * Force-remove and wait until the engine no longer lists the container (bounded). A remove
   * racing the kill of a timed-out run gets 409 "removal already in progress" and returns early,
   * which would leave a container visible for a moment: "leaves nothing behind" means gone.
   */
  async #removeAndWait(id: string, boundMs = 10_000): Promise<void> {
    const deadline = Date.now() + boundMs;
    const gone = (err: unknown) => statusCodeOf(err) === 404;
    for (;;) {
      try {
        await this.docker.getContainer(id).remove({ force: true, v: true });
        return;
      } catch (err) {
        if (gone(err)) return;
      }
      try {
        await this.docker.getContainer(id).inspect();
      } catch (err) {
        if (gone(err)) return;
      }
      if (Date.now() > deadline) return;
      await sleep(50);
    }
  }

  async engineInfo(): Promise<EngineInfo> {
    try {
      const [version, info] = await Promise.all([this.docker.version(), this.docker.info() as Promise<Record<string, unknown>>]);
      return {
        version: version.Version,
        apiVersion: version.ApiVersion,
        storageDriver: String(info.Driver ?? ''),
        dockerRootDir: String(info.DockerRootDir ?? ''),
        cgroupVersion: info.CgroupVersion === undefined ? undefined : String(info.CgroupVersion),
        kernelVersion: String(info.KernelVersion ?? ''),
      };
    } catch (err) {
      throw mapEngineError(err, 'engine info');
    }
  }

  /** Image metadata by id or reference; `image_not_found` when absent. */
  async imageInfo(ref: string): Promise<ImageInfo> {
    try {
      const raw = await this.docker.getImage(ref).inspect();
      return {
        id: raw.Id,
        repoTags: raw.RepoTags ?? [],
        repoDigests: raw.RepoDigests ?? [],
        labels: raw.Config?.Labels ?? {},
      };
    } catch (err) {
      throw mapEngineError(err, `inspect image ${ref}`, 'image_not_found');
    }
  }
}
