// Processes in member containers for the control plane (R-I9): the agent end of an exec. A fenced
// `execStart` command (epoch, generation, the member's container at that generation, running)
// starts a Docker exec; its bytes then flow on the exec's own plain NATS subjects — output frames
// out, control frames (stdin, credits, cancel, keepalive, detach) in — each direction numbered, so a
// lost frame is seen as a gap and ends the exec instead of silently corrupting it.
// Bounded everywhere: output is sent only against credit the control plane granted (the Docker
// stream is paused meanwhile, so the process blocks on a full pipe rather than the agent buffering),
// stdin is accepted only up to the credit this agent granted, frames are at most 128 KiB, and the
// number of sessions is capped; nothing is ever sent beyond the credit, also not while a cancelled
// process flushes (the control plane credits what nobody reads). A control plane that falls silent
// (no keepalive within the idle timeout) or a fenced epoch cancels the process: SIGINT, then SIGTERM
// and SIGKILL after the grace. This side sends its own numbered keepalive (a stdin credit of 0)
// every third of the idle timeout, so the control plane sees a lost frame at the next one and a
// silent host within the timeout, whatever the exec is waiting for.
// Signals go to the exec's whole process group (runc starts every exec in its own session, so the
// exec's pid leads its group and a shell's pipeline and a CLI's tools are in it), never to a bare
// pid: the exec's pid is pinned at its start by its start time and cgroup in the host's /proc
// (hostPID), so a pid reused by another process — on the host or in the container — is never
// signalled; once the leader is gone, the members of its group still in the container are.
//
// Turn processes (RunTurn, R-S1 LIVE): a member's CLI process can be kept between turns. A START
// exec starts it (after ending the member's older idle one: never two on one native session), an
// ATTACH exec streams the next turn on it; `detach` ends the turn's exec and keeps the process.
// At most one per member (keyed by group and member), so their number is bounded by the members
// this host holds (and capped). Between turns its output is discarded (the turn's detector has seen
// the end; nothing a CLI prints between turns belongs to a turn). It ends with its container (stop,
// restart, reclaim, migration away), when its attached exec is cancelled (cancel, deadline, output
// limit, a silent control plane: the turn is not confirmed, so the process is not kept either), on
// a fenced epoch and when the agent stops (cancelAll). The inventory lists the running ones
// (turnProcesses), which is the only evidence the control plane takes for LIVE.
import { randomBytes } from 'node:crypto';
import { readFile, readdir } from 'node:fs/promises';
import type { NatsConnection, Subscription } from '@nats-io/transport-node';
import { AgentSubjects } from '../core/agent-subjects.ts';
import { ExecFrameParser, type DockerRuntime, type OpenExec } from '../docker/runtime.ts';
import { ExecAgentFrame, ExecControlFrame, TurnProcessMode, type ExecStartCommand, type ExecStartResult, type TurnProcessInfo } from '../gen/sandboxfleet/v1/agent.ts';
import { ExecEnd, ExecStream, type ExecExit } from '../gen/sandboxfleet/v1/exec.ts';
import type { Logger } from '../observability/logger.ts';
import { failed, refused } from './command-error.ts';

/** Largest output payload per frame (well under NATS's default 1 MiB max payload). */
export const EXEC_FRAME_BYTES = 128 * 1024;
/** Stdin bytes this agent lets the control plane have in flight. */
const STDIN_WINDOW = 1024 * 1024;
/** Output credit assumed when the command names none, and the most a command may ask for. */
const DEFAULT_OUTPUT_WINDOW = 1024 * 1024;
const MAX_OUTPUT_WINDOW = 16 * 1024 * 1024;
const MAX_SESSIONS = 256;
/** Turn processes kept at once (one per member: the host's member count bounds them first). */
const MAX_TURN_PROCESSES = 512;
const MAX_ARGV = 256;
const MAX_ARGV_BYTES = 128 * 1024;
const MAX_ENV = 64;
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/;
const PROCESS_ID = /^[a-z0-9-]{1,32}$/;
const DIGEST = /^[A-Za-z0-9_-]{1,128}$/;

export interface ExecSessionsDeps {
  readonly nc: NatsConnection;
  readonly hostId: string;
  readonly runtime: DockerRuntime;
  readonly logger: Logger;
  readonly nowMs: () => number;
}

function validate(cmd: ExecStartCommand): void {
  const tp = cmd.turnProcess;
  if (tp === undefined || tp.mode === TurnProcessMode.START) {
    if (cmd.argv.length === 0 || cmd.argv.length > MAX_ARGV) throw refused('invalid_argument', `argv must have 1..${MAX_ARGV} entries`);
    if (cmd.argv.reduce((n, a) => n + Buffer.byteLength(a), 0) > MAX_ARGV_BYTES) throw refused('invalid_argument', `argv exceeds ${MAX_ARGV_BYTES} bytes`);
    if (cmd.argv.some((a) => a.includes('\0'))) throw refused('invalid_argument', 'argv entries may not contain NUL');
  }
  if (cmd.env.length > MAX_ENV || cmd.env.some((e) => !ENV_NAME.test(e.name) || e.value.length > 32 * 1024 || e.value.includes('\0'))) throw refused('invalid_argument', 'env entries are bounded names and values');
  if (cmd.workingDir !== '' && (!cmd.workingDir.startsWith('/') || cmd.workingDir.length > 4096 || cmd.workingDir.includes('\0'))) throw refused('invalid_argument', 'workingDir must be an absolute path');
  try {
    AgentSubjects.execIn('host-x', cmd.execId);
  } catch {
    throw refused('invalid_argument', 'execId must be [a-z0-9-]{8,64}');
  }
  if (tp !== undefined) {
    if (!cmd.stdin) throw refused('invalid_argument', 'a turn process takes its turns on stdin');
    if (tp.mode === TurnProcessMode.START && !DIGEST.test(tp.commandDigest)) throw refused('invalid_argument', 'command_digest must be [A-Za-z0-9_-]{1,128}');
    else if (tp.mode === TurnProcessMode.ATTACH && !PROCESS_ID.test(tp.processId)) throw refused('invalid_argument', 'process_id must be [a-z0-9-]{1,32}');
    else if (tp.mode !== TurnProcessMode.START && tp.mode !== TurnProcessMode.ATTACH) throw refused('invalid_argument', 'turn_process.mode must be START or ATTACH');
  }
}

/** What a session does with its process: a one-shot exec it owns, or the turn process it is attached to. */
interface SessionIo {
  readonly turn: boolean;
  pause(): void;
  resume(): void;
  write(data: Buffer, done: () => void): void;
  endInput(): void;
  state(): Promise<{ readonly running: boolean; readonly exitCode: number | null; readonly pid: number }>;
  /** Signal the process's group (ProcessGroup.signal). */
  signal(sig: NodeJS.Signals): Promise<boolean>;
  /** The session is over: a one-shot exec's stream is destroyed, a turn process is detached (kept if it runs). */
  release(): void;
}

/** A process as the host's /proc shows it. */
interface ProcStat {
  readonly pgrp: number;
  /** Clock ticks after boot: with the pid, names one process for the life of the host. */
  readonly startTime: string;
}

/** /proc/<pid>/stat, or undefined if no such process (or no /proc of the host's pid namespace). */
export async function procStat(pid: number, procRoot = '/proc'): Promise<ProcStat | undefined> {
  let text: string;
  try {
    text = await readFile(`${procRoot}/${pid}/stat`, 'utf8');
  } catch {
    return undefined;
  }
  // The command name (field 2) may hold spaces and parentheses: the fields after it follow its last ')'.
  const rest = text.slice(text.lastIndexOf(')') + 2).split(' ');
  const pgrp = Number(rest[2]);
  const startTime = rest[19];
  return Number.isSafeInteger(pgrp) && startTime !== undefined && /^\d+$/.test(startTime) ? { pgrp, startTime } : undefined;
}

/** True if process `pid` lives in container `containerId` (its cgroup path names the container). */
export async function inContainer(pid: number, containerId: string, procRoot = '/proc'): Promise<boolean> {
  if (!/^[0-9a-f]{64}$/.test(containerId)) return false;
  try {
    return (await readFile(`${procRoot}/${pid}/cgroup`, 'utf8')).includes(containerId);
  } catch {
    return false;
  }
}

/**
 * The process group of one exec (hostPID: the engine's pids are this /proc's). Its leader is pinned
 * once, while it surely runs: pid from the engine, start time and cgroup from /proc. A signal then
 * goes to the whole group while the leader is that very process; once the leader is gone (its pid
 * free for reuse), to each process still in the group and in the container.
 */
export class ProcessGroup {
  #leader: Promise<{ readonly pid: number; readonly startTime: string; readonly leads: boolean } | undefined> | undefined;

  constructor(
    private readonly state: SessionIo['state'],
    private readonly containerId: string,
    private readonly procRoot = '/proc',
  ) {}

  /** Pin the leader (idempotent); undefined if it cannot be told apart from other processes. */
  pin(): Promise<{ readonly pid: number; readonly startTime: string; readonly leads: boolean } | undefined> {
    this.#leader ??= (async () => {
      // The engine names the pid once the process runs: a short wait at most.
      for (let i = 0; i < 100; i++) {
        const st = await this.state().catch(() => undefined);
        if (st === undefined) return undefined;
        if (st.pid > 0) {
          const stat = await procStat(st.pid, this.procRoot);
          if (stat === undefined || !(await inContainer(st.pid, this.containerId, this.procRoot))) return undefined;
          return { pid: st.pid, startTime: stat.startTime, leads: stat.pgrp === st.pid };
        }
        if (!st.running && st.exitCode !== null) return undefined;
        await new Promise((r) => setTimeout(r, 20));
      }
      return undefined;
    })();
    return this.#leader;
  }

  /** Send `sig`; false if nothing of the group is left to signal. */
  async signal(sig: NodeJS.Signals): Promise<boolean> {
    const leader = await this.pin();
    if (leader === undefined) return false;
    const now = await procStat(leader.pid, this.procRoot);
    if (now !== undefined && now.startTime === leader.startTime) {
      // Still the very process (or its zombie): its pid cannot have been reused.
      process.kill(leader.leads ? -leader.pid : leader.pid, sig);
      return true;
    }
    if (!leader.leads) return false;
    // The leader is gone; children in its group may live on (a pipeline, a tool it started).
    let sent = false;
    for (const name of await readdir(this.procRoot).catch(() => [] as string[])) {
      if (!/^\d+$/.test(name)) continue;
      const pid = Number(name);
      if ((await procStat(pid, this.procRoot))?.pgrp !== leader.pid || !(await inContainer(pid, this.containerId, this.procRoot))) continue;
      try {
        process.kill(pid, sig);
        sent = true;
      } catch {
        // gone meanwhile
      }
    }
    return sent;
  }
}

/** One running exec: a process's bytes for one control-plane session. */
class Session {
  #outSeq = 0;
  #inSeq = 0;
  #outputCredit: number;
  #stdinGranted = STDIN_WINDOW;
  #stdinReceived = 0;
  #stdoutBytes = 0;
  #stderrBytes = 0;
  #end: ExecEnd = ExecEnd.EXITED;
  #cancelTimers: NodeJS.Timeout[] = [];
  #idle: NodeJS.Timeout | undefined;
  #keepalive: NodeJS.Timeout | undefined;
  /** The exit is being reported: no more output goes out. */
  #closed = false;
  #cleanedUp = false;
  /** SIGKILL was sent: what the process still wrote is dropped so its stream can drain to the end. */
  #discard = false;
  readonly #startedAt: number;
  /** Output waiting for credit: at most one socket chunk (the stream is paused while it waits). */
  #held: { stream: 1 | 2; bytes: Buffer }[] = [];
  readonly #sub: Subscription;

  constructor(
    private readonly deps: ExecSessionsDeps,
    private readonly cmd: ExecStartCommand,
    private readonly io: SessionIo,
    private readonly onClosed: () => void,
  ) {
    this.#startedAt = deps.nowMs();
    this.#outputCredit = Math.min(MAX_OUTPUT_WINDOW, cmd.outputWindowBytes > 0 ? cmd.outputWindowBytes : DEFAULT_OUTPUT_WINDOW);
    this.#sub = deps.nc.subscribe(AgentSubjects.execIn(deps.hostId, cmd.execId), { callback: (err, msg) => (err ? undefined : this.#control(msg.data)) });
  }

  start(): void {
    this.#touch();
    if (this.cmd.stdin) this.#send({ $case: 'stdinCredit', value: STDIN_WINDOW });
    // This side's keepalive: numbered like every frame, so the control plane sees a gap (a lost
    // frame) at the latest here, and hears the host while the exec waits for credit or input.
    this.#keepalive = setInterval(() => this.#send({ $case: 'stdinCredit', value: 0 }), this.#idleMs() / 3);
    this.#keepalive.unref?.();
  }

  #idleMs(): number {
    return this.cmd.idleTimeoutMs > 0 ? this.cmd.idleTimeoutMs : 30_000;
  }

  #send(frame: NonNullable<ExecAgentFrame['frame']>): void {
    if (this.#closed && frame.$case !== 'exit' && frame.$case !== 'error') return;
    try {
      this.deps.nc.publish(AgentSubjects.execOut(this.deps.hostId, this.cmd.execId), ExecAgentFrame.encode({ execId: this.cmd.execId, seq: ++this.#outSeq, frame }).finish());
    } catch (err) {
      // The connection is closing (the agent stops): the control plane sees a silent host.
      this.deps.logger.debug({ err, execId: this.cmd.execId }, 'exec frame not sent');
    }
  }

  /** Output from the process: sent while credit lasts, else held and the stream paused. */
  output(stream: 1 | 2, bytes: Buffer): void {
    if (this.#discard || this.#closed) return;
    if (this.#held.length > 0 || bytes.length > this.#outputCredit) {
      this.#held.push({ stream, bytes: Buffer.from(bytes) });
      this.io.pause();
      this.#drainHeld();
      return;
    }
    this.#emit(stream, bytes);
  }

  #emit(stream: 1 | 2, bytes: Buffer): void {
    for (let at = 0; at < bytes.length; at += EXEC_FRAME_BYTES) {
      const piece = bytes.subarray(at, Math.min(bytes.length, at + EXEC_FRAME_BYTES));
      this.#outputCredit -= piece.length;
      if (stream === 2) this.#stderrBytes += piece.length;
      else this.#stdoutBytes += piece.length;
      this.#send({ $case: 'output', value: { stream: stream === 2 ? ExecStream.STDERR : ExecStream.STDOUT, data: piece } });
    }
  }

  /** Send held output the credit now covers (a held chunk may be split to use partial credit). */
  #drainHeld(): void {
    while (this.#held.length > 0 && this.#outputCredit > 0) {
      const head = this.#held[0]!;
      const n = Math.min(head.bytes.length, this.#outputCredit);
      this.#emit(head.stream, head.bytes.subarray(0, n));
      if (n === head.bytes.length) this.#held.shift();
      else head.bytes = head.bytes.subarray(n);
    }
    if (this.#held.length === 0 && !this.#closed) this.io.resume();
  }

  #control(data: Uint8Array): void {
    let f: ExecControlFrame;
    try {
      f = ExecControlFrame.decode(data);
    } catch {
      return this.#fail('undecodable control frame');
    }
    if (f.seq !== this.#inSeq + 1) return this.#fail(`control frame ${f.seq} after ${this.#inSeq}: a frame was lost`);
    this.#inSeq = f.seq;
    this.#touch();
    const c = f.frame;
    if (c === undefined) return;
    switch (c.$case) {
      case 'stdin': {
        if (!this.cmd.stdin) return this.#fail('stdin sent to an exec without stdin');
        this.#stdinReceived += c.value.length;
        if (this.#stdinReceived > this.#stdinGranted) return this.#fail('stdin beyond the granted credit');
        this.io.write(Buffer.from(c.value), () => {
          this.#stdinGranted += c.value.length;
          this.#send({ $case: 'stdinCredit', value: c.value.length });
        });
        return;
      }
      case 'closeStdin':
        this.io.endInput();
        return;
      case 'outputCredit':
        this.#outputCredit = Math.min(MAX_OUTPUT_WINDOW * 2, this.#outputCredit + Math.max(0, c.value));
        this.#drainHeld();
        return;
      case 'cancel':
        this.cancel(c.value.graceMs > 0 ? c.value.graceMs : this.cmd.cancelGraceMs, ExecEnd.CANCELLED);
        return;
      case 'keepalive':
        return;
      case 'detach':
        if (!this.io.turn) return this.#fail('detach sent to an exec that is not a turn process');
        this.#detach();
        return;
    }
  }

  #touch(): void {
    if (this.#idle) clearTimeout(this.#idle);
    const idleMs = this.#idleMs();
    this.#idle = setTimeout(() => {
      this.deps.logger.warn({ execId: this.cmd.execId, idleMs }, 'the control plane fell silent: cancelling the exec');
      this.cancel(this.cmd.cancelGraceMs, ExecEnd.CANCELLED);
    }, idleMs);
    this.#idle.unref?.();
  }

  #fail(why: string): void {
    this.deps.logger.warn({ execId: this.cmd.execId, why }, 'exec ended: protocol error');
    this.#send({ $case: 'error', value: why.slice(0, 512) });
    this.cancel(this.cmd.cancelGraceMs, ExecEnd.CANCELLED);
  }

  /**
   * SIGINT now, SIGTERM after the grace, SIGKILL after twice the grace (the exec's process group).
   * What the process writes meanwhile goes out against credit as always (the control plane credits
   * output nobody reads); after the SIGKILL it is dropped, so the stream can drain to its end.
   */
  cancel(graceMs: number, end: ExecEnd): void {
    if (this.#cancelTimers.length > 0 || this.#closed) return;
    this.#end = end;
    const grace = Math.min(60_000, graceMs > 0 ? graceMs : 2_000);
    const signal = (sig: NodeJS.Signals) => async () => {
      try {
        await this.io.signal(sig);
      } catch (err) {
        this.deps.logger.debug({ err, execId: this.cmd.execId, sig }, 'signalling the exec failed (gone already?)');
      }
    };
    void signal('SIGINT')();
    this.#cancelTimers.push(setTimeout(() => void signal('SIGTERM')(), grace), setTimeout(() => {
      void signal('SIGKILL')();
      this.#discard = true;
      this.#held = [];
      this.io.resume();
    }, 2 * grace));
    for (const t of this.#cancelTimers) t.unref?.();
  }

  /** The turn is over: end this exec, keep the process (its later output is discarded until the next turn). */
  #detach(): void {
    if (this.#closed || this.#cancelTimers.length > 0) return;
    this.#closed = true;
    this.#send({ $case: 'exit', value: { end: ExecEnd.DETACHED, exitCode: 0, stdoutBytes: this.#stdoutBytes, stderrBytes: this.#stderrBytes, durationMs: this.deps.nowMs() - this.#startedAt } });
    this.#cleanUp();
  }

  /** The process's output stream ended: report its exit. */
  async ended(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    // Output still held for lack of credit is dropped: the consumer is gone or cancelled.
    let exitCode = -1;
    for (let i = 0; i < 50; i++) {
      try {
        const st = await this.io.state();
        if (!st.running && st.exitCode !== null) {
          exitCode = st.exitCode;
          break;
        }
      } catch {
        break;
      }
      await new Promise((r) => setTimeout(r, 20));
    }
    const exit: ExecExit = { end: this.#end, exitCode, stdoutBytes: this.#stdoutBytes, stderrBytes: this.#stderrBytes, durationMs: this.deps.nowMs() - this.#startedAt };
    this.#send({ $case: 'exit', value: exit });
    this.#cleanUp();
  }

  #cleanUp(): void {
    if (this.#cleanedUp) return;
    this.#cleanedUp = true;
    this.#held = [];
    for (const t of this.#cancelTimers) clearTimeout(t);
    if (this.#idle) clearTimeout(this.#idle);
    if (this.#keepalive) clearInterval(this.#keepalive);
    this.#sub.unsubscribe();
    this.io.release();
    this.onClosed();
  }
}

/** A one-shot exec: the session owns the Docker stream. */
function oneShot(exec: OpenExec, group: ProcessGroup, session: () => Session | undefined): SessionIo {
  const parser = new ExecFrameParser((stream, bytes) => session()?.output(stream, bytes));
  exec.stream.on('data', (chunk: Buffer) => parser.push(chunk));
  const ended = (): void => void session()?.ended();
  exec.stream.on('end', ended);
  exec.stream.on('close', ended);
  return {
    turn: false,
    pause: () => exec.stream.pause(),
    resume: () => exec.stream.resume(),
    write: (data, done) => void exec.stream.write(data, () => done()),
    endInput: () => exec.stream.end(),
    state: () => exec.state(),
    signal: (sig) => group.signal(sig),
    release: () => exec.stream.destroy(),
  };
}

/** A member's CLI process kept between turns; one turn's session at a time is attached to it. */
class TurnProcess {
  readonly startedAt: number;
  #attached: Session | undefined;
  #alive = true;
  #discarded = 0;
  readonly #exited: Promise<void>;
  #markExited!: () => void;
  readonly #group: ProcessGroup;

  constructor(
    readonly groupId: string,
    readonly memberId: string,
    readonly containerId: string,
    readonly containerStartedAt: number,
    readonly processId: string,
    readonly commandDigest: string,
    private readonly exec: OpenExec,
    private readonly logger: Logger,
    nowMs: number,
    onGone: (tp: TurnProcess) => void,
  ) {
    this.startedAt = nowMs;
    this.#exited = new Promise((r) => (this.#markExited = r));
    this.#group = new ProcessGroup(() => exec.state(), containerId);
    void this.#group.pin();
    const parser = new ExecFrameParser((stream, bytes) => {
      if (this.#attached !== undefined) this.#attached.output(stream, bytes);
      else this.#discarded += bytes.length;
    });
    exec.stream.on('data', (chunk: Buffer) => parser.push(chunk));
    const ended = (): void => {
      if (!this.#alive) return;
      this.#alive = false;
      if (this.#discarded > 0) this.logger.info({ processId, discardedBytes: this.#discarded }, 'turn process wrote output between turns (discarded)');
      onGone(this);
      const s = this.#attached;
      this.#attached = undefined;
      void (s?.ended() ?? Promise.resolve()).finally(() => {
        exec.stream.destroy();
        this.#markExited();
      });
    };
    exec.stream.on('end', ended);
    exec.stream.on('close', ended);
    exec.stream.on('error', (err: Error) => {
      logger.warn({ err, processId }, 'turn process stream failed');
      ended();
    });
  }

  get alive(): boolean {
    return this.#alive;
  }

  get attached(): boolean {
    return this.#attached !== undefined;
  }

  state(): ReturnType<OpenExec['state']> {
    return this.exec.state();
  }

  /** The IO of the session attached to this process for one turn. */
  attach(session: () => Session | undefined): SessionIo {
    return {
      turn: true,
      pause: () => this.exec.stream.pause(),
      resume: () => this.exec.stream.resume(),
      write: (data, done) => void this.exec.stream.write(data, () => done()),
      endInput: () => this.exec.stream.end(),
      state: () => this.exec.state(),
      signal: (sig) => this.#group.signal(sig),
      release: () => {
        if (this.#attached !== session()) return;
        this.#attached = undefined;
        // Between turns nothing holds the stream back: what the process writes is discarded.
        this.exec.stream.resume();
      },
    };
  }

  bind(session: Session): void {
    this.#attached = session;
  }

  /** End an idle process: SIGTERM, SIGKILL after the grace; resolves true once its stream ended. */
  async end(graceMs: number): Promise<boolean> {
    if (this.#alive) {
      const deadline = new Promise<'late'>((r) => setTimeout(() => r('late'), graceMs).unref());
      try {
        if (!(await this.#group.signal('SIGTERM'))) this.exec.stream.destroy();
      } catch {
        this.exec.stream.destroy();
      }
      if ((await Promise.race([this.#exited.then(() => 'ended' as const), deadline])) === 'late') {
        try {
          await this.#group.signal('SIGKILL');
        } catch {
          // gone meanwhile
        }
      }
    }
    const bound = new Promise<'late'>((r) => setTimeout(() => r('late'), graceMs + 5_000).unref());
    return (await Promise.race([this.#exited.then(() => 'ended' as const), bound])) === 'ended';
  }

  info(): TurnProcessInfo {
    return {
      groupId: this.groupId, memberId: this.memberId, containerId: this.containerId, containerStartedAtUnixMs: this.containerStartedAt,
      processId: this.processId, commandDigest: this.commandDigest, attached: this.attached, startedAtUnixMs: this.startedAt,
    };
  }
}

export class ExecSessions {
  readonly #sessions = new Map<string, Session>();
  /** Turn processes by `<group>/<member>`. */
  readonly #turns = new Map<string, TurnProcess>();

  constructor(private readonly deps: ExecSessionsDeps) {}

  get size(): number {
    return this.#sessions.size;
  }

  /** The running turn processes (the inventory lists them: R-S1 evidence). */
  turnProcesses(): TurnProcessInfo[] {
    return [...this.#turns.values()].filter((t) => t.alive).map((t) => t.info());
  }

  /** Start an exec for a command already fenced by epoch and generation (command-handler.ts). */
  async start(cmd: ExecStartCommand, generation: number): Promise<ExecStartResult> {
    validate(cmd);
    if (this.#sessions.has(cmd.execId)) throw refused('invalid_argument', `exec ${cmd.execId} exists`);
    if (this.#sessions.size >= MAX_SESSIONS) throw refused('no_capacity', `${MAX_SESSIONS} execs are running on this host`);
    const c = await this.deps.runtime.find(cmd.containerId);
    if (c === undefined || c.member?.groupId !== cmd.groupId || c.member.memberId !== cmd.memberId || c.member.placementGeneration !== generation) {
      throw refused('member_not_found', `container ${cmd.containerId.slice(0, 64)} is not member ${cmd.memberId} of group ${cmd.groupId} at generation ${generation}`);
    }
    if (!c.running) throw refused('group_not_found', `member ${cmd.memberId}'s container is not running`);
    const parsed = c.startedAt === undefined ? 0 : Date.parse(c.startedAt);
    const startedAt = Number.isFinite(parsed) ? parsed : 0;
    if (cmd.expectedStartedAtUnixMs > 0 && startedAt !== cmd.expectedStartedAtUnixMs) {
      throw refused('stale_incarnation', `member ${cmd.memberId}'s container started at ${startedAt}, not ${cmd.expectedStartedAtUnixMs} (it restarted)`);
    }
    const result = { execId: cmd.execId, containerId: c.id, startedAtUnixMs: startedAt };
    const tp = cmd.turnProcess;
    if (tp === undefined) {
      let exec: OpenExec;
      try {
        exec = await this.deps.runtime.openExec(c.id, cmd.argv, { env: Object.fromEntries(cmd.env.map((e) => [e.name, e.value])), workingDir: cmd.workingDir, stdin: cmd.stdin });
      } catch (err) {
        throw failed('start_failed', `exec in ${cmd.memberId}: ${(err as Error).message}`, err);
      }
      const group = new ProcessGroup(() => exec.state(), c.id);
      // Pinned now, while the process surely runs (a cancel may come at any time).
      void group.pin();
      const session: Session = new Session(this.deps, cmd, oneShot(exec, group, () => session), () => this.#sessions.delete(cmd.execId));
      exec.stream.on('error', (err: Error) => {
        this.deps.logger.warn({ err, execId: cmd.execId }, 'exec stream failed');
        void session.ended();
      });
      this.#sessions.set(cmd.execId, session);
      session.start();
      return { ...result, processId: '' };
    }
    const key = `${cmd.groupId}/${cmd.memberId}`;
    let proc = this.#turns.get(key);
    if (tp.mode === TurnProcessMode.ATTACH) {
      const st = proc?.alive === true ? await proc.state().catch(() => undefined) : undefined;
      if (proc === undefined || !proc.alive || proc.processId !== tp.processId || proc.containerId !== c.id || proc.containerStartedAt !== startedAt || st?.running !== true) {
        throw refused('state_changed', `turn process ${tp.processId} of member ${cmd.memberId} is not running in its container`);
      }
      if (proc.attached) throw refused('state_changed', `turn process ${tp.processId} of member ${cmd.memberId} is running another turn`);
    } else {
      if (proc !== undefined) {
        // R-S6: the member's older process may still run on the native session: end it first.
        if (proc.attached) throw refused('state_changed', `member ${cmd.memberId}'s turn process ${proc.processId} is running a turn`);
        if (!(await proc.end(cmd.cancelGraceMs > 0 ? cmd.cancelGraceMs : 2_000))) throw failed('stop_failed', `member ${cmd.memberId}'s turn process ${proc.processId} did not end`);
      }
      if (this.#turns.size >= MAX_TURN_PROCESSES) throw refused('no_capacity', `${MAX_TURN_PROCESSES} turn processes are kept on this host`);
      let exec: OpenExec;
      try {
        exec = await this.deps.runtime.openExec(c.id, cmd.argv, { env: Object.fromEntries(cmd.env.map((e) => [e.name, e.value])), workingDir: cmd.workingDir, stdin: true });
      } catch (err) {
        throw failed('start_failed', `turn process in ${cmd.memberId}: ${(err as Error).message}`, err);
      }
      proc = new TurnProcess(cmd.groupId, cmd.memberId, c.id, startedAt, `p-${randomBytes(8).toString('hex')}`, tp.commandDigest, exec, this.deps.logger, this.deps.nowMs(), (gone) => {
        if (this.#turns.get(key) === gone) this.#turns.delete(key);
      });
      this.#turns.set(key, proc);
    }
    const owner = proc;
    const session: Session = new Session(this.deps, cmd, owner.attach(() => session), () => this.#sessions.delete(cmd.execId));
    owner.bind(session);
    this.#sessions.set(cmd.execId, session);
    session.start();
    return { ...result, processId: owner.processId };
  }

  /** Cancel every exec and end every turn process (the epoch was fenced, or the agent stops). */
  cancelAll(graceMs = 2_000): void {
    for (const s of this.#sessions.values()) s.cancel(graceMs, ExecEnd.CANCELLED);
    for (const t of this.#turns.values()) {
      if (!t.attached) void t.end(graceMs);
    }
  }
}
