// Short child processes with small output (a tar run stopped at a header, the few entries an
// incremental checkpoint re-reads) started from a small helper process instead of from the agent.
// Why: Node starts a child with fork(), whose cost grows with the parent's resident memory (it
// copies the page tables): measured here, 1.5 ms at 44 MiB RSS, 23 ms at 244 MiB, 69 ms at 844 MiB,
// and the event loop is blocked meanwhile (heartbeats and commands wait). An agent that has restored
// layers holds hundreds of MiB, and an incremental checkpoint after one turn is mostly such forks.
// The helper is a plain `node -e` process of ~40 MiB, started when the agent starts (or on first
// use) and kept (unref'd while idle, so it never keeps the agent alive; it exits when the agent's
// IPC channel closes). It runs one command per request, feeds it `input`, and returns at most
// `maxOutputBytes` of its stdout (stopping it there: the callers need only a bounded prefix, and a
// larger answer is theirs to get another way). If the helper cannot be started or dies, requests
// answer `undefined` and the caller spawns directly, as before: a speed-up, never a new way to fail.
import { spawn, type ChildProcess } from 'node:child_process';

// Plain CommonJS source: runs without a TypeScript loader (the agent may run under tsx or compiled).
const HELPER_SOURCE = `
process.title = 'sandboxfleet-small-process';
const { spawn } = require('node:child_process');
process.on('message', (m) => {
  let sent = false;
  const out = [];
  let n = 0;
  let truncated = false;
  let stderr = '';
  let spawnFailed = false;
  const reply = (code, signal) => {
    if (sent) return;
    sent = true;
    process.send({ id: m.id, code, signal, truncated, spawnFailed, stdout: Buffer.concat(out), stderr });
  };
  let child;
  try {
    child = spawn(m.file, m.args, { stdio: ['pipe', 'pipe', 'pipe'] });
  } catch (err) {
    stderr = String(err);
    spawnFailed = true;
    return reply(null, null);
  }
  child.stdout.on('data', (d) => {
    if (truncated) return;
    const room = m.maxOutputBytes - n;
    if (d.length >= room) {
      out.push(d.subarray(0, room));
      n += room;
      truncated = true;
      // Killed before its pipe closes: closed first, tar may see the write fail and say so on
      // stderr ("tar: -: Cannot write", 4 runs in 200), which would read as a complaint of its own.
      child.kill('SIGKILL');
      child.stdout.destroy();
    } else {
      out.push(d);
      n += d.length;
    }
  });
  child.stderr.setEncoding('utf8').on('data', (s) => { if (stderr.length < 8192) stderr += s; });
  child.stdin.on('error', () => {});
  child.on('error', (err) => { stderr += String(err); spawnFailed = true; reply(null, null); });
  // Stopped at the limit: answer at its exit (a grandchild may still hold the pipe open).
  child.on('exit', (code, signal) => { if (truncated) reply(code, signal); });
  child.on('close', (code, signal) => reply(code, signal));
  child.stdin.end(Buffer.from(m.input));
});
process.on('disconnect', () => process.exit(0));
`;

export interface SmallRunRequest {
  readonly file: string;
  readonly args: readonly string[];
  /** Written to the command's stdin, which is then closed. */
  readonly input: Uint8Array;
  /** The command is stopped (SIGKILL) once this much of its stdout has arrived. */
  readonly maxOutputBytes: number;
}

export interface SmallRunResult {
  /** Exit code; null when it was killed (`truncated`, or otherwise) or could not start. */
  readonly code: number | null;
  readonly signal: string | null;
  /** The command was stopped at `maxOutputBytes`: `stdout` is a prefix of its output. */
  readonly truncated: boolean;
  /** The helper could not start the command (ENOENT, EAGAIN, EMFILE…): `stderr` says why. */
  readonly spawnFailed: boolean;
  readonly stdout: Buffer;
  readonly stderr: string;
}

interface Reply extends Omit<SmallRunResult, 'stdout'> {
  readonly id: number;
  readonly stdout: Uint8Array;
}

/** The helper process and the requests it has not answered. */
class Helper {
  private child: ChildProcess | null = null;
  private nextId = 1;
  private readonly pending = new Map<number, (r: SmallRunResult | undefined) => void>();
  /** Helper starts that failed in a row; past a few, this process spawns directly for good. */
  private failures = 0;
  /** Requests the helper answered (tests check the path is taken). */
  answered = 0;
  /** Requests answered `undefined` (no helper, or it died first): the caller forked this process instead. */
  unavailable = 0;

  run(req: SmallRunRequest): Promise<SmallRunResult | undefined> {
    const child = this.get();
    if (child === null) {
      this.unavailable += 1;
      return Promise.resolve(undefined);
    }
    const id = this.nextId++;
    return new Promise((resolve) => {
      this.pending.set(id, resolve);
      this.ref(true);
      const sent = child.send({ id, file: req.file, args: req.args, input: Buffer.from(req.input), maxOutputBytes: req.maxOutputBytes }, (err) => {
        if (err) this.settle(id, undefined);
      });
      if (!sent && !child.connected) this.settle(id, undefined);
    });
  }

  /** Start the helper now, if it does not run (idle, it keeps nothing alive). */
  start(): void {
    this.get();
  }

  /** Stop the helper (tests; the agent's exit closes it anyway). */
  stop(): void {
    this.child?.kill('SIGKILL');
  }

  /** The running helper's pid, if any (tests). */
  get pid(): number | undefined {
    return this.child?.pid;
  }

  private settle(id: number, r: SmallRunResult | undefined): void {
    const resolve = this.pending.get(id);
    if (resolve === undefined) return;
    this.pending.delete(id);
    if (this.pending.size === 0) this.ref(false);
    if (r === undefined) this.unavailable += 1;
    resolve(r);
  }

  /** Keep this process alive only while a request is out. */
  private ref(on: boolean): void {
    const c = this.child;
    if (c === null) return;
    const channel = c.channel as { ref(): void; unref(): void } | undefined;
    if (on) {
      c.ref();
      channel?.ref();
    } else {
      c.unref();
      channel?.unref();
    }
  }

  private get(): ChildProcess | null {
    if (this.child !== null) return this.child;
    if (this.failures >= MAX_START_FAILURES) return null;
    let child: ChildProcess;
    try {
      // No loader flags of the parent (tsx, an inspector in NODE_OPTIONS): the source is plain JS.
      child = spawn(process.execPath, ['-e', HELPER_SOURCE], { stdio: ['ignore', 'ignore', 'ignore', 'ipc'], serialization: 'advanced', env: { ...process.env, NODE_OPTIONS: '' } });
    } catch {
      this.failures += 1;
      return null;
    }
    this.child = child;
    child.on('message', (m: Reply) => {
      if (!this.pending.has(m.id)) return; // answered already (the helper was given up on)
      this.failures = 0;
      this.answered += 1;
      this.settle(m.id, { code: m.code, signal: m.signal, truncated: m.truncated, spawnFailed: m.spawnFailed, stdout: Buffer.from(m.stdout.buffer, m.stdout.byteOffset, m.stdout.byteLength), stderr: m.stderr });
    });
    const gone = (): void => {
      if (this.child !== child) return;
      this.child = null;
      this.failures += 1;
      for (const id of [...this.pending.keys()]) this.settle(id, undefined);
    };
    child.on('exit', gone);
    child.on('error', gone);
    this.ref(false);
    return child;
  }
}

/** Helper (re)starts that may fail in a row before this process stops asking for one. */
const MAX_START_FAILURES = 3;

const helper = new Helper();

/**
 * Run `req` from the helper process. Resolves `undefined` when the helper is not available (it
 * could not start, or died before answering): the caller then runs the command itself.
 */
export function runSmall(req: SmallRunRequest): Promise<SmallRunResult | undefined> {
  return helper.run(req);
}

/**
 * Start the helper now, while this process is still small (the agent calls it first thing): the
 * helper's own start is the one fork that then costs little.
 */
export function startSmallProcessHelper(): void {
  helper.start();
}

/**
 * The helper's pid (undefined when none runs), how many requests it answered and how many it could
 * not (the agent's metrics export that count: a helper that keeps failing costs a fork of the agent
 * per small run, slower and blocking, never wrong), and a way to kill it (tests).
 */
export const smallProcessHelper = {
  get pid(): number | undefined {
    return helper.pid;
  },
  get answered(): number {
    return helper.answered;
  },
  get unavailable(): number {
    return helper.unavailable;
  },
  kill(): void {
    helper.stop();
  },
};
