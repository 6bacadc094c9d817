// Processes in member containers for the control plane (R-I9): the agent end of an exec. A fenced
// `execStart` command (epoch, generation, the member's container at that generation, running)
// starts a Docker exec; its bytes then flow on the exec's own plain NATS subjects — output frames
// out, control frames (stdin, credits, cancel, keepalive) in — each direction numbered, so a lost
// frame is seen as a gap and ends the exec instead of silently corrupting it.
// Bounded everywhere: output is sent only against credit the control plane granted (the Docker
// stream is paused meanwhile, so the process blocks on a full pipe rather than the agent buffering),
// stdin is accepted only up to the credit this agent granted, frames are at most 128 KiB, and the
// number of sessions is capped. A control plane that falls silent (no keepalive within the idle
// timeout) or a fenced epoch cancels the process: SIGINT, then SIGTERM and SIGKILL after the grace.
import type { NatsConnection, Subscription } from '@nats-io/transport-node';
import { AgentSubjects } from '../core/agent-subjects.ts';
import { ExecFrameParser, type DockerRuntime, type OpenExec } from '../docker/runtime.ts';
import { ExecAgentFrame, ExecControlFrame, type ExecStartCommand, type ExecStartResult } from '../gen/sandboxfleet/v1/agent.ts';
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
const MAX_ARGV = 256;
const MAX_ARGV_BYTES = 128 * 1024;
const MAX_ENV = 64;
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/;

export interface ExecSessionsDeps {
  readonly nc: NatsConnection;
  readonly hostId: string;
  readonly runtime: DockerRuntime;
  readonly logger: Logger;
  readonly nowMs: () => number;
}

function validate(cmd: ExecStartCommand): void {
  if (cmd.argv.length === 0 || cmd.argv.length > MAX_ARGV) throw refused('invalid_argument', `argv must have 1..${MAX_ARGV} entries`);
  if (cmd.argv.reduce((n, a) => n + Buffer.byteLength(a), 0) > MAX_ARGV_BYTES) throw refused('invalid_argument', `argv exceeds ${MAX_ARGV_BYTES} bytes`);
  if (cmd.argv.some((a) => a.includes('\0'))) throw refused('invalid_argument', 'argv entries may not contain NUL');
  if (cmd.env.length > MAX_ENV || cmd.env.some((e) => !ENV_NAME.test(e.name) || e.value.length > 32 * 1024 || e.value.includes('\0'))) throw refused('invalid_argument', 'env entries are bounded names and values');
  if (cmd.workingDir !== '' && (!cmd.workingDir.startsWith('/') || cmd.workingDir.length > 4096 || cmd.workingDir.includes('\0'))) throw refused('invalid_argument', 'workingDir must be an absolute path');
  try {
    AgentSubjects.execIn('host-x', cmd.execId);
  } catch {
    throw refused('invalid_argument', 'execId must be [a-z0-9-]{8,64}');
  }
}

/** One running exec. */
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
  #closed = false;
  /** SIGKILL was sent: what the process still wrote is dropped so its stream can drain to the end. */
  #discard = false;
  readonly #startedAt: number;
  /** Output waiting for credit: at most one socket chunk (the stream is paused while it waits). */
  #held: { stream: 1 | 2; bytes: Buffer }[] = [];
  readonly #sub: Subscription;

  constructor(
    private readonly deps: ExecSessionsDeps,
    private readonly cmd: ExecStartCommand,
    private readonly exec: OpenExec,
    private readonly onClosed: () => void,
  ) {
    this.#startedAt = deps.nowMs();
    this.#outputCredit = Math.min(MAX_OUTPUT_WINDOW, cmd.outputWindowBytes > 0 ? cmd.outputWindowBytes : DEFAULT_OUTPUT_WINDOW);
    this.#sub = deps.nc.subscribe(AgentSubjects.execIn(deps.hostId, cmd.execId), { callback: (err, msg) => (err ? undefined : this.#control(msg.data)) });
  }

  start(): void {
    const parser = new ExecFrameParser((stream, bytes) => this.#output(stream, bytes));
    this.exec.stream.on('data', (chunk: Buffer) => parser.push(chunk));
    this.exec.stream.on('end', () => void this.#finish());
    this.exec.stream.on('close', () => void this.#finish());
    this.exec.stream.on('error', (err: Error) => {
      this.deps.logger.warn({ err, execId: this.cmd.execId }, 'exec stream failed');
      void this.#finish();
    });
    this.#touch();
    if (this.cmd.stdin) this.#send({ $case: 'stdinCredit', value: STDIN_WINDOW });
  }

  #send(frame: NonNullable<ExecAgentFrame['frame']>): void {
    if (this.#closed && frame.$case !== 'exit' && frame.$case !== 'error') return;
    this.deps.nc.publish(AgentSubjects.execOut(this.deps.hostId, this.cmd.execId), ExecAgentFrame.encode({ execId: this.cmd.execId, seq: ++this.#outSeq, frame }).finish());
  }

  /** Output from the process: sent while credit lasts, else held and the stream paused. */
  #output(stream: 1 | 2, bytes: Buffer): void {
    if (this.#discard) return;
    if (this.#held.length > 0 || bytes.length > this.#outputCredit) {
      this.#held.push({ stream, bytes: Buffer.from(bytes) });
      this.exec.stream.pause();
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
    if (this.#held.length === 0 && !this.#closed) this.exec.stream.resume();
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
        this.exec.stream.write(Buffer.from(c.value), () => {
          this.#stdinGranted += c.value.length;
          this.#send({ $case: 'stdinCredit', value: c.value.length });
        });
        return;
      }
      case 'closeStdin':
        this.exec.stream.end();
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
    }
  }

  #touch(): void {
    if (this.#idle) clearTimeout(this.#idle);
    const idleMs = this.cmd.idleTimeoutMs > 0 ? this.cmd.idleTimeoutMs : 30_000;
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

  /** SIGINT now, SIGTERM after the grace, SIGKILL after twice the grace (the process's own pid). */
  cancel(graceMs: number, end: ExecEnd): void {
    if (this.#cancelTimers.length > 0 || this.#closed) return;
    this.#end = end;
    const grace = Math.min(60_000, graceMs > 0 ? graceMs : 2_000);
    const signal = (sig: NodeJS.Signals) => async () => {
      try {
        const st = await this.exec.state();
        if (st.running && st.pid > 0) process.kill(st.pid, sig);
      } catch (err) {
        this.deps.logger.debug({ err, execId: this.cmd.execId, sig }, 'signalling the exec failed (gone already?)');
      }
    };
    void signal('SIGINT')();
    this.#cancelTimers.push(setTimeout(() => void signal('SIGTERM')(), grace), setTimeout(() => {
      void signal('SIGKILL')();
      this.#discard = true;
      this.#held = [];
      this.exec.stream.resume();
    }, 2 * grace));
    for (const t of this.#cancelTimers) t.unref?.();
    // Output the process still writes while dying needs room to drain.
    this.#outputCredit = Math.max(this.#outputCredit, EXEC_FRAME_BYTES);
    this.#drainHeld();
  }

  async #finish(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    // Output still held for lack of credit is dropped: the consumer is gone or cancelled.
    let exitCode = -1;
    for (let i = 0; i < 50; i++) {
      try {
        const st = await this.exec.state();
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
    for (const t of this.#cancelTimers) clearTimeout(t);
    if (this.#idle) clearTimeout(this.#idle);
    this.#sub.unsubscribe();
    this.exec.stream.destroy();
    this.onClosed();
  }
}

export class ExecSessions {
  readonly #sessions = new Map<string, Session>();

  constructor(private readonly deps: ExecSessionsDeps) {}

  get size(): number {
    return this.#sessions.size;
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
    const startedAt = c.startedAt === undefined ? 0 : Date.parse(c.startedAt);
    let exec: OpenExec;
    try {
      exec = await this.deps.runtime.openExec(c.id, cmd.argv, { env: Object.fromEntries(cmd.env.map((e) => [e.name, e.value])), workingDir: cmd.workingDir, stdin: cmd.stdin });
    } catch (err) {
      throw failed('start_failed', `exec in ${cmd.memberId}: ${(err as Error).message}`, err);
    }
    const session = new Session(this.deps, cmd, exec, () => this.#sessions.delete(cmd.execId));
    this.#sessions.set(cmd.execId, session);
    session.start();
    return { execId: cmd.execId, containerId: c.id, startedAtUnixMs: Number.isFinite(startedAt) ? startedAt : 0 };
  }

  /** Cancel every exec (the epoch was fenced, or the agent stops). */
  cancelAll(graceMs = 2_000): void {
    for (const s of this.#sessions.values()) s.cancel(graceMs, ExecEnd.CANCELLED);
  }
}
