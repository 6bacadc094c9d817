// Exec through the fleet (R-I9), control-plane end: a process in a member container on the member's
// CURRENT placement, for a runner that holds nothing but the gRPC address. The placement is read
// fresh from the store (group RUNNING, host READY or DRAINING, the generation the caller expects),
// the agent starts the process under a fenced command (epoch, generation, the member's container),
// and the bytes then flow on the exec's own NATS subjects — one stream per exec, each frame
// numbered, so a lost frame ends the exec (UNAVAILABLE exec_transport_lost) rather than corrupting
// it. Why NATS and not a stream the control plane opens to the agent: agents already hold exactly
// one authenticated connection, to NATS, with per-host permissions (R-I2); a second listener on
// every host would need its own certificates, ports and firewall rules, and the control plane
// replica that serves the runner would have to reach every host directly.
// Flow control end to end, no unbounded queue: the agent sends output only against credit; this
// side grants credit as the consumer (the gRPC stream, itself behind HTTP/2 flow control) passes
// output on (`consumed`), so at most one window per exec is ever in memory. A host that becomes
// SUSPECT/DEAD/REMOVED or changes epoch mid-stream ends the exec UNAVAILABLE host_fenced.
// RunTurn also runs execs on a member's turn process (the CLI kept between turns, exec-sessions.ts
// on the agent): `turnProcess` starts one or attaches to one, and `detach` ends the turn's exec
// while the process stays.
import { randomUUID } from 'node:crypto';
import type { NatsConnection, Subscription } from '@nats-io/transport-node';
import { AgentSubjects } from '../core/agent-subjects.ts';
import { Fenced, InvalidArgument, NotFound, PreconditionFailed, Unavailable, type FleetError, type Reason } from '../core/index.ts';
import type { ExecEvent, ExecExitView, ExecSession, ExecStartInput, ExecStartedView } from '../core/exec-port.ts';
import { ExecAgentFrame, ExecControlFrame, TurnProcessMode } from '../gen/sandboxfleet/v1/agent.ts';
import { ExecEnd, ExecStream } from '../gen/sandboxfleet/v1/exec.ts';
import type { ControlPlaneDeps } from './state.ts';
import { Keys } from './keys.ts';

export type ExecRelayDeps = Pick<ControlPlaneDeps, 'config' | 'fleet' | 'groups' | 'hosts' | 'agents' | 'metrics' | 'logger' | 'now'>;

/** Output bytes in flight per exec (agent → consumer): the only buffer, and its bound. */
export const EXEC_WINDOW_BYTES = 1024 * 1024;
const DEFAULT_OUTPUT_LIMIT = 64 * 1024 * 1024;
const MAX_OUTPUT_LIMIT = 4 * 1024 * 1024 * 1024;
const MAX_TIMEOUT_MS = 24 * 3_600_000;
const DEFAULT_GRACE_MS = 2_000;
/** The agent cancels an exec whose control plane is silent this long; keepalives go 3× as often. */
const IDLE_TIMEOUT_MS = 30_000;
/** A stdin frame's payload (the API server takes messages of at most 256 KiB, envelope included). */
const MAX_STDIN_FRAME = 128 * 1024;

const END_KIND: Record<number, ExecExitView['end']> = {
  [ExecEnd.EXITED]: 'exited',
  [ExecEnd.CANCELLED]: 'cancelled',
  [ExecEnd.DEADLINE]: 'deadline',
  [ExecEnd.OUTPUT_LIMIT]: 'output_limit',
  [ExecEnd.DETACHED]: 'detached',
};

function check(input: ExecStartInput): void {
  const bad = (field: string, why: string): never => {
    throw new InvalidArgument('out_of_range', `${field}: ${why}`, { details: { field } });
  };
  if (!Array.isArray(input.argv) || input.argv.length === 0 || input.argv.length > 256) bad('argv', '1..256 entries');
  if (input.argv.reduce((n, a) => n + Buffer.byteLength(a), 0) > 128 * 1024) bad('argv', 'at most 128 KiB in all');
  if (input.env.length > 64 || input.env.some((e) => !/^[A-Za-z_][A-Za-z0-9_]{0,127}$/.test(e.name) || e.value.length > 32 * 1024)) bad('env', 'at most 64 entries, names [A-Za-z_][A-Za-z0-9_]*, values up to 32 KiB');
  if (input.workingDir !== '' && (!input.workingDir.startsWith('/') || input.workingDir.length > 4096)) bad('workingDir', 'an absolute path');
  if (!Number.isSafeInteger(input.timeoutMs) || input.timeoutMs < 0 || input.timeoutMs > MAX_TIMEOUT_MS) bad('timeoutMs', `0..${MAX_TIMEOUT_MS}`);
  if (!Number.isSafeInteger(input.outputLimitBytes) || input.outputLimitBytes < 0 || input.outputLimitBytes > MAX_OUTPUT_LIMIT) bad('outputLimitBytes', `0..${MAX_OUTPUT_LIMIT}`);
  if (!Number.isSafeInteger(input.cancelGraceMs) || input.cancelGraceMs < 0 || input.cancelGraceMs > 60_000) bad('cancelGraceMs', '0..60000');
  if (!Number.isSafeInteger(input.expectedGeneration) || input.expectedGeneration < 0) bad('expectedGeneration', 'a generation or 0');
  const tp = input.turnProcess;
  if (tp !== undefined) {
    if (!input.stdin) bad('stdin', 'a turn process takes its turns on stdin');
    if (tp.mode === 'start' && !/^[A-Za-z0-9_-]{1,128}$/.test(tp.commandDigest)) bad('turnProcess', 'commandDigest must be [A-Za-z0-9_-]{1,128}');
    if (tp.mode === 'attach' && !/^[a-z0-9-]{1,32}$/.test(tp.processId)) bad('turnProcess', 'processId must be [a-z0-9-]{1,32}');
  }
}

class RelaySession implements ExecSession {
  readonly #queue: ExecEvent[] = [];
  #wake: (() => void) | undefined;
  #error: FleetError<Reason> | undefined;
  #finished = false;
  #inSeq = 0;
  #outSeq = 0;
  /** Output passed to the consumer and not yet granted back to the agent. */
  #consumedSinceGrant = 0;
  #outputBytes = 0;
  #stdinCredit = 0;
  #endOverride: ExecExitView['end'] | undefined;
  /** The caller went away: output is dropped (and credited) until the exit. */
  #discard = false;
  readonly #timers: NodeJS.Timeout[] = [];
  #unwatch: (() => void) | undefined;
  #sub: Subscription | undefined;

  constructor(
    private readonly deps: ExecRelayDeps,
    private readonly nc: NatsConnection,
    readonly started: ExecStartedView,
    private readonly limit: number,
    private readonly graceMs: number,
  ) {}

  /** Wire the session: frames in, keepalives out, host fencing, deadline, the caller's signal. */
  attach(sub: Subscription, timeoutMs: number, signal: AbortSignal): void {
    this.#sub = sub;
    const keepalive = setInterval(() => this.#control({ $case: 'keepalive', value: true }), IDLE_TIMEOUT_MS / 3);
    keepalive.unref?.();
    this.#timers.push(keepalive);
    if (timeoutMs > 0) {
      const t = setTimeout(() => this.#stop('deadline'), timeoutMs);
      t.unref?.();
      this.#timers.push(t);
    }
    this.#unwatch = this.deps.fleet.onHostChange((_key, _before, after) => {
      if (after === undefined || after.hostId !== this.started.hostId) return;
      const { state, epoch } = after.lifecycle;
      if (epoch !== this.started.hostEpoch || (state !== 'READY' && state !== 'DRAINING')) {
        this.#control({ $case: 'cancel', value: { graceMs: this.graceMs } });
        this.#fail(new Unavailable('host_fenced', `host ${this.started.hostId} is ${state} at epoch ${epoch} (the exec ran at epoch ${this.started.hostEpoch})`, { details: { hostId: this.started.hostId, state } }));
      }
    });
    signal.addEventListener('abort', () => {
      this.#discard = true;
      this.#queue.length = 0;
      this.cancel();
    }, { once: true });
  }

  /** A frame from the agent. */
  frame(data: Uint8Array): void {
    if (this.#finished) return;
    let f: ExecAgentFrame;
    try {
      f = ExecAgentFrame.decode(data);
    } catch {
      return this.#lost('an undecodable frame');
    }
    if (f.seq !== this.#inSeq + 1) return this.#lost(`frame ${f.seq} after ${this.#inSeq}`);
    this.#inSeq = f.seq;
    const body = f.frame;
    if (body === undefined) return;
    switch (body.$case) {
      case 'output': {
        if (this.#endOverride === 'output_limit' || this.#discard) {
          // Nobody will read it: credit it back at once so the dying process is never blocked on a full pipe.
          this.consumed(body.value.data.length);
          return;
        }
        let bytes = body.value.data;
        const room = this.limit - this.#outputBytes;
        if (bytes.length >= room) {
          bytes = bytes.subarray(0, room);
          this.#stop('output_limit');
        }
        this.#outputBytes += bytes.length;
        if (bytes.length > 0) this.#push({ kind: 'output', stream: body.value.stream === ExecStream.STDERR ? 'stderr' : 'stdout', data: bytes });
        return;
      }
      case 'stdinCredit':
        this.#stdinCredit += Math.max(0, body.value);
        this.#push({ kind: 'stdin_credit', bytes: Math.max(0, body.value) });
        return;
      case 'exit': {
        const e = body.value;
        const exit: ExecExitView = { end: this.#endOverride ?? END_KIND[e.end] ?? 'exited', exitCode: e.exitCode, stdoutBytes: e.stdoutBytes, stderrBytes: e.stderrBytes, durationMs: e.durationMs };
        this.deps.metrics.execs.inc({ end: exit.end });
        this.#push({ kind: 'exit', exit });
        this.#close();
        return;
      }
      case 'error':
        return this.#lost(`the host reported: ${body.value}`);
    }
  }

  #lost(why: string): void {
    this.#control({ $case: 'cancel', value: { graceMs: this.graceMs } });
    this.#fail(new Unavailable('exec_transport_lost', `exec ${this.started.execId} on ${this.started.hostId}: ${why}`, { details: { hostId: this.started.hostId } }));
  }

  #fail(err: FleetError<Reason>): void {
    if (this.#finished) return;
    this.deps.metrics.execs.inc({ end: err.reason });
    this.#error = err;
    this.#close();
  }

  #close(): void {
    this.#finished = true;
    for (const t of this.#timers) clearInterval(t);
    this.#unwatch?.();
    this.#sub?.unsubscribe();
    this.#wake?.();
  }

  #push(e: ExecEvent): void {
    this.#queue.push(e);
    this.#wake?.();
  }

  #control(frame: NonNullable<ExecControlFrame['frame']>): void {
    if (this.#finished) return;
    try {
      this.nc.publish(AgentSubjects.execIn(this.started.hostId, this.started.execId), ExecControlFrame.encode({ execId: this.started.execId, seq: ++this.#outSeq, frame }).finish());
    } catch (err) {
      this.deps.logger.warn({ err, execId: this.started.execId }, 'exec control frame not sent');
    }
  }

  /** End the process for `why` (its exit reports that reason). */
  #stop(why: 'deadline' | 'output_limit'): void {
    if (this.#endOverride !== undefined) return;
    this.#endOverride = why;
    this.#control({ $case: 'cancel', value: { graceMs: this.graceMs } });
  }

  async *events(): AsyncIterable<ExecEvent> {
    for (;;) {
      const next = this.#queue.shift();
      if (next !== undefined) {
        yield next;
        if (next.kind === 'exit') return;
        continue;
      }
      if (this.#error !== undefined) throw this.#error;
      if (this.#finished) return;
      await new Promise<void>((resolve) => (this.#wake = resolve));
      this.#wake = undefined;
    }
  }

  consumed(bytes: number): void {
    this.#consumedSinceGrant += bytes;
    // Grant back in half-window steps: few credit frames, and never more than a window in flight.
    if (this.#consumedSinceGrant >= EXEC_WINDOW_BYTES / 2) {
      this.#control({ $case: 'outputCredit', value: this.#consumedSinceGrant });
      this.#consumedSinceGrant = 0;
    }
  }

  writeStdin(bytes: Uint8Array): void {
    if (bytes.length > MAX_STDIN_FRAME) throw new InvalidArgument('too_large', `stdin frames are at most ${MAX_STDIN_FRAME} bytes`, { details: { field: 'stdin' } });
    if (bytes.length > this.#stdinCredit) throw new InvalidArgument('stdin_over_credit', `${bytes.length} stdin bytes with ${this.#stdinCredit} of credit`, { details: { field: 'stdin' } });
    this.#stdinCredit -= bytes.length;
    this.#control({ $case: 'stdin', value: Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength) });
  }

  closeStdin(): void {
    this.#control({ $case: 'closeStdin', value: true });
  }

  cancel(graceMs?: number): void {
    if (this.#endOverride === undefined) this.#endOverride = 'cancelled';
    this.#control({ $case: 'cancel', value: { graceMs: graceMs !== undefined && graceMs > 0 ? Math.min(graceMs, 60_000) : this.graceMs } });
  }

  detach(): void {
    if (this.started.processId === undefined) throw new InvalidArgument('malformed', 'only an exec on a turn process can be detached', { details: { field: 'detach' } });
    this.#control({ $case: 'detach', value: true });
  }
}

export class ExecRelay {
  constructor(private readonly deps: ExecRelayDeps, private readonly nc: NatsConnection) {}

  async exec(input: ExecStartInput, signal: AbortSignal): Promise<ExecSession> {
    check(input);
    const { deps } = this;
    const g = (await deps.groups.require(input.groupId)).value;
    const member = g.members.find((m) => m.session.memberId === input.memberId);
    if (member === undefined) throw new NotFound('member_not_found', `member ${input.memberId} not in group ${input.groupId}`, { details: { groupId: input.groupId, memberId: input.memberId } });
    const lc = g.lifecycle;
    if (lc.state !== 'RUNNING') throw new PreconditionFailed('group_not_running', `group ${input.groupId} is ${lc.state}: begin a turn (or open the group) to start it`, { details: { groupId: input.groupId, state: lc.state } });
    if (input.expectedGeneration !== 0 && input.expectedGeneration !== lc.generation) {
      throw new Fenced('stale_generation', `group ${input.groupId} is at placement generation ${lc.generation}, not ${input.expectedGeneration}`, { details: { groupId: input.groupId, generation: lc.generation } });
    }
    const host = (await deps.hosts.get(lc.hostId))?.value;
    const hostState = host?.lifecycle.state;
    if (host === undefined || (hostState !== 'READY' && hostState !== 'DRAINING')) {
      throw new Unavailable('host_unreachable', `host ${lc.hostId} is ${hostState ?? 'unknown'}`, { details: { hostId: lc.hostId, state: hostState ?? 'unknown' } });
    }
    if (member.containerId === undefined) throw new Unavailable('container_missing', `member ${input.memberId} has no container yet`, { details: { groupId: input.groupId, memberId: input.memberId } });
    const execId = `x-${randomUUID()}`;
    const graceMs = input.cancelGraceMs > 0 ? input.cancelGraceMs : DEFAULT_GRACE_MS;
    // Listen before the agent can speak: its first output may follow the start at once.
    let session: RelaySession | undefined;
    const early: Uint8Array[] = [];
    const sub = this.nc.subscribe(AgentSubjects.execOut(lc.hostId, execId), {
      callback: (err, msg) => {
        if (err) return;
        if (session === undefined) early.push(msg.data);
        else session.frame(msg.data);
      },
    });
    try {
      const res = await deps.agents.send(
        { hostId: lc.hostId, epoch: host.lifecycle.epoch, generation: lc.generation },
        `exec-${execId}`,
        {
          $case: 'execStart',
          value: {
            groupId: input.groupId, memberId: input.memberId, execId, containerId: member.containerId,
            argv: [...input.argv], env: input.env.map((e) => ({ name: e.name, value: e.value })), workingDir: input.workingDir, stdin: input.stdin,
            outputWindowBytes: EXEC_WINDOW_BYTES, idleTimeoutMs: IDLE_TIMEOUT_MS, cancelGraceMs: graceMs,
            turnProcess: input.turnProcess === undefined ? undefined : input.turnProcess.mode === 'start'
              ? { mode: TurnProcessMode.START, processId: '', commandDigest: input.turnProcess.commandDigest }
              : { mode: TurnProcessMode.ATTACH, processId: input.turnProcess.processId, commandDigest: '' },
          },
        },
        'execStart',
        30_000,
      );
      const started: ExecStartedView = {
        execId, hostId: lc.hostId, hostEpoch: host.lifecycle.epoch, generation: lc.generation, containerId: res.containerId, incarnation: String(res.startedAtUnixMs),
        ...(input.turnProcess !== undefined ? { processId: res.processId } : {}),
      };
      session = new RelaySession(deps, this.nc, started, input.outputLimitBytes > 0 ? input.outputLimitBytes : DEFAULT_OUTPUT_LIMIT, graceMs);
      session.attach(sub, input.timeoutMs, signal);
      for (const data of early.splice(0)) session.frame(data);
      // A host that changed before the session watched it: judged once from the model now.
      const now = deps.fleet.host(Keys.host(lc.hostId))?.value;
      if (now !== undefined && now.lifecycle.epoch > host.lifecycle.epoch) session.cancel();
      return session;
    } catch (err) {
      sub.unsubscribe();
      throw err;
    }
  }
}
