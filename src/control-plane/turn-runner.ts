// RunTurn (R-I9): a whole native turn through the fleet. BeginTurn; the CLI's own command built by
// core (turn-command.ts) from the typed request and the operator's CLI profile; run through the
// exec relay in the member's container on its current placement; the CLI's stdout read line by
// line into the SAME turn-end detector the runner SDK ships (R-S5: only the CLI's own end event
// ends a turn); CompleteTurn with that evidence. The caller gets the CLI's events as they come.
// A caller that goes away is not a turn end (R-S5): the turn goes on here to the CLI's own end (or
// its timeout) and is completed with what the CLI said, so a reconnecting runner that repeats the
// call with the same idempotency key gets the stored end. A repeat that finds the turn in flight
// with nobody here running it (this replica restarted) completes it as not ended (UNCONFIRMED):
// nothing proves how it ended. Fenced or lost mid-turn (the host went away): completed as not
// ended, and the call fails UNAVAILABLE.
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
import { createHash } from 'node:crypto';
import { IdentityRefused, NotFound, PreconditionFailed, buildTurnCommand, buildTurnProcessCommand, isFleetError, isTurnProcess, keepsTurnProcess, turnInput, turnProcessIn, Unavailable, type CliKind, type CliProfile, type ProcessIdentity } from '../core/index.ts';
import type { ExecExitView, ExecSession, ExecStartInput, RunTurnEndView, RunTurnEvent, RunTurnInput } from '../core/exec-port.ts';
import type { BeginTurnInput, BeginTurnView, CompleteTurnInput, CompleteTurnView, RunnerBackend, TurnEvidenceInput } from '../core/runner-port.ts';
import { createDetector } from '../runner-sdk/detectors/factory.ts';
import type { TurnEndDetector } from '../runner-sdk/detectors/detector.ts';
import type { CliKind as SdkCliKind, TurnEndEvidence } from '../runner-sdk/evidence.ts';
import type { ExecRelay } from './exec-relay.ts';
import { keyDigest, replayOutcome } from './idempotency.ts';
import { decodeTurnFlags } from './records.ts';
import type { FleetTurn } from './runner-backend.ts';
import type { ControlPlaneDeps } from './state.ts';

export type TurnRunnerDeps = Pick<ControlPlaneDeps, 'config' | 'groups' | 'metrics' | 'logger' | 'now'>;

const MAX_LINE_BYTES = 8 * 1024 * 1024;
/** Events held for a slow caller before the turn waits for it (the exec window bounds bytes too). */
const MAX_PENDING_EVENTS = 256;
const SDK_CLI: Partial<Record<CliKind, SdkCliKind>> = { claude_code: 'claude-code', pi: 'pi', codex: 'codex' };
/** Stdin payload per frame (the relay's bound). */
const STDIN_FRAME = 128 * 1024;

/**
 * The runner backend as RunTurn uses it: the begin names the turn process's command digest, the end
 * names the turn process the turn ran on (ControlPlaneRunnerBackend). A backend that ignores both
 * never reports LIVE for RunTurn (no turn process is ever recorded).
 */
export interface TurnBackend extends RunnerBackend {
  beginTurn(input: BeginTurnInput, fleet?: FleetTurn): Promise<BeginTurnView>;
  completeTurn(input: CompleteTurnInput, fleet?: { readonly process?: ProcessIdentity | undefined }): Promise<CompleteTurnView>;
}

/** How one turn is run: its own CLI process, or on the member's turn process. */
type TurnPlan =
  | { readonly kind: 'per_turn'; readonly command: { argv: string[]; env: Record<string, string> } }
  | { readonly kind: 'turn_process'; readonly command: { argv: string[]; env: Record<string, string> }; readonly digest: string; readonly input: Buffer };

/** Splits a byte stream into lines (without the newline), each at most MAX_LINE_BYTES; longer ones are dropped. */
class LineSplitter {
  #parts: Buffer[] = [];
  #size = 0;
  #skipping = false;

  push(chunk: Uint8Array, onLine: (line: Buffer) => void): void {
    let data = Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    for (let nl = data.indexOf(10); nl !== -1; nl = data.indexOf(10)) {
      const piece = data.subarray(0, nl);
      data = data.subarray(nl + 1);
      if (!this.#skipping) {
        const line = this.#parts.length === 0 ? Buffer.from(piece) : Buffer.concat([...this.#parts, piece]);
        if (line.length <= MAX_LINE_BYTES) onLine(line);
      }
      this.#parts = [];
      this.#size = 0;
      this.#skipping = false;
    }
    if (this.#skipping || data.length === 0) return;
    this.#size += data.length;
    if (this.#size > MAX_LINE_BYTES) {
      this.#parts = [];
      this.#skipping = true;
      return;
    }
    this.#parts.push(Buffer.from(data));
  }

  end(onLine: (line: Buffer) => void): void {
    if (!this.#skipping && this.#size > 0) onLine(Buffer.concat(this.#parts));
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

/** A bounded hand-off from the turn (producer) to the caller (consumer); the turn goes on without one. */
class EventChannel {
  readonly #queue: RunTurnEvent[] = [];
  #wakeConsumer: (() => void) | undefined;
  #wakeProducer: (() => void) | undefined;
  #closed = false;
  #error: unknown;
  #detached = false;

  /** The caller left: from now on events are dropped and the producer never waits. */
  detach(): void {
    this.#detached = true;
    this.#queue.length = 0;
    this.#wakeProducer?.();
  }

  async put(e: RunTurnEvent): Promise<void> {
    if (this.#detached) return;
    this.#queue.push(e);
    this.#wakeConsumer?.();
    while (this.#queue.length >= MAX_PENDING_EVENTS && !this.#detached) await new Promise<void>((r) => (this.#wakeProducer = r));
  }

  close(error?: unknown): void {
    this.#closed = true;
    this.#error = error;
    this.#wakeConsumer?.();
  }

  async *drain(): AsyncIterable<RunTurnEvent> {
    for (;;) {
      const e = this.#queue.shift();
      if (e !== undefined) {
        this.#wakeProducer?.();
        yield e;
        continue;
      }
      if (this.#closed) {
        if (this.#error !== undefined) throw this.#error;
        return;
      }
      await new Promise<void>((r) => (this.#wakeConsumer = r));
      this.#wakeConsumer = undefined;
    }
  }
}

export class TurnRunner {
  /** Turns this replica is driving, by turn id: a repeat of the call waits for the first one's end. */
  readonly #running = new Map<string, Promise<RunTurnEndView>>();

  constructor(
    private readonly deps: TurnRunnerDeps,
    private readonly runner: TurnBackend,
    private readonly relay: ExecRelay,
  ) {}

  async *runTurn(input: RunTurnInput, signal: AbortSignal): AsyncIterable<RunTurnEvent> {
    const g = (await this.deps.groups.require(input.groupId)).value;
    const cli = g.members.find((m) => m.session.memberId === input.memberId)?.session.cli;
    // Everything is checked before the turn begins: a refusal here changes nothing.
    if (cli === undefined) throw new NotFound('member_not_found', `member ${input.memberId} not in group ${input.groupId}`, { details: { groupId: input.groupId, memberId: input.memberId } });
    const profile: CliProfile | undefined = cli === 'claude_code' || cli === 'pi' ? this.deps.config.cliProfiles[cli] : undefined;
    if (profile === undefined || SDK_CLI[cli] === undefined) {
      throw new PreconditionFailed('cli_unsupported', `the fleet has no way to run ${cli} turns (no CLI profile; OpenCode/Kilo need the live bridge): drive it with Exec`, { details: { cli } });
    }
    const keep = keepsTurnProcess(cli, profile);
    const plan = (locator: string | undefined, turnId: string): TurnPlan => {
      if (!keep) return { kind: 'per_turn', command: buildTurnCommand(cli, profile, { prompt: input.prompt, locator, model: input.model }) };
      const started = buildTurnProcessCommand(cli, profile, { locator, model: input.model });
      const digest = createHash('sha256').update(started.identity).digest('base64url').slice(0, 32);
      return { kind: 'turn_process', command: started, digest, input: Buffer.from(turnInput(cli, input.prompt, turnId)) };
    };
    const checked = plan(input.locator, 'check');
    const completeKey = `${input.idempotencyKey}:complete`.slice(0, 128);
    const calledAt = this.deps.now();
    const begun = await this.runner.beginTurn(
      { idempotencyKey: input.idempotencyKey, groupId: input.groupId, memberId: input.memberId, locator: input.locator },
      { commandDigest: checked.kind === 'turn_process' ? checked.digest : undefined },
    );
    yield { kind: 'begun', begun };

    const mine = this.#running.get(begun.turnId);
    if (mine !== undefined) {
      // A repeat of a turn this replica is still driving: its end, when it comes.
      yield { kind: 'end', end: await mine };
      return;
    }
    const inFlight = async (): Promise<{ startedAtMs: number; process: ProcessIdentity | undefined } | undefined> => {
      const m = (await this.deps.groups.require(input.groupId)).value.members.find((x) => x.session.memberId === input.memberId);
      return m?.session.phase === 'IN_TURN' && m.session.inFlight?.turnId === begun.turnId ? { startedAtMs: m.session.inFlight.startedAtMs, process: m.session.inFlight.process } : undefined;
    };
    // This call began the turn when its begin is stamped no earlier than the call (a repeated key
    // answers the stored begin, stamped when the first call began it).
    const flight = await inFlight();
    if (flight !== undefined && flight.startedAtMs === begun.startedAtMs && begun.startedAtMs >= calledAt) {
      yield* this.#driveNew(input, begun, plan(begun.locator !== '' ? begun.locator : undefined, begun.turnId), cli, completeKey, signal, flight.process);
      return;
    }
    yield { kind: 'end', end: await this.#awaitOther(input, begun, completeKey, inFlight) };
  }

  /**
   * A repeat of a turn another driver began (another replica, or one that went away): wait for its
   * end and answer it. A turn still in flight past the longest a turn may run has lost its driver:
   * nothing proves how it ended, so it is completed as not ended (UNCONFIRMED).
   */
  async #awaitOther(input: RunTurnInput, begun: BeginTurnView, completeKey: string, inFlight: () => Promise<{ startedAtMs: number } | undefined>): Promise<RunTurnEndView> {
    const waitUntil = this.deps.now() + 60_000;
    for (let f = await inFlight(); f !== undefined; f = await inFlight()) {
      if (this.deps.now() - f.startedAtMs > this.deps.config.runTurnMaxMs) break;
      if (this.deps.now() > waitUntil) throw new IdentityRefused('turn_in_flight', `turn ${begun.turnId} is still being run by another control-plane replica; repeat the call later`, { details: { turnId: begun.turnId } });
      await new Promise((r) => setTimeout(r, 500));
    }
    // Ended already: answer what was recorded for it — the stored CompleteTurn answer of this call's
    // key when it is still the member's last, and the turn's recorded evidence.
    const m = (await this.deps.groups.require(input.groupId)).value.members.find((x) => x.session.memberId === input.memberId);
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
    // In flight past the longest a turn may run (its driver is gone), or cut off without a record.
    const evidence = notEnded('disconnect', 'the turn\'s driver went away before it ended', undefined);
    const completion = await this.runner.completeTurn({ idempotencyKey: completeKey, groupId: input.groupId, memberId: input.memberId, turnId: begun.turnId, evidence });
    return { completion, evidence, observedLocator: undefined, exit: undefined };
  }

  async *#driveNew(input: RunTurnInput, begun: BeginTurnView, plan: TurnPlan, cli: CliKind, completeKey: string, signal: AbortSignal, live: ProcessIdentity | undefined): AsyncIterable<RunTurnEvent> {
    const channel = new EventChannel();
    const onAbort = (): void => channel.detach();
    signal.addEventListener('abort', onAbort, { once: true });
    const driven = this.#drive(input, begun, plan, cli, completeKey, channel, live);
    this.#running.set(begun.turnId, driven);
    driven.then((end) => channel.put({ kind: 'end', end }).then(() => channel.close()), (err: unknown) => channel.close(err))
      .finally(() => this.#running.delete(begun.turnId));
    try {
      yield* channel.drain();
    } finally {
      signal.removeEventListener('abort', onAbort);
      channel.detach();
    }
  }

  /**
   * Run the CLI and complete the turn; independent of the caller (who may leave). `live`: for a LIVE
   * turn, the turn process the begin reused (from the member's in-flight turn).
   */
  async #drive(input: RunTurnInput, begun: BeginTurnView, plan: TurnPlan, cli: CliKind, completeKey: string, channel: EventChannel, live: ProcessIdentity | undefined): Promise<RunTurnEndView> {
    /** The turn process this turn runs on (NEW/RESTORED: the one it starts; LIVE: the one reused). */
    let turnProcess: ProcessIdentity | undefined;
    const complete = async (evidence: TurnEvidenceInput, observedLocator: string | undefined, exit: ExecExitView | undefined): Promise<RunTurnEndView> => {
      const completion = await this.runner.completeTurn(
        { idempotencyKey: completeKey, groupId: input.groupId, memberId: input.memberId, turnId: begun.turnId, ...(observedLocator !== undefined ? { observedLocator } : {}), evidence },
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
        // Core answers LIVE to RunTurn only for a turn process the agent listed (runner-backend.ts).
        if (live === undefined || !isTurnProcess(live)) {
          return notStarted('rejected', 'LIVE without a turn process to attach to', new Error(`turn ${begun.turnId} is LIVE but names no turn process`));
        }
        turnProcess = live;
        onProcess = { mode: 'attach', processId: live.incarnation.slice(live.incarnation.indexOf('/') + 1) };
      } else {
        onProcess = { mode: 'start', commandDigest: plan.digest };
      }
    }
    const turnAbort = new AbortController();
    let session: ExecSession;
    try {
      session = await this.relay.exec({
        groupId: input.groupId, memberId: input.memberId, argv: plan.command.argv, env: Object.entries(plan.command.env).map(([name, value]) => ({ name, value })),
        workingDir: '', stdin: plan.kind === 'turn_process', timeoutMs: input.timeoutMs, outputLimitBytes: 0, expectedGeneration: begun.generation, cancelGraceMs: 0,
        ...(onProcess !== undefined ? { turnProcess: onProcess } : {}),
      }, turnAbort.signal);
    } catch (err) {
      return notStarted(onProcess?.mode === 'attach' ? 'rejected' : 'disconnect', `the CLI could not be ${onProcess?.mode === 'attach' ? 'reached' : 'started'}: ${(err as Error).message}`, err);
    }
    if (plan.kind === 'turn_process' && session.started.processId !== undefined) {
      turnProcess = turnProcessIn({ containerId: session.started.containerId, incarnation: session.started.incarnation }, session.started.processId);
    }
    const detector: TurnEndDetector = createDetector(SDK_CLI[cli]!, begun.locator !== undefined && begun.locator !== '' ? { expectedLocator: begun.locator } : {});
    const lines = new LineSplitter();
    const onLine = (line: Buffer): void => {
      try {
        detector.observe(JSON.parse(line.toString('utf8')) as unknown);
      } catch {
        detector.observe(undefined);
      }
    };
    // The turn's input (turn processes): written as the agent grants stdin credit.
    const pending = plan.kind === 'turn_process' ? plan.input : Buffer.alloc(0);
    let written = 0;
    let credit = 0;
    let ended = false;
    let exit: ExecExitView | undefined;
    try {
      for await (const e of session.events()) {
        if (e.kind === 'output') {
          if (e.stream === 'stdout') {
            const found: Buffer[] = [];
            lines.push(e.data, (line) => {
              onLine(line);
              found.push(line);
            });
            for (const line of found) await channel.put({ kind: 'cli_event', line });
          } else {
            await channel.put({ kind: 'stderr', data: e.data });
          }
          session.consumed(e.data.length);
        } else if (e.kind === 'stdin_credit') {
          credit += e.bytes;
          while (written < pending.length && credit > 0) {
            const n = Math.min(credit, STDIN_FRAME, pending.length - written);
            session.writeStdin(pending.subarray(written, written + n));
            written += n;
            credit -= n;
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
