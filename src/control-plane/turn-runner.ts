// RunTurn (R-I9): a whole native turn through the fleet. BeginTurn; the CLI's own command built by
// core (turn-command.ts) from the typed request and the operator's CLI profile; run through the
// exec relay in the member's container on its current placement; the CLI's stdout read line by
// line into the SAME turn-end detector the runner SDK ships (R-S5: only the CLI's own end event
// ends a turn); CompleteTurn with that evidence. The caller gets the CLI's events as they come.
//
// Exactly one driver per turn. Each call brings a fresh driver token to its begin; the begin that
// creates the turn writes it (with this replica and a lease) in its own compare-and-set and answers
// it, and a repeat of the call (same idempotency key) gets that stored answer: a call drives the
// turn only if the answer names ITS token — never decided by time stamps, which a slow begin or
// another replica's clock can bend. On one replica a repeat is also seen before anything is awaited
// (`#running`, claimed synchronously by the first call) and follows the first call's turn.
// The driver starts the drive before the caller sees `begun`, detached from the caller: a caller
// that goes away — even during the begin — is not a turn end (R-S5), the turn goes on to the CLI's
// own end (or its timeout, capped at SANDBOXFLEET_RUN_TURN_MAX_MS) and is completed with what the
// CLI said, so a repeat with the same key gets the stored end. The driver renews its lease while it
// runs (every LEASE_MS / 3). A repeat that finds the turn in flight waits for it (polling the record
// while its own caller stays, at most REPEAT_WAIT_MS per call); if the driver's lease lapsed (the
// driving replica died), it completes the turn as not ended (UNCONFIRMED): nothing proves how it
// ended. A driver that finds its lease taken over cancels its exec. Fenced or lost mid-turn (the
// host went away): completed as not ended, and the call fails UNAVAILABLE.
// Memory is bounded by the exec's credit window: output is credited back to the host only for bytes
// in complete lines the caller took (or that were dropped: a caller gone, a line over
// MAX_LINE_BYTES), and the hand-off to the caller is bounded in bytes, so a slow caller slows the
// CLI and at most one window (which holds one whole line) is ever held here.
//
// One process per turn: Codex always (`codex exec --json`, resumed with `codex exec resume`; its
// end read by the SDK's `codex exec` detector, its prompt written to stdin, which is then closed),
// Claude Code and Pi when the CLI profile says keepProcess: false. The process exits at its turn's
// end, so every turn after the first is RESTORED.
//
// Turn processes (R-S1 LIVE): Claude Code and Pi are kept running between turns (unless the CLI
// profile says keepProcess: false). A NEW or RESTORED turn starts the member's turn process on the
// agent (`claude -p --input-format stream-json …`, `pi --mode rpc`, resuming the saved locator) and
// writes the turn to its stdin; at the CLI's own end of the turn the exec is detached and the
// process stays, and CompleteTurn names it (`<container start>/<process id>`) so the next begin can
// find it in the agent's inventory and answer LIVE; a LIVE turn attaches to it and writes the next
// turn. The begin names the digest of the command the process is started with, so a turn asking for
// another model (or after a profile change) never reuses a process started otherwise (RESTORED).
// Claude's api_retry (R-S6): the process is let exit (stdin closed) and its exit awaited, as with
// `-p`; a turn the CLI did not end (cancel, deadline, fenced host) ends the process with it.
import { createHash, randomUUID } from 'node:crypto';
import { IdentityRefused, NotFound, PreconditionFailed, buildTurnCommand, buildTurnProcessCommand, isFleetError, isTurnProcess, keepsTurnProcess, turnInput, turnProcessIn, Unavailable, type CliKind, type CliProfile, type ProcessIdentity } from '../core/index.ts';
import type { ExecExitView, ExecSession, ExecStartInput, RunTurnEndView, RunTurnEvent, RunTurnInput } from '../core/exec-port.ts';
import type { BeginTurnInput, BeginTurnView, CompleteTurnInput, CompleteTurnView, RunnerBackend, TurnEvidenceInput } from '../core/runner-port.ts';
import { createCodexExecDetector } from '../runner-sdk/detectors/codex-exec.ts';
import { createDetector } from '../runner-sdk/detectors/factory.ts';
import type { TurnEndDetector } from '../runner-sdk/detectors/detector.ts';
import type { CliKind as SdkCliKind, TurnEndEvidence } from '../runner-sdk/evidence.ts';
import type { ExecRelay } from './exec-relay.ts';
import { keyDigest, replayOutcome } from './idempotency.ts';
import { decodeTurnFlags } from './records.ts';
import { DRIVER_LEASE_SKEW_MS, type FleetCompletion, type FleetTurn } from './runner-backend.ts';
import type { ControlPlaneDeps } from './state.ts';

export type TurnRunnerDeps = Pick<ControlPlaneDeps, 'config' | 'groups' | 'metrics' | 'logger' | 'now'>;

const MAX_LINE_BYTES = 8 * 1024 * 1024;
/** RunTurn's exec credit window: one whole line (MAX_LINE_BYTES) fits, with room to grant the rest. */
export const TURN_WINDOW_BYTES = MAX_LINE_BYTES + 1024 * 1024;
/** Bytes of events held for a slow caller before the turn waits for it (each event counts EVENT_COST more). */
const CHANNEL_BYTES = 1024 * 1024;
const EVENT_COST = 256;
const SDK_CLI: Partial<Record<CliKind, SdkCliKind>> = { claude_code: 'claude-code', pi: 'pi', codex: 'codex' };
/** Stdin payload per frame (the relay's bound). */
const STDIN_FRAME = 128 * 1024;
/** The driver's lease on its turn, renewed every third of it. */
export const LEASE_MS = 30_000;
/** How long one repeat call waits for a turn another call drives before it is refused turn_in_flight. */
const REPEAT_WAIT_MS = 60_000;
const POLL_MS = 500;

/**
 * The runner backend as RunTurn uses it: the begin names the turn process's command digest and the
 * call's driver token, the driver renews its lease, the end names the turn process the turn ran on
 * (ControlPlaneRunnerBackend).
 */
export interface TurnBackend extends RunnerBackend {
  beginTurn(input: BeginTurnInput, fleet?: FleetTurn): Promise<BeginTurnView>;
  completeTurn(input: CompleteTurnInput, fleet?: FleetCompletion): Promise<CompleteTurnView>;
  renewTurnDriver(groupId: string, memberId: string, turnId: string, token: string, leaseMs: number): Promise<boolean>;
}

/** How one turn is run: its own CLI process, or on the member's turn process. */
type TurnPlan =
  | { readonly kind: 'per_turn'; readonly command: { argv: string[]; env: Record<string, string> }; readonly input: Buffer | undefined }
  | { readonly kind: 'turn_process'; readonly command: { argv: string[]; env: Record<string, string> }; readonly digest: string; readonly input: Buffer };

/**
 * Splits a byte stream into lines (without the newline), each at most MAX_LINE_BYTES; longer ones are
 * dropped. Counts the stream bytes each line took, so they are credited only once the line is passed
 * on; `push` returns the bytes no line holds (a dropped line's), to be credited at once.
 */
export class LineSplitter {
  #parts: Buffer[] = [];
  #size = 0;
  #skipping = false;

  push(chunk: Uint8Array, onLine: (line: Buffer, bytes: number) => void): number {
    let free = 0;
    let data = Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    for (let nl = data.indexOf(10); nl !== -1; nl = data.indexOf(10)) {
      const piece = data.subarray(0, nl);
      data = data.subarray(nl + 1);
      if (this.#skipping) free += piece.length + 1;
      else {
        const bytes = this.#size + piece.length + 1;
        if (bytes - 1 <= MAX_LINE_BYTES) onLine(this.#parts.length === 0 ? Buffer.from(piece) : Buffer.concat([...this.#parts, piece]), bytes);
        else free += bytes;
      }
      this.#parts = [];
      this.#size = 0;
      this.#skipping = false;
    }
    if (data.length === 0) return free;
    if (this.#skipping) return free + data.length;
    this.#size += data.length;
    if (this.#size > MAX_LINE_BYTES) {
      // Too long to pass on: what it held so far, and the rest of it, is credited as it comes.
      free += this.#size;
      this.#parts = [];
      this.#size = 0;
      this.#skipping = true;
      return free;
    }
    this.#parts.push(Buffer.from(data));
    return free;
  }

  end(onLine: (line: Buffer, bytes: number) => void): void {
    if (!this.#skipping && this.#size > 0) onLine(Buffer.concat(this.#parts), this.#size);
    this.#parts = [];
    this.#size = 0;
  }
}

/** The SDK's evidence as the runner port's input (what CompleteTurn takes), with the driver's facts. */
export function evidenceInput(e: TurnEndEvidence, exit: ExecExitView | undefined): TurnEvidenceInput {
  const kind = e.endKind === 'none' ? (e.transport?.kind ?? 'cancelled') : e.endKind;
  // A detached turn process did not exit: it is kept for the next turn.
  const exitConfirmed = exit !== undefined && exit.end !== 'detached';
  return {
    kind,
    nativeTurnEnded: e.nativeTurnEnded,
    succeeded: e.nativeTurnEnded && e.succeeded,
    // The fleet's driver holds no per-turn state in the CLI to clean up: the process is the turn.
    cleanupFinished: true,
    transportUsable: e.transportUsable,
    locatorUsable: e.observedLocator !== undefined && e.locatorConflict === undefined,
    processExited: e.processWillExit || exitConfirmed,
    exitConfirmed,
    ...(exitConfirmed ? { exitCode: exit.exitCode } : {}),
    ...(e.nativeTurnId !== undefined ? { nativeTurnId: e.nativeTurnId } : {}),
    ...(e.error !== undefined ? { errorMessage: e.error.slice(0, 4096) } : {}),
  };
}

/** What a turn that did not end natively is completed with. */
function notEnded(kind: 'disconnect' | 'timeout' | 'cancelled' | 'rejected', why: string, exit: ExecExitView | undefined): TurnEvidenceInput {
  return {
    kind, nativeTurnEnded: false, succeeded: false, cleanupFinished: true, transportUsable: false, locatorUsable: false,
    processExited: exit !== undefined, exitConfirmed: exit !== undefined, ...(exit !== undefined ? { exitCode: exit.exitCode } : {}), errorMessage: why.slice(0, 4096),
  };
}

function eventBytes(e: RunTurnEvent): number {
  return EVENT_COST + (e.kind === 'cli_event' ? e.line.length : e.kind === 'stderr' ? e.data.length : 0);
}

/**
 * A hand-off from the turn (producer) to the caller (consumer), bounded in bytes: the producer waits
 * while CHANNEL_BYTES are held. Each event may carry `taken`, called once the caller took it or it
 * was dropped (that is when its bytes are credited to the host). The turn goes on without a caller.
 */
export class EventChannel {
  readonly #queue: { readonly e: RunTurnEvent; readonly taken: (() => void) | undefined }[] = [];
  #held = 0;
  #wakeConsumer: (() => void) | undefined;
  #wakeProducer: (() => void) | undefined;
  #closed = false;
  #error: unknown;
  #detached = false;

  /** Bytes held for the caller now. */
  get heldBytes(): number {
    return this.#held;
  }

  /** The caller left: from now on events are dropped, the producer never waits, the consumer is done. */
  detach(): void {
    if (this.#detached) return;
    this.#detached = true;
    for (const q of this.#queue.splice(0)) q.taken?.();
    this.#held = 0;
    this.#wakeProducer?.();
    this.#wakeConsumer?.();
  }

  async put(e: RunTurnEvent, taken?: () => void): Promise<void> {
    if (this.#detached) {
      taken?.();
      return;
    }
    this.#queue.push({ e, taken });
    this.#held += eventBytes(e);
    this.#wakeConsumer?.();
    while (this.#held > CHANNEL_BYTES && !this.#detached) await new Promise<void>((r) => (this.#wakeProducer = r));
  }

  close(error?: unknown): void {
    this.#closed = true;
    this.#error = error;
    this.#wakeConsumer?.();
  }

  async *drain(): AsyncIterable<RunTurnEvent> {
    for (;;) {
      const q = this.#queue.shift();
      if (q !== undefined) {
        this.#held -= eventBytes(q.e);
        q.taken?.();
        this.#wakeProducer?.();
        yield q.e;
        continue;
      }
      // A caller that left is answered nothing more (and not kept waiting for the turn's end).
      if (this.#detached) return;
      if (this.#closed) {
        if (this.#error !== undefined) throw this.#error;
        return;
      }
      await new Promise<void>((r) => (this.#wakeConsumer = r));
      this.#wakeConsumer = undefined;
    }
  }
}

/** `p`, or undefined once `signal` aborts (the caller went away: stop waiting, nothing else). */
function unlessAborted<T>(p: Promise<T>, signal: AbortSignal): Promise<T | undefined> {
  if (signal.aborted) return Promise.resolve(undefined);
  return new Promise<T | undefined>((resolve, reject) => {
    const onAbort = (): void => resolve(undefined);
    signal.addEventListener('abort', onAbort, { once: true });
    p.then((v) => {
      signal.removeEventListener('abort', onAbort);
      resolve(v);
    }, (err: unknown) => {
      signal.removeEventListener('abort', onAbort);
      reject(err);
    });
  });
}

/** What this replica learned from a call's begin: the answer, and the end of the drive if this call drives. */
interface Decided {
  readonly begun: BeginTurnView;
  readonly end: Promise<RunTurnEndView> | undefined;
}

export class TurnRunner {
  /**
   * Calls this replica is beginning or driving, by member and idempotency key: claimed by the first
   * call before anything is awaited, so a repeat arriving meanwhile follows it instead of racing it.
   */
  readonly #running = new Map<string, { readonly decided: Promise<Decided> }>();

  readonly #runner: TurnBackend;

  /**
   * `runner` must be a TurnBackend (ControlPlaneRunnerBackend): checked here, because the control
   * plane hands over its backend as the plain RunnerBackend the API serves.
   */
  constructor(
    private readonly deps: TurnRunnerDeps,
    runner: RunnerBackend,
    private readonly relay: ExecRelay,
  ) {
    if (typeof (runner as Partial<TurnBackend>).renewTurnDriver !== 'function') throw new TypeError('RunTurn needs a runner backend that records its turn drivers (ControlPlaneRunnerBackend)');
    this.#runner = runner as TurnBackend;
  }

  async *runTurn(input: RunTurnInput, signal: AbortSignal): AsyncIterable<RunTurnEvent> {
    const local = JSON.stringify([input.groupId, input.memberId, input.idempotencyKey]);
    const first = this.#running.get(local);
    if (first !== undefined) {
      yield* this.#follow(first.decided, input, signal);
      return;
    }
    // Claimed here, synchronously: nothing was awaited since the lookup.
    const channel = new EventChannel();
    const decided = this.#begin(input, channel);
    const entry = { decided };
    this.#running.set(local, entry);
    const forget = (): void => {
      if (this.#running.get(local) === entry) this.#running.delete(local);
    };
    decided.then((d) => (d.end === undefined ? forget() : void d.end.then(forget, forget)), forget);
    const onAbort = (): void => channel.detach();
    signal.addEventListener('abort', onAbort, { once: true });
    if (signal.aborted) channel.detach();
    try {
      const d = await decided;
      if (d.end === undefined) {
        yield { kind: 'begun', begun: d.begun };
        const end = await this.#awaitOther(input, d.begun, signal);
        if (end !== undefined) yield { kind: 'end', end };
        return;
      }
      // `begun`, the CLI's events, `end`: all put by the drive, which does not wait for this caller.
      yield* channel.drain();
    } finally {
      signal.removeEventListener('abort', onAbort);
      channel.detach();
    }
  }

  /** A repeat of a call this replica is beginning or driving: its begin, then its end. */
  async *#follow(decided: Promise<Decided>, input: RunTurnInput, signal: AbortSignal): AsyncIterable<RunTurnEvent> {
    const d = await decided;
    yield { kind: 'begun', begun: d.begun };
    const end = d.end !== undefined ? await unlessAborted(d.end, signal) : await this.#awaitOther(input, d.begun, signal);
    if (end !== undefined) yield { kind: 'end', end };
  }

  /**
   * Check the request, begin the turn and — if this call's begin created it — start driving it,
   * detached from the caller. Refusals before the begin change nothing.
   */
  async #begin(input: RunTurnInput, channel: EventChannel): Promise<Decided> {
    const g = (await this.deps.groups.require(input.groupId)).value;
    const cli = g.members.find((m) => m.session.memberId === input.memberId)?.session.cli;
    if (cli === undefined) throw new NotFound('member_not_found', `member ${input.memberId} not in group ${input.groupId}`, { details: { groupId: input.groupId, memberId: input.memberId } });
    const profile: CliProfile | undefined = cli === 'claude_code' || cli === 'pi' || cli === 'codex' ? this.deps.config.cliProfiles[cli] : undefined;
    if (profile === undefined || SDK_CLI[cli] === undefined) {
      throw new PreconditionFailed('cli_unsupported', `the fleet has no way to run ${cli} turns (no CLI profile; OpenCode/Kilo need the live bridge): drive it with Exec`, { details: { cli } });
    }
    const keep = keepsTurnProcess(cli, profile);
    const plan = (locator: string | undefined, turnId: string): TurnPlan => {
      if (!keep) {
        const command = buildTurnCommand(cli, profile, { prompt: input.prompt, locator, model: input.model });
        return { kind: 'per_turn', command, input: command.stdin !== undefined ? Buffer.from(command.stdin) : undefined };
      }
      const started = buildTurnProcessCommand(cli, profile, { locator, model: input.model });
      const digest = createHash('sha256').update(started.identity).digest('base64url').slice(0, 32);
      return { kind: 'turn_process', command: started, digest, input: Buffer.from(turnInput(cli, input.prompt, turnId)) };
    };
    // Everything is checked before the turn begins: a refusal here changes nothing.
    const checked = plan(input.locator, 'check');
    const token = randomUUID();
    const begun = await this.#runner.beginTurn(
      { idempotencyKey: input.idempotencyKey, groupId: input.groupId, memberId: input.memberId, locator: input.locator },
      { commandDigest: checked.kind === 'turn_process' ? checked.digest : undefined, driver: { token, leaseMs: LEASE_MS } },
    );
    if (begun.driverToken !== token) return { begun, end: undefined };
    // This call created the turn: it drives it, from here on independent of every caller.
    void channel.put({ kind: 'begun', begun });
    const completeKey = `${input.idempotencyKey}:complete`.slice(0, 128);
    const end = this.#driveLeased(input, begun, plan(begun.locator !== '' ? begun.locator : undefined, begun.turnId), cli, completeKey, channel, token);
    end.then((e) => channel.put({ kind: 'end', end: e }).then(() => channel.close()), (err: unknown) => channel.close(err));
    return { begun, end };
  }

  /** The drive, with the driver's lease renewed while it runs; a lease lost cancels the turn's exec. */
  async #driveLeased(input: RunTurnInput, begun: BeginTurnView, plan: TurnPlan, cli: CliKind, completeKey: string, channel: EventChannel, token: string): Promise<RunTurnEndView> {
    const turnAbort = new AbortController();
    /** Set once the drive completes the turn: the lease is then released by that completion. */
    const completing = { now: false };
    const renew = setInterval(() => {
      this.#runner.renewTurnDriver(input.groupId, input.memberId, begun.turnId, token, LEASE_MS).then((ours) => {
        if (ours || completing.now || turnAbort.signal.aborted) return;
        this.deps.logger.warn({ groupId: input.groupId, memberId: input.memberId, turnId: begun.turnId }, 'RunTurn: the turn was completed without this driver (its lease was taken over): cancelling its exec');
        turnAbort.abort();
      }, (err: unknown) => this.deps.logger.warn({ err, turnId: begun.turnId }, 'RunTurn: renewing the driver lease failed (retried)'));
    }, LEASE_MS / 3);
    renew.unref?.();
    try {
      return await this.#drive(input, begun, plan, cli, completeKey, channel, turnAbort.signal, completing);
    } finally {
      clearInterval(renew);
    }
  }

  /**
   * A repeat of a turn another call drives (here, on another replica, or one that went away): wait
   * for its end while the caller stays, and answer it (undefined: the caller left). A driver whose
   * lease lapsed is gone: nothing proves how the turn ended, so it is completed as not ended
   * (UNCONFIRMED). A turn begun without a driver lease (a runner's own BeginTurn with this key) is
   * judged by the longest a turn may run.
   */
  async #awaitOther(input: RunTurnInput, begun: BeginTurnView, signal: AbortSignal): Promise<RunTurnEndView | undefined> {
    const completeKey = `${input.idempotencyKey}:complete`.slice(0, 128);
    const member = async () => (await this.deps.groups.require(input.groupId)).value.members.find((x) => x.session.memberId === input.memberId);
    const waitUntil = this.deps.now() + REPEAT_WAIT_MS;
    for (;;) {
      if (signal.aborted) return undefined;
      const m = await member();
      const f = m?.session.phase === 'IN_TURN' && m.session.inFlight?.turnId === begun.turnId ? m.session.inFlight : undefined;
      if (f === undefined) break;
      const driver = m?.turnDriver?.turnId === begun.turnId ? m.turnDriver : undefined;
      const now = this.deps.now();
      const lapsed = driver !== undefined ? now > driver.leaseUntilMs + DRIVER_LEASE_SKEW_MS : now - f.startedAtMs > this.deps.config.runTurnMaxMs;
      if (lapsed) {
        try {
          const evidence = notEnded('disconnect', 'the turn\'s driver went away before it ended', undefined);
          const completion = await this.#runner.completeTurn(
            { idempotencyKey: `${input.idempotencyKey}:takeover`.slice(0, 128), groupId: input.groupId, memberId: input.memberId, turnId: begun.turnId, evidence },
            driver !== undefined ? { takeOverFrom: driver.token } : undefined,
          );
          return { completion, evidence, observedLocator: undefined, exit: undefined };
        } catch (err) {
          // The driver renewed its lease meanwhile: it is alive after all.
          if (!(isFleetError(err) && err.reason === 'turn_in_flight')) throw err;
        }
      }
      if (now > waitUntil) throw new IdentityRefused('turn_in_flight', `turn ${begun.turnId} is still being run by another call; repeat the call later`, { details: { turnId: begun.turnId } });
      await unlessAborted(new Promise((r) => setTimeout(r, POLL_MS).unref?.()), signal);
    }
    // Ended already: answer what was recorded for it — the stored CompleteTurn answer of this call's
    // key when it is still the member's last, and the turn's recorded evidence.
    const m = await member();
    const record = m?.turns?.find((t) => t.turnId === begun.turnId);
    if (record !== undefined) {
      const stored = m?.calls?.complete?.key === keyDigest('complete', completeKey) ? m.calls.complete.outcome : undefined;
      const flags = decodeTurnFlags(record.flags);
      const evidence: TurnEvidenceInput = {
        kind: record.kind, ...flags, ...(record.exitCode !== undefined ? { exitCode: record.exitCode } : {}), ...(record.nativeTurnId !== undefined ? { nativeTurnId: record.nativeTurnId } : {}),
      };
      const kept = record.outcome === 'completed' || record.outcome === 'failed_kept';
      const completion: CompleteTurnView = stored !== undefined ? replayOutcome<CompleteTurnView>(stored) : {
        outcome: record.outcome, sessionKept: kept, ...(kept && record.observedLocator !== undefined ? { savedLocator: record.observedLocator } : {}), nextContextState: kept ? 'RESTORED' : 'LOST',
      };
      return { completion, evidence, observedLocator: record.observedLocator, exit: undefined };
    }
    // Cut off without a record (e.g. its evidence no longer kept): completed as not ended — a
    // repeat of an ended turn answers its recorded outcome (core completeTurn).
    const evidence = notEnded('disconnect', 'the turn\'s driver went away before it ended', undefined);
    const completion = await this.#runner.completeTurn({ idempotencyKey: completeKey, groupId: input.groupId, memberId: input.memberId, turnId: begun.turnId, evidence });
    return { completion, evidence, observedLocator: undefined, exit: undefined };
  }

  /**
   * Run the CLI and complete the turn; independent of the caller (who may leave). `abort`: the
   * driver lost its lease (the turn was completed without it): the exec is cancelled.
   */
  async #drive(input: RunTurnInput, begun: BeginTurnView, plan: TurnPlan, cli: CliKind, completeKey: string, channel: EventChannel, abort: AbortSignal, completing: { now: boolean }): Promise<RunTurnEndView> {
    /** The turn process this turn runs on (NEW/RESTORED: the one it starts; LIVE: the one reused). */
    let turnProcess: ProcessIdentity | undefined;
    const complete = async (evidence: TurnEvidenceInput, observedLocator: string | undefined, exit: ExecExitView | undefined): Promise<RunTurnEndView> => {
      completing.now = true;
      const completion = await this.#runner.completeTurn(
        { idempotencyKey: completeKey, groupId: input.groupId, memberId: input.memberId, turnId: begun.turnId, ...(observedLocator !== undefined ? { observedLocator } : {}), evidence, ...(input.protectInBackground === true ? { protectInBackground: true } : {}) },
        { process: turnProcess },
      );
      this.deps.metrics.runTurns.inc({ cli, ended: evidence.nativeTurnEnded ? (evidence.succeeded ? 'succeeded' : 'failed') : 'not_ended' });
      return { completion, evidence, observedLocator, exit };
    };
    const notStarted = async (kind: 'disconnect' | 'rejected', why: string, err: unknown): Promise<never> => {
      // The CLI never got this turn: nothing of the native session changed, but the turn cannot be said to have ended.
      await complete(notEnded(kind, why, undefined), undefined, undefined).catch((e2: unknown) => this.deps.logger.warn({ err: e2 }, 'completing a turn that never started failed'));
      throw err;
    };
    let onProcess: ExecStartInput['turnProcess'];
    if (plan.kind === 'turn_process') {
      if (begun.contextState === 'LIVE') {
        // Core answers LIVE to RunTurn only for a turn process the agent listed (runner-backend.ts);
        // the begin recorded it as the in-flight turn's process.
        let live: ProcessIdentity | undefined;
        try {
          const m = (await this.deps.groups.require(input.groupId)).value.members.find((x) => x.session.memberId === input.memberId);
          live = m?.session.inFlight?.turnId === begun.turnId ? m.session.inFlight.process : undefined;
        } catch (err) {
          return notStarted('rejected', `the turn's record could not be read: ${(err as Error).message}`, err);
        }
        if (live === undefined || !isTurnProcess(live)) {
          return notStarted('rejected', 'LIVE without a turn process to attach to', new Error(`turn ${begun.turnId} is LIVE but names no turn process`));
        }
        turnProcess = live;
        onProcess = { mode: 'attach', processId: live.incarnation.slice(live.incarnation.indexOf('/') + 1) };
      } else {
        onProcess = { mode: 'start', commandDigest: plan.digest };
      }
    }
    // The fleet's longest turn bounds every turn, also one asking for longer (or for none).
    const maxMs = this.deps.config.runTurnMaxMs;
    const timeoutMs = input.timeoutMs > 0 ? Math.min(input.timeoutMs, maxMs) : maxMs;
    let session: ExecSession;
    try {
      session = await this.relay.exec({
        groupId: input.groupId, memberId: input.memberId, argv: plan.command.argv, env: Object.entries(plan.command.env).map(([name, value]) => ({ name, value })),
        workingDir: '', stdin: plan.input !== undefined, timeoutMs, outputLimitBytes: 0, expectedGeneration: begun.generation, cancelGraceMs: 0,
        outputWindowBytes: TURN_WINDOW_BYTES, recordsActivity: false,
        ...(onProcess !== undefined ? { turnProcess: onProcess } : {}),
      }, abort);
    } catch (err) {
      return notStarted(onProcess?.mode === 'attach' ? 'rejected' : 'disconnect', `the CLI could not be ${onProcess?.mode === 'attach' ? 'reached' : 'started'}: ${(err as Error).message}`, err);
    }
    if (plan.kind === 'turn_process' && session.started.processId !== undefined) {
      turnProcess = turnProcessIn({ containerId: session.started.containerId, incarnation: session.started.incarnation }, session.started.processId);
    }
    const expected = begun.locator !== undefined && begun.locator !== '' ? { expectedLocator: begun.locator } : {};
    // Codex runs as `codex exec --json` (one turn per process), not as the app-server the SDK's
    // default Codex detector reads.
    const detector: TurnEndDetector = cli === 'codex' ? createCodexExecDetector(expected) : createDetector(SDK_CLI[cli]!, expected);
    const lines = new LineSplitter();
    const onLine = (line: Buffer): void => {
      try {
        detector.observe(JSON.parse(line.toString('utf8')) as unknown);
      } catch {
        detector.observe(undefined);
      }
    };
    // The turn's input (a turn process's turn, Codex's prompt): written as the agent grants stdin
    // credit. A process per turn reads its input to its end: stdin is closed once it is written.
    const pending = plan.input ?? Buffer.alloc(0);
    let stdinOpen = plan.input !== undefined;
    let written = 0;
    let credit = 0;
    let ended = false;
    let exit: ExecExitView | undefined;
    try {
      for await (const e of session.events()) {
        if (e.kind === 'output') {
          if (e.stream === 'stdout') {
            const found: { line: Buffer; bytes: number }[] = [];
            const free = lines.push(e.data, (line, bytes) => {
              onLine(line);
              found.push({ line, bytes });
            });
            // Bytes of an unfinished line are credited only with their line: at most one line is held.
            if (free > 0) session.consumed(free);
            for (const f of found) await channel.put({ kind: 'cli_event', line: f.line }, () => session.consumed(f.bytes));
          } else {
            await channel.put({ kind: 'stderr', data: e.data }, () => session.consumed(e.data.length));
          }
        } else if (e.kind === 'stdin_credit') {
          credit += e.bytes;
          while (written < pending.length && credit > 0) {
            const n = Math.min(credit, STDIN_FRAME, pending.length - written);
            session.writeStdin(pending.subarray(written, written + n));
            written += n;
            credit -= n;
          }
          if (plan.kind === 'per_turn' && stdinOpen && written === pending.length) {
            stdinOpen = false;
            session.closeStdin();
          }
        } else if (e.kind === 'exit') {
          exit = e.exit;
        }
        if (plan.kind === 'turn_process' && !ended && detector.nativeTurnEnded) {
          ended = true;
          // The CLI ended the turn: keep its process for the next turn, or (R-S6 api_retry) let it
          // exit and wait for that exit, as a `-p` process would.
          if (detector.result().processWillExit) session.closeStdin();
          else session.detach();
        }
      }
    } catch (err) {
      const why = isFleetError(err) ? `${err.reason}: ${err.message}` : String(err);
      if (detector.nativeTurnEnded) {
        // The CLI ended its turn; only the way back failed: the session is kept, the process is not
        // reused (its exit is not confirmed: R-S6 reclaims its container run before the next start).
        detector.onTransport('disconnect', why);
        const evidence = detector.result();
        return complete({ ...evidenceInput(evidence, undefined), inputBytes: Buffer.byteLength(input.prompt) }, evidence.observedLocator, undefined);
      }
      // Fenced or lost mid-turn: not a turn end; the next begin reports LOST (R-S5).
      await complete(notEnded('disconnect', why, undefined), undefined, undefined).catch((e2: unknown) => this.deps.logger.warn({ err: e2 }, 'completing a lost turn failed'));
      throw isFleetError(err) ? err : new Unavailable('exec_transport_lost', why);
    }
    lines.end(onLine);
    if (!detector.nativeTurnEnded) {
      const kind = exit?.end === 'deadline' ? 'timeout' : exit?.end === 'cancelled' ? 'cancelled' : 'disconnect';
      detector.onTransport(kind, `the CLI exited (${exit?.end ?? 'unknown'}, code ${exit?.exitCode ?? '?'}) before the turn ended`);
    }
    const evidence = detector.result();
    return complete({ ...evidenceInput(evidence, exit), inputBytes: Buffer.byteLength(input.prompt), outputBytes: (exit?.stdoutBytes ?? 0) + (exit?.stderrBytes ?? 0) }, evidence.observedLocator, exit);
  }
}
