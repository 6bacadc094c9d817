// The runner's typed client for the runner gRPC API (R-I1): promise methods, one deadline per
// logical call (spanning retries), and retries that cannot duplicate work: only UNAVAILABLE and
// ABORTED are retried, always with the same idempotency key, which the client generates once per
// logical call (so a retry after a lost response gets the first answer, never a second turn).
// Every failure surfaces as a RunnerError carrying the gRPC code and the machine-readable `reason`
// from the ErrorDetail in grpc-status-details-bin; callers switch on `reason`, never on text.
// Also here: the mapping from the detectors' TurnEndEvidence (evidence.ts) to the wire message.
import * as grpc from '@grpc/grpc-js';
import { ExponentialBackoff, handleWhen, retry } from 'cockatiel';
import { randomUUID } from 'node:crypto';
import { CliKind as ProtoCliKind, ErrorDetail, RpcStatus, TurnEndKind, type ContextState } from '../gen/sandboxfleet/v1/common.ts';
import {
  RunnerServiceClient,
  type BeginTurnResponse,
  type CompleteTurnResponse,
  type GetGroupStateResponse,
  type OpenGroupResponse,
  type RunTurnResponse,
  type StopGroupResponse,
  type TurnEndEvidence as WireTurnEndEvidence,
} from '../gen/sandboxfleet/v1/runner.ts';
import { ExecStream, type ExecExit, type ExecRequest, type ExecResponse, type ExecStarted } from '../gen/sandboxfleet/v1/exec.ts';
import { MAX_ERROR_CHARS, type CliKind, type EndKind, type TurnEndEvidence } from './evidence.ts';

export const ERROR_DETAIL_TYPE_URL = 'type.googleapis.com/sandboxfleet.v1.ErrorDetail';

/** RunTurn with a timeout: the call's deadline is the turn's timeout plus this (begin, completion). */
const RUN_TURN_MARGIN_MS = 60_000;

/** The codes a retry may fix without risk (with the same idempotency key): R-I1. */
const RETRYABLE = new Set<grpc.status>([grpc.status.UNAVAILABLE, grpc.status.ABORTED]);

/** A failed runner API call. `reason` is the server's ErrorDetail reason (or a client-side one). */
export class RunnerError extends Error {
  readonly code: grpc.status;
  /** e.g. `FAILED_PRECONDITION`. */
  readonly codeName: string;
  /** Machine-readable cause: `locator_mismatch`, `turn_in_flight`, `context_lost`, `cas_conflict`, ... */
  readonly reason: string;
  readonly metadata: Readonly<Record<string, string>>;
  /** Who raised it (`control-plane`, `host-agent`), empty if unknown. */
  readonly domain: string;
  /** The idempotency key the call used (mutating calls), so a caller can correlate with server logs. */
  readonly idempotencyKey: string | undefined;

  constructor(init: { code: grpc.status; message: string; reason: string; metadata?: Record<string, string>; domain?: string; idempotencyKey?: string | undefined }) {
    super(init.message);
    this.name = 'RunnerError';
    this.code = init.code;
    this.codeName = grpc.status[init.code] ?? String(init.code);
    this.reason = init.reason;
    this.metadata = init.metadata ?? {};
    this.domain = init.domain ?? '';
    this.idempotencyKey = init.idempotencyKey;
  }

  /** True for UNAVAILABLE and ABORTED: safe to retry with the same idempotency key. */
  get retryable(): boolean {
    return RETRYABLE.has(this.code);
  }
}

/** Reads the ErrorDetail a server put in `grpc-status-details-bin`. */
export function errorDetailOf(metadata: grpc.Metadata | undefined): ErrorDetail | undefined {
  const raw = metadata?.get('grpc-status-details-bin')[0];
  if (!Buffer.isBuffer(raw)) return undefined;
  try {
    const any = RpcStatus.decode(raw).details.find((d) => d.typeUrl === ERROR_DETAIL_TYPE_URL);
    return any === undefined ? undefined : ErrorDetail.decode(any.value);
  } catch {
    return undefined;
  }
}

/** Converts a grpc-js ServiceError to a RunnerError; codes without a detail get a reason from the code. */
export function toRunnerError(error: unknown, idempotencyKey?: string): RunnerError {
  if (error instanceof RunnerError) return error;
  const e = error as Partial<grpc.ServiceError>;
  if (typeof e?.code === 'number') {
    const detail = errorDetailOf(e.metadata);
    return new RunnerError({
      code: e.code,
      message: e.details || e.message || grpc.status[e.code] || 'call failed',
      reason: detail?.reason || (grpc.status[e.code] ?? 'unknown').toLowerCase(),
      metadata: detail?.metadata ?? {},
      domain: detail?.domain ?? '',
      idempotencyKey,
    });
  }
  return new RunnerError({ code: grpc.status.UNKNOWN, message: error instanceof Error ? error.message : String(error), reason: 'client_error', idempotencyKey });
}

// ---------------------------------------------------------------------------------------------
// Evidence → wire.

const CLI_TO_PROTO: Readonly<Record<CliKind, ProtoCliKind>> = {
  'claude-code': ProtoCliKind.CLAUDE_CODE,
  codex: ProtoCliKind.CODEX,
  pi: ProtoCliKind.PI,
  opencode: ProtoCliKind.OPENCODE,
  kilo: ProtoCliKind.KILO,
};
const CLI_FROM_PROTO = new Map<ProtoCliKind, CliKind>(Object.entries(CLI_TO_PROTO).map(([k, v]) => [v, k as CliKind]));

export const cliKindToProto = (cli: CliKind): ProtoCliKind => CLI_TO_PROTO[cli];
export const cliKindFromProto = (kind: ProtoCliKind): CliKind | undefined => CLI_FROM_PROTO.get(kind);

const END_KIND_TO_PROTO: Readonly<Record<Exclude<EndKind, 'none'>, TurnEndKind>> = {
  result: TurnEndKind.RESULT,
  turn_completed: TurnEndKind.TURN_COMPLETED,
  agent_end: TurnEndKind.AGENT_END,
  settled: TurnEndKind.SETTLED,
  api_retry: TurnEndKind.API_RETRY,
  disconnect: TurnEndKind.DISCONNECT,
  timeout: TurnEndKind.TIMEOUT,
  cancelled: TurnEndKind.CANCELLED,
  rejected: TurnEndKind.REJECTED,
  process_exited: TurnEndKind.PROCESS_EXITED,
};

/** What the driver knows beyond the detector's evidence (R-S5 b, R-S6). */
export interface DriverFacts {
  /** (b) Activation cleanup finished. */
  readonly cleanupFinished: boolean;
  /**
   * The driver saw the CLI process exit (e.g. a `claude -p` exec returned). The process is gone, so
   * the next turn is RESTORED, not LIVE; after an api_retry (R-S6) an exit the driver did NOT see
   * makes the control plane restart the member's container before the next start.
   */
  readonly exitConfirmed?: boolean;
  readonly exitCode?: number;
  /** Bytes the driver sent the CLI for this turn (its prompt), and read back from it: recorded with the turn's evidence. */
  readonly inputBytes?: number;
  readonly outputBytes?: number;
}

/**
 * The CompleteTurn fields for a detector's evidence. A turn the driver stopped waiting for with
 * nothing decisive seen (`none`) is reported as its transport event, else as CANCELLED: never as a
 * native end (R-S5). `locator_usable` requires an observed locator and no second root id (R-S2).
 */
export function completeTurnEvidence(evidence: TurnEndEvidence, facts: DriverFacts): { observedLocator: string | undefined; evidence: WireTurnEndEvidence } {
  const kind = evidence.endKind === 'none' ? (evidence.transport?.kind ?? 'cancelled') : evidence.endKind;
  return {
    observedLocator: evidence.observedLocator,
    evidence: {
      kind: END_KIND_TO_PROTO[kind],
      nativeTurnEnded: evidence.nativeTurnEnded,
      succeeded: evidence.nativeTurnEnded && evidence.succeeded,
      cleanupFinished: facts.cleanupFinished,
      transportUsable: evidence.transportUsable,
      locatorUsable: evidence.observedLocator !== undefined && evidence.locatorConflict === undefined,
      processExited: evidence.processWillExit || evidence.endKind === 'process_exited' || facts.exitConfirmed === true,
      exitConfirmed: facts.exitConfirmed ?? false,
      exitCode: facts.exitConfirmed ? facts.exitCode : undefined,
      nativeTurnId: evidence.nativeTurnId ?? '',
      errorMessage: (evidence.error ?? '').slice(0, MAX_ERROR_CHARS),
      ...(facts.inputBytes !== undefined ? { inputBytes: facts.inputBytes } : {}),
      ...(facts.outputBytes !== undefined ? { outputBytes: facts.outputBytes } : {}),
    },
  };
}

// ---------------------------------------------------------------------------------------------
// The client.

export interface RunnerClientTls {
  /** PEM of the CA that signed the server certificate. */
  readonly ca: Buffer;
  /** PEM of this runner's client certificate and key (role runner, R-R5). */
  readonly cert: Buffer;
  readonly key: Buffer;
  /** Overrides the TLS server name checked against the certificate (e.g. when dialing an IP alias). */
  readonly serverName?: string;
}

export interface RunnerClientOptions {
  /** host:port of the control plane's API. */
  readonly address: string;
  /** mTLS (required by the server outside loopback dev mode). */
  readonly tls?: RunnerClientTls;
  /** Plaintext, for a local dev server on loopback only. Exactly one of tls / insecureLocalDev. */
  readonly insecureLocalDev?: boolean;
  /**
   * Default deadline per logical call, retries included. When not given: 10 s for a read
   * (GetGroupState), and WORK_DEADLINE_MS for the calls that may have to start, stop or checkpoint
   * a group before they answer (OpenGroup, BeginTurn on a stopped group, CompleteTurn with
   * idle_stop_after 0, StopGroup), which take seconds on a loaded host.
   */
  readonly deadlineMs?: number;
  readonly retry?: {
    /** Retries after the first attempt; default 4. */
    readonly maxRetries?: number;
    readonly initialDelayMs?: number;
    readonly maxDelayMs?: number;
  };
  readonly channelOptions?: grpc.ChannelOptions;
}

export interface CallOptions {
  /** Overrides the client's default deadline for this call. */
  readonly deadlineMs?: number;
  /** Use this key instead of a generated one (e.g. to resume a call after a runner restart). */
  readonly idempotencyKey?: string;
  readonly signal?: AbortSignal;
}

export interface OpenGroupArgs {
  readonly conversationId: string;
  readonly members: readonly { readonly memberId: string; readonly cli: CliKind }[];
  /**
   * The conversation's group is LOST: start the conversation anew in a new, empty group. Without
   * it, opening a LOST conversation is refused `conversation_lost` (a LOST conversation stays loud).
   */
  readonly startAnew?: boolean;
}

export interface BeginTurnArgs {
  readonly groupId: string;
  readonly memberId: string;
  /** Omit to resume the saved locator (R-S3). */
  readonly locator?: string;
}

export interface CompleteTurnArgs {
  readonly groupId: string;
  readonly memberId: string;
  readonly turnId: string;
  readonly observedLocator?: string | undefined;
  readonly evidence: WireTurnEndEvidence;
  /**
   * idle_stop_after 0: answer once the turn's end is stored; the stop and checkpoint follow the
   * answer (response.protectionPending) instead of preceding it. Faster turns, but the conversation
   * is unprotected until the checkpoint is taken (see runner.proto).
   */
  readonly protectInBackground?: boolean;
}

export interface StopGroupArgs {
  readonly groupId: string;
  readonly graceMs?: number;
}

export type GetGroupStateArgs = { readonly groupId: string } | { readonly conversationId: string };

export interface RunTurnArgs {
  readonly groupId: string;
  readonly memberId: string;
  readonly prompt: string;
  /** Omit to resume the saved locator (R-S3). */
  readonly locator?: string;
  readonly model?: string;
  /** As CompleteTurnArgs.protectInBackground, for the completion that ends the turn. */
  readonly protectInBackground?: boolean;
}

export interface ExecArgs {
  readonly groupId: string;
  readonly memberId: string;
  readonly argv: readonly string[];
  readonly env?: Readonly<Record<string, string>>;
  readonly workingDir?: string;
  /** Attach stdin (then `write` and `closeStdin`). */
  readonly stdin?: boolean;
  readonly timeoutMs?: number;
  readonly outputLimitBytes?: number;
  /** The placement generation you believe in (e.g. BeginTurn's); another one is refused. */
  readonly expectedGeneration?: number;
  /**
   * The container run you believe in (`started.incarnation` of an earlier exec): refused
   * `stale_generation` if the member's container restarted since.
   */
  readonly expectedIncarnation?: string;
  readonly cancelGraceMs?: number;
}

export type ExecOutputEvent =
  | { readonly kind: 'stdout' | 'stderr'; readonly data: Buffer }
  | { readonly kind: 'exit'; readonly exit: ExecExit };

/** A running Exec: its placement, its output, its stdin. */
export class ExecHandle {
  #credit = 0;
  #creditWaiters: (() => void)[] = [];
  /** The call ended (exit, refusal, cancel): no more credit will come. */
  #ended = false;

  constructor(
    private readonly call: grpc.ClientDuplexStream<ExecRequest, ExecResponse>,
    private readonly frames: AsyncIterator<ExecResponse>,
    readonly started: ExecStarted,
  ) {
    // However the call ends — read to the end or not — a pending write is released.
    call.on('status', () => this.#end());
    call.on('close', () => this.#end());
  }

  #end(): void {
    this.#ended = true;
    for (const w of this.#creditWaiters.splice(0)) w();
  }

  /** Output chunks as the process writes them, then its exit. Throws RunnerError on a refusal or a lost host. */
  async *output(): AsyncIterable<ExecOutputEvent> {
    try {
      for (let r = await this.frames.next(); r.done !== true; r = await this.frames.next()) {
        const f = r.value.frame;
        if (f === undefined) continue;
        if (f.$case === 'output') yield { kind: f.value.stream === ExecStream.STDERR ? 'stderr' : 'stdout', data: f.value.data };
        else if (f.$case === 'stdinCredit') {
          this.#credit += f.value;
          for (const w of this.#creditWaiters.splice(0)) w();
        } else if (f.$case === 'exit') yield { kind: 'exit', exit: f.value };
      }
    } catch (error) {
      throw toRunnerError(error);
    } finally {
      this.#end();
    }
  }

  /**
   * Send stdin, waiting for the fleet's credit (read `output()` meanwhile: credits arrive there).
   * Rejects `exec_ended` (FAILED_PRECONDITION) once the exec's stream ended with bytes not sent.
   */
  async write(bytes: Uint8Array): Promise<void> {
    for (let at = 0; at < bytes.length;) {
      while (this.#credit === 0 && !this.#ended) await new Promise<void>((r) => this.#creditWaiters.push(r));
      if (this.#ended) throw new RunnerError({ code: grpc.status.FAILED_PRECONDITION, message: `the exec ended with ${bytes.length - at} stdin bytes not sent`, reason: 'exec_ended' });
      const n = Math.min(this.#credit, bytes.length - at, 128 * 1024);
      this.#credit -= n;
      this.call.write({ frame: { $case: 'stdin', value: Buffer.from(bytes.subarray(at, at + n)) } });
      at += n;
    }
  }

  closeStdin(): void {
    this.call.write({ frame: { $case: 'closeStdin', value: true } });
  }

  /** SIGINT now, SIGTERM after the grace, SIGKILL after twice the grace. */
  cancel(graceMs = 0): void {
    this.call.write({ frame: { $case: 'cancel', value: { graceMs } } });
  }

  /** Give up the call (the fleet cancels the process). */
  close(): void {
    this.call.cancel();
  }
}

export type { BeginTurnResponse, CompleteTurnResponse, ContextState, ExecExit, ExecStarted, GetGroupStateResponse, OpenGroupResponse, RunTurnResponse, StopGroupResponse, WireTurnEndEvidence };

/**
 * Default deadline of the calls that change a group (see RunnerClientOptions.deadlineMs): a start
 * or restore, a stop with its grace, a checkpoint. A retry with the same key answers the first
 * result, so a generous deadline costs nothing when the server is quick.
 */
export const WORK_DEADLINE_MS = 120_000;

type Unary<Req, Res> = (request: Req, metadata: grpc.Metadata, options: Partial<grpc.CallOptions>, callback: (error: grpc.ServiceError | null, response: Res) => void) => grpc.ClientUnaryCall;

export class RunnerClient {
  readonly #client: RunnerServiceClient;
  readonly #deadlineMs: number;
  readonly #workDeadlineMs: number;
  readonly #maxRetries: number;
  readonly #backoff: ExponentialBackoff<unknown>;
  /** Attempts made by this client, retries included (observability and tests). */
  attempts = 0;
  retries = 0;

  constructor(options: RunnerClientOptions) {
    if ((options.tls === undefined) === (options.insecureLocalDev !== true)) {
      throw new TypeError('RunnerClient needs exactly one of `tls` (mTLS) or `insecureLocalDev: true`');
    }
    const credentials =
      options.tls !== undefined ? grpc.credentials.createSsl(options.tls.ca, options.tls.key, options.tls.cert) : grpc.credentials.createInsecure();
    const channelOptions: grpc.ChannelOptions = {
      'grpc.keepalive_time_ms': 30_000,
      'grpc.keepalive_timeout_ms': 10_000,
      ...(options.tls?.serverName !== undefined ? { 'grpc.ssl_target_name_override': options.tls.serverName } : {}),
      ...options.channelOptions,
    };
    this.#client = new RunnerServiceClient(options.address, credentials, channelOptions);
    this.#deadlineMs = options.deadlineMs ?? 10_000;
    this.#workDeadlineMs = options.deadlineMs ?? WORK_DEADLINE_MS;
    this.#maxRetries = options.retry?.maxRetries ?? 4;
    this.#backoff = new ExponentialBackoff({ initialDelay: options.retry?.initialDelayMs ?? 50, maxDelay: options.retry?.maxDelayMs ?? 2_000 });
  }

  /** Acquire the conversation's group, creating it on first use. */
  openGroup(args: OpenGroupArgs, options: CallOptions = {}): Promise<OpenGroupResponse> {
    return this.#mutate(this.#client.openGroup.bind(this.#client) as Unary<never, OpenGroupResponse>, options, (idempotencyKey) => ({
      idempotencyKey,
      conversationId: args.conversationId,
      members: args.members.map((m) => ({ memberId: m.memberId, kind: CLI_TO_PROTO[m.cli] ?? ProtoCliKind.UNSPECIFIED })),
      ...(args.startAnew === true ? { startAnew: true } : {}),
    }));
  }

  /** Begin a turn: the answer says NEW / LIVE / RESTORED and which locator to resume (R-S1, R-S3). */
  beginTurn(args: BeginTurnArgs, options: CallOptions = {}): Promise<BeginTurnResponse> {
    return this.#mutate(this.#client.beginTurn.bind(this.#client) as Unary<never, BeginTurnResponse>, options, (idempotencyKey) => ({
      idempotencyKey,
      groupId: args.groupId,
      memberId: args.memberId,
      ...(args.locator !== undefined ? { locator: args.locator } : {}),
    }));
  }

  /** Report how the turn ended (see completeTurnEvidence for the detector → wire mapping). */
  completeTurn(args: CompleteTurnArgs, options: CallOptions = {}): Promise<CompleteTurnResponse> {
    return this.#mutate(this.#client.completeTurn.bind(this.#client) as Unary<never, CompleteTurnResponse>, options, (idempotencyKey) => ({
      idempotencyKey,
      groupId: args.groupId,
      memberId: args.memberId,
      turnId: args.turnId,
      ...(args.observedLocator !== undefined ? { observedLocator: args.observedLocator } : {}),
      evidence: args.evidence,
      protectInBackground: args.protectInBackground === true,
    }));
  }

  stopGroup(args: StopGroupArgs, options: CallOptions = {}): Promise<StopGroupResponse> {
    return this.#mutate(this.#client.stopGroup.bind(this.#client) as Unary<never, StopGroupResponse>, options, (idempotencyKey) => ({
      idempotencyKey,
      groupId: args.groupId,
      graceMs: args.graceMs ?? 0,
    }));
  }

  /** Read-only, so retried like the others but without a key. */
  getGroupState(args: GetGroupStateArgs, options: CallOptions = {}): Promise<GetGroupStateResponse> {
    const request = 'groupId' in args ? { groupId: args.groupId, conversationId: '' } : { groupId: '', conversationId: args.conversationId };
    return this.#call(this.#client.getGroupState.bind(this.#client) as Unary<never, GetGroupStateResponse>, options, request, undefined);
  }

  /**
   * A whole turn through the fleet (R-I9): the fleet begins it, runs the member's CLI with `prompt`,
   * detects its end and completes it. Yields the stream's events as they come — `begun` first, then
   * the CLI's own event lines (`cliEvent`, JSON bytes) and stderr, and `end` last. Not retried: repeat
   * the call with the same `idempotencyKey` (options) to get the end of a turn whose stream broke.
   * The call's deadline is `deadlineMs` if given, else `timeoutMs` (the turn's) plus a minute, else
   * none: the client's default deadline is for short calls, not for a whole turn.
   */
  async *runTurn(args: RunTurnArgs, options: CallOptions & { readonly timeoutMs?: number } = {}): AsyncIterable<RunTurnResponse> {
    const idempotencyKey = options.idempotencyKey ?? randomUUID();
    // The call lasts the whole turn: not the client's per-call default. With timeoutMs, that and a
    // margin for the begin and the completion; without, none (the fleet bounds every turn itself).
    const deadline = options.deadlineMs !== undefined ? Date.now() + options.deadlineMs
      : options.timeoutMs !== undefined && options.timeoutMs > 0 ? Date.now() + options.timeoutMs + RUN_TURN_MARGIN_MS : Infinity;
    const call = this.#client.runTurn({
      idempotencyKey, groupId: args.groupId, memberId: args.memberId, prompt: args.prompt, model: args.model ?? '', timeoutMs: options.timeoutMs ?? 0,
      protectInBackground: args.protectInBackground === true,
      ...(args.locator !== undefined ? { locator: args.locator } : {}),
    }, new grpc.Metadata(), { deadline });
    const onAbort = (): void => call.cancel();
    options.signal?.addEventListener('abort', onAbort, { once: true });
    if (options.signal?.aborted === true) call.cancel();
    try {
      for await (const event of call as AsyncIterable<RunTurnResponse>) yield event;
    } catch (error) {
      throw toRunnerError(error, idempotencyKey);
    } finally {
      options.signal?.removeEventListener('abort', onAbort);
      call.cancel();
    }
  }

  /**
   * A process in a member container on its current placement (R-I9): no Docker access needed.
   * Returns once the fleet started it (`started` says where). Read `output()`: stdout/stderr chunks,
   * then the exit; reading slowly slows the process (flow control end to end). `write` waits for the
   * fleet's stdin credit.
   */
  async exec(args: ExecArgs, options: { readonly deadlineMs?: number; readonly signal?: AbortSignal } = {}): Promise<ExecHandle> {
    const deadline = options.deadlineMs !== undefined ? Date.now() + options.deadlineMs : Infinity;
    const call = this.#client.exec(new grpc.Metadata(), deadline === Infinity ? {} : { deadline });
    const signal = options.signal;
    if (signal !== undefined) {
      const onAbort = (): void => call.cancel();
      signal.addEventListener('abort', onAbort, { once: true });
      // The caller's signal may outlive the call by far: the listener goes with the call.
      const off = (): void => signal.removeEventListener('abort', onAbort);
      call.on('status', off);
      call.on('close', off);
      if (signal.aborted) call.cancel();
    }
    const frames = (call as AsyncIterable<ExecResponse>)[Symbol.asyncIterator]();
    call.write({ frame: { $case: 'start', value: {
      groupId: args.groupId, memberId: args.memberId, argv: [...args.argv], env: Object.entries(args.env ?? {}).map(([name, value]) => ({ name, value })),
      workingDir: args.workingDir ?? '', stdin: args.stdin ?? false, timeoutMs: args.timeoutMs ?? 0, outputLimitBytes: args.outputLimitBytes ?? 0,
      expectedGeneration: args.expectedGeneration ?? 0, cancelGraceMs: args.cancelGraceMs ?? 0, expectedIncarnation: args.expectedIncarnation ?? '',
    } } });
    let first: IteratorResult<ExecResponse>;
    try {
      first = await frames.next();
    } catch (error) {
      throw toRunnerError(error);
    }
    if (first.done === true || first.value.frame?.$case !== 'started') throw new RunnerError({ code: grpc.status.INTERNAL, message: 'Exec answered without ExecStarted', reason: 'malformed' });
    return new ExecHandle(call, frames, first.value.frame.value);
  }

  /** Waits until the channel is connected (or the deadline passes). */
  waitForReady(deadlineMs = this.#deadlineMs): Promise<void> {
    return new Promise((resolve, reject) => this.#client.waitForReady(Date.now() + deadlineMs, (error) => (error ? reject(toRunnerError({ code: grpc.status.UNAVAILABLE, details: error.message })) : resolve())));
  }

  close(): void {
    this.#client.close();
  }

  #mutate<Res>(method: Unary<never, Res>, options: CallOptions, build: (idempotencyKey: string) => object): Promise<Res> {
    // One key per logical call, reused by every retry: the server answers a repeat with the first result.
    const idempotencyKey = options.idempotencyKey ?? randomUUID();
    return this.#call(method, { ...options, deadlineMs: options.deadlineMs ?? this.#workDeadlineMs }, build(idempotencyKey), idempotencyKey);
  }

  async #call<Res>(method: Unary<never, Res>, options: CallOptions, request: object, idempotencyKey: string | undefined): Promise<Res> {
    const deadline = Date.now() + (options.deadlineMs ?? this.#deadlineMs);
    const policy = retry(
      handleWhen((error) => error instanceof RunnerError && error.retryable && Date.now() < deadline),
      { maxAttempts: this.#maxRetries, backoff: this.#backoff },
    );
    const listener = policy.onRetry(() => {
      this.retries += 1;
    });
    try {
      return await policy.execute(
        () =>
          new Promise<Res>((resolve, reject) => {
            this.attempts += 1;
            if (options.signal?.aborted) {
              reject(new RunnerError({ code: grpc.status.CANCELLED, message: 'aborted by caller', reason: 'cancelled', idempotencyKey }));
              return;
            }
            const signal = options.signal;
            const onAbort = (): void => call.cancel();
            const call = method(request as never, new grpc.Metadata(), { deadline }, (error, response) => {
              // The listener lives as long as this attempt: the caller's signal may serve many calls.
              signal?.removeEventListener('abort', onAbort);
              if (error) reject(toRunnerError(error, idempotencyKey));
              else resolve(response);
            });
            signal?.addEventListener('abort', onAbort, { once: true });
          }),
        options.signal,
      );
    } catch (error) {
      throw toRunnerError(error, idempotencyKey);
    } finally {
      listener.dispose();
    }
  }
}
