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
// DEAD/REMOVED or changes epoch mid-stream ends the exec UNAVAILABLE host_fenced; SUSPECT does not
// (late heartbeats are not a verdict; see hostFenced).
// Liveness both ways: this side sends a keepalive every third of the idle timeout (the agent cancels
// an exec whose control plane fell silent), and the agent sends its own numbered keepalive as often
// (an ExecAgentFrame stdin_credit of 0), so a lost frame always shows as a gap at the next frame —
// even one lost while the agent waits for credit — and an exec this side hears nothing from for
// the idle timeout ends UNAVAILABLE exec_transport_lost. A cancel (the caller's, the deadline, the
// output limit) that brings no exit within twice the grace plus a margin ends the same way, so no
// exec hangs here on a frame that never comes. A consumer that leaves (`abandon`, the caller's
// signal — also one that aborted before the start answered) cancels the process and credits all it
// still sends back unread, so the process can flush and exit on SIGINT instead of being killed.
// RunTurn also runs execs on a member's turn process (the CLI kept between turns, exec-sessions.ts
// on the agent): `turnProcess` starts one or attaches to one, and `detach` ends the turn's exec
// while the process stays.
import { randomUUID } from 'node:crypto';
import type { NatsConnection, Subscription } from '@nats-io/transport-node';
import { AgentSubjects } from '../core/agent-subjects.ts';
import { Fenced, InvalidArgument, NotFound, PreconditionFailed, Unavailable, transitionGroup, type FleetError, type Reason } from '../core/index.ts';
import type { ExecEvent, ExecExitView, ExecSession, ExecStartInput, ExecStartedView } from '../core/exec-port.ts';
import { ContainerState, ExecAgentFrame, ExecControlFrame, TurnProcessMode } from '../gen/sandboxfleet/v1/agent.ts';
import { ExecEnd, ExecStream } from '../gen/sandboxfleet/v1/exec.ts';
import { CommandIds } from '../wire/agent-protocol.ts';
import { AgentCommandFailed } from './agent-client.ts';
import type { HostRecord } from './records.ts';
import type { ControlPlaneDeps } from './state.ts';
import { Keys } from './keys.ts';

export type ExecRelayDeps = Pick<ControlPlaneDeps, 'config' | 'fleet' | 'groups' | 'hosts' | 'agents' | 'metrics' | 'logger' | 'now'>;

/** Output bytes in flight per exec (agent → consumer): the only buffer, and its bound. */
export const EXEC_WINDOW_BYTES = 1024 * 1024;
const DEFAULT_OUTPUT_LIMIT = 64 * 1024 * 1024;
const MAX_OUTPUT_LIMIT = 4 * 1024 * 1024 * 1024;
const MAX_TIMEOUT_MS = 24 * 3_600_000;
const DEFAULT_GRACE_MS = 2_000;
/**
 * Either side ends an exec it heard nothing from this long; each sends a keepalive three times as
 * often (the agent's: its ExecStartCommand.idle_timeout_ms, which this side sends).
 */
export const EXEC_IDLE_TIMEOUT_MS = 30_000;
/** After a cancel, the exit must come within twice the grace plus this, or the exec is given up. */
const EXIT_MARGIN_MS = 5_000;
/** Credit is granted back in steps of half the window, but at least this often (RunTurn's big window). */
const MAX_GRANT_STEP = 512 * 1024;
const MIN_WINDOW = 64 * 1024;
const MAX_WINDOW = 16 * 1024 * 1024;
const INVENTORY_TIMEOUT_MS = 10_000;
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
  if (input.expectedIncarnation !== undefined && input.expectedIncarnation !== '' && !/^\d{1,16}$/.test(input.expectedIncarnation)) bad('expectedIncarnation', 'a container start time (unix ms, as ExecStarted.incarnation) or empty');
  const w = input.outputWindowBytes;
  if (w !== undefined && (!Number.isSafeInteger(w) || w < MIN_WINDOW || w > MAX_WINDOW)) bad('outputWindowBytes', `${MIN_WINDOW}..${MAX_WINDOW}`);
  const tp = input.turnProcess;
  if (tp !== undefined) {
    if (!input.stdin) bad('stdin', 'a turn process takes its turns on stdin');
    if (tp.mode === 'start' && !/^[A-Za-z0-9_-]{1,128}$/.test(tp.commandDigest)) bad('turnProcess', 'commandDigest must be [A-Za-z0-9_-]{1,128}');
    if (tp.mode === 'attach' && !/^[a-z0-9-]{1,32}$/.test(tp.processId)) bad('turnProcess', 'processId must be [a-z0-9-]{1,32}');
  }
}

/**
 * Why a host no longer runs an exec started at `epoch`, or undefined while it may. SUSPECT is not a
 * verdict (R-H3: heartbeats late, which a control-plane or NATS stall makes of every host at once):
 * the exec goes on, watched by its own frames and keepalives (a host really gone ends it
 * exec_transport_lost at the idle timeout); ending it here would end every turn in flight on the
 * fleet, unconfirmed, at each stall. DEAD, REMOVED, UNATTESTED or another epoch fence it.
 */
function hostFenced(hostId: string, epoch: number, after: HostRecord | undefined): Unavailable | undefined {
  const state = after?.lifecycle.state ?? 'REMOVED';
  const now = after?.lifecycle.epoch ?? 0;
  if (after !== undefined && now === epoch && (state === 'READY' || state === 'DRAINING' || state === 'SUSPECT')) return undefined;
  return new Unavailable('host_fenced', `host ${hostId} is ${state} at epoch ${now} (the exec ran at epoch ${epoch})`, { details: { hostId, state } });
}

/** How often a running plain Exec renews the group's activity (so an idle stop never lands under it). */
const EXEC_ACTIVITY_EVERY_MS = 60_000;

class RelaySession implements ExecSession {
  readonly #queue: ExecEvent[] = [];
  #wake: (() => void) | undefined;
  #error: FleetError<Reason> | undefined;
  #finished = false;
  #inSeq = 0;
  #outSeq = 0;
  /** Output passed to the consumer (or dropped unread) and not yet granted back to the agent. */
  #consumedSinceGrant = 0;
  #outputBytes = 0;
  #stdinCredit = 0;
  #endOverride: ExecExitView['end'] | undefined;
  /** Nobody reads any more: output is dropped (and credited) until the exit. */
  #discard = false;
  /** When the last frame came from the agent (its keepalives come every third of the idle timeout). */
  #lastHeardAt: number;
  /** Armed by the first cancel: the exit must come by then. */
  #exitDue: NodeJS.Timeout | undefined;
  readonly #timers: NodeJS.Timeout[] = [];
  #unwatch: (() => void) | undefined;
  #unlisten: (() => void) | undefined;
  #sub: Subscription | undefined;

  constructor(
    private readonly deps: ExecRelayDeps,
    private readonly nc: NatsConnection,
    readonly started: ExecStartedView,
    private readonly limit: number,
    private readonly graceMs: number,
    private readonly window: number,
    private readonly idleTimeoutMs: number,
  ) {
    this.#lastHeardAt = deps.now();
  }

  /**
   * Wire the session: frames in, keepalives out, liveness, host fencing, deadline, the caller's
   * signal — including a signal that aborted while the start was in flight.
   */
  /** Record activity now and every EXEC_ACTIVITY_EVERY_MS while the exec runs. */
  recordActivity(touch: () => Promise<void>): void {
    void touch();
    const t = setInterval(() => void touch(), EXEC_ACTIVITY_EVERY_MS);
    t.unref?.();
    this.#timers.push(t);
  }

  attach(sub: Subscription, timeoutMs: number, signal: AbortSignal): void {
    this.#sub = sub;
    this.#lastHeardAt = this.deps.now();
    const keepalive = setInterval(() => {
      if (this.deps.now() - this.#lastHeardAt > this.idleTimeoutMs) {
        this.#lost(`nothing heard from the host for ${this.idleTimeoutMs} ms`);
        return;
      }
      this.#control({ $case: 'keepalive', value: true });
    }, this.idleTimeoutMs / 3);
    keepalive.unref?.();
    this.#timers.push(keepalive);
    if (timeoutMs > 0) {
      const t = setTimeout(() => this.#stop('deadline'), timeoutMs);
      t.unref?.();
      this.#timers.push(t);
    }
    this.#unwatch = this.deps.fleet.onHostChange((_key, _before, after) => {
      if (after === undefined || after.hostId !== this.started.hostId) return;
      this.judgeHost(after);
    });
    const onAbort = (): void => this.abandon();
    signal.addEventListener('abort', onAbort, { once: true });
    this.#unlisten = () => signal.removeEventListener('abort', onAbort);
    if (signal.aborted) this.abandon();
  }

  /** Fence the exec if `host` (the host's record now) no longer runs it at its epoch. */
  judgeHost(host: HostRecord | undefined): void {
    const fenced = hostFenced(this.started.hostId, this.started.hostEpoch, host);
    if (fenced === undefined) return;
    this.#control({ $case: 'cancel', value: { graceMs: this.graceMs } });
    this.#fail(fenced);
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
    this.#lastHeardAt = this.deps.now();
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
          // The part past the limit is never passed on: credited back like dropped output.
          this.consumed(bytes.length - room);
          bytes = bytes.subarray(0, room);
          this.#stop('output_limit');
        }
        this.#outputBytes += bytes.length;
        if (bytes.length > 0) this.#push({ kind: 'output', stream: body.value.stream === ExecStream.STDERR ? 'stderr' : 'stdout', data: bytes });
        return;
      }
      case 'stdinCredit':
        // 0 is the agent's keepalive (it has nothing else to say): heard, nothing to pass on.
        if (body.value <= 0) return;
        this.#stdinCredit += body.value;
        this.#push({ kind: 'stdin_credit', bytes: body.value });
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
    if (this.#exitDue !== undefined) clearTimeout(this.#exitDue);
    this.#unwatch?.();
    this.#unlisten?.();
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

  /** Send a cancel; the agent's exit must then come within twice `graceMs` plus a margin. */
  #cancelFrame(graceMs: number): void {
    this.#control({ $case: 'cancel', value: { graceMs } });
    if (this.#exitDue !== undefined || this.#finished) return;
    this.#exitDue = setTimeout(() => this.#lost(`no exit ${2 * graceMs + EXIT_MARGIN_MS} ms after the cancel`), 2 * graceMs + EXIT_MARGIN_MS);
    this.#exitDue.unref?.();
  }

  /** End the process for `why` (its exit reports that reason). */
  #stop(why: 'deadline' | 'output_limit'): void {
    if (this.#endOverride !== undefined) return;
    this.#endOverride = why;
    this.#cancelFrame(this.graceMs);
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
    // Grant back in steps (few credit frames, never more than a window in flight); a step of at
    // most MAX_GRANT_STEP, so a consumer holding part of a window (RunTurn's unfinished line) never
    // keeps the rest from being granted.
    if (this.#consumedSinceGrant >= Math.min(this.window / 2, MAX_GRANT_STEP)) {
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
    this.#cancelFrame(graceMs !== undefined && graceMs > 0 ? Math.min(graceMs, 60_000) : this.graceMs);
  }

  abandon(): void {
    if (this.#finished) return;
    if (!this.#discard) {
      this.#discard = true;
      // What the consumer will never read is credited back, so the process can flush while it ends.
      let unread = 0;
      for (const e of this.#queue.splice(0)) if (e.kind === 'output') unread += e.data.length;
      if (unread > 0) this.consumed(unread);
    }
    this.cancel();
  }

  detach(): void {
    if (this.started.processId === undefined) throw new InvalidArgument('malformed', 'only an exec on a turn process can be detached', { details: { field: 'detach' } });
    this.#control({ $case: 'detach', value: true });
  }
}

export interface ExecRelayOptions {
  /** Liveness bound of each exec, both ways (default EXEC_IDLE_TIMEOUT_MS). */
  readonly idleTimeoutMs?: number;
}

export class ExecRelay {
  readonly #idleTimeoutMs: number;

  constructor(private readonly deps: ExecRelayDeps, private readonly nc: NatsConnection, options: ExecRelayOptions = {}) {
    this.#idleTimeoutMs = options.idleTimeoutMs ?? EXEC_IDLE_TIMEOUT_MS;
  }

  /** The group saw activity now (R-G4: its checkpoints are stale; R-G8: it is not idle). Best effort. */
  async #touch(groupId: string): Promise<void> {
    try {
      await this.deps.groups.transact(groupId, (g) => {
        if (g === undefined || g.lifecycle.state !== 'RUNNING') return undefined;
        const next = transitionGroup(g.lifecycle, { type: 'exec_activity' }, this.deps.now());
        return next.ok ? { record: { ...g, lifecycle: next.value, updatedAtMs: this.deps.now() } } : undefined;
      });
    } catch (err) {
      this.deps.logger.warn({ err, groupId }, 'recording an exec as group activity failed');
    }
  }

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
    const target = { hostId: lc.hostId, epoch: host.lifecycle.epoch, generation: lc.generation };
    const execId = `x-${randomUUID()}`;
    const expected = input.expectedIncarnation !== undefined && input.expectedIncarnation !== '' ? input.expectedIncarnation : undefined;
    const staleIncarnation = (now: string): Fenced => new Fenced('stale_incarnation', `member ${input.memberId}'s container is at incarnation ${now}, not ${expected ?? ''} (it restarted)`, { details: { groupId: input.groupId, memberId: input.memberId, incarnation: now } });
    if (expected !== undefined) {
      // The container run the caller believes in, checked with the host before anything starts
      // (a heartbeat may be older than the restart, so only a fresh inventory can say "not that run").
      const inv = await deps.agents.send(target, CommandIds.inventory(execId, deps.now()), { $case: 'inventory', value: { groupId: input.groupId } }, 'inventory', INVENTORY_TIMEOUT_MS).catch((err: unknown) => {
        throw startRefusal(err, input, expected);
      });
      const c = inv.containers.find((x) => x.groupId === input.groupId && x.memberId === input.memberId && x.placementGeneration === lc.generation);
      const now = c === undefined || c.state !== ContainerState.RUNNING ? '0' : String(c.startedAtUnixMs);
      if (now !== expected) throw staleIncarnation(now);
    }
    const graceMs = input.cancelGraceMs > 0 ? input.cancelGraceMs : DEFAULT_GRACE_MS;
    const window = input.outputWindowBytes ?? EXEC_WINDOW_BYTES;
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
        target,
        `exec-${execId}`,
        {
          $case: 'execStart',
          value: {
            groupId: input.groupId, memberId: input.memberId, execId, containerId: member.containerId,
            argv: [...input.argv], env: input.env.map((e) => ({ name: e.name, value: e.value })), workingDir: input.workingDir, stdin: input.stdin,
            outputWindowBytes: window, idleTimeoutMs: this.#idleTimeoutMs, cancelGraceMs: graceMs,
            // The agent checks it too, at the start itself (the inventory above is a moment older).
            expectedStartedAtUnixMs: expected !== undefined ? Number(expected) : 0,
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
      session = new RelaySession(deps, this.nc, started, input.outputLimitBytes > 0 ? input.outputLimitBytes : DEFAULT_OUTPUT_LIMIT, graceMs, window, this.#idleTimeoutMs);
      session.attach(sub, input.timeoutMs, signal);
      for (const data of early.splice(0)) session.frame(data);
      if (input.recordsActivity !== false) session.recordActivity(() => this.#touch(input.groupId));
      if (expected !== undefined && started.incarnation !== expected) {
        // The container restarted between the check and the start: nothing of it reaches the caller.
        session.abandon();
        throw staleIncarnation(started.incarnation);
      }
      // A host that changed before the session watched it: judged once from the model now, by the
      // same rule as every later change (state and epoch).
      session.judgeHost(deps.fleet.host(Keys.host(lc.hostId))?.value);
      return session;
    } catch (err) {
      if (session === undefined) sub.unsubscribe();
      throw startRefusal(err, input, expected);
    }
  }
}

/** What the agent's refusal of an execStart means to the caller (never an INTERNAL error). */
function startRefusal(err: unknown, input: ExecStartInput, expected: string | undefined): unknown {
  if (!(err instanceof AgentCommandFailed)) return err;
  const details = { groupId: input.groupId, memberId: input.memberId, agentReason: err.reason };
  switch (err.reason) {
    case 'stale_incarnation':
      return new Fenced('stale_incarnation', `member ${input.memberId}'s container restarted since incarnation ${expected ?? ''}: ${err.detail}`, { details });
    case 'stale_epoch':
    case 'stale_generation':
      return new Fenced(err.reason, `the exec was fenced by the host: ${err.detail}`, { details });
    case 'member_not_found':
    case 'group_not_found':
      return new Unavailable('container_missing', `member ${input.memberId}'s container is not there or not running: ${err.detail}`, { details });
    case 'invalid_argument':
      return new InvalidArgument('malformed', `the host refused the exec: ${err.detail}`, { details });
    default:
      return new Unavailable('host_unreachable', `the host could not start the exec (${err.reason}): ${err.detail}`, { details });
  }
}
