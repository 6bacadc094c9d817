// What the gRPC layer needs from the control plane to run processes and whole turns in member
// containers (R-I9), as plain domain types: the api layer maps protobuf frames to these, the
// control plane implements them (exec-relay.ts, turn-runner.ts). Pure types, no I/O.
import type { BeginTurnView, CompleteTurnView, TurnEvidenceInput } from './runner-port.ts';

export interface ExecStartInput {
  readonly groupId: string;
  readonly memberId: string;
  readonly argv: readonly string[];
  readonly env: readonly { readonly name: string; readonly value: string }[];
  readonly workingDir: string;
  readonly stdin: boolean;
  /** 0 = none (the call's own deadline still applies). */
  readonly timeoutMs: number;
  /** 0 = the default. */
  readonly outputLimitBytes: number;
  /** 0 = the current placement. */
  readonly expectedGeneration: number;
  /** 0 = the default. */
  readonly cancelGraceMs: number;
  /**
   * The container incarnation (ExecStartedView.incarnation) the caller believes in; absent or empty
   * = any. Another one (the container restarted since) is refused.
   */
  readonly expectedIncarnation?: string | undefined;
  /**
   * A plain Exec counts as activity on the group (it may change native state, and a group running
   * one is not idle: no idle stop under it). RunTurn's own execs say false: the turn is the activity.
   */
  readonly recordsActivity?: boolean | undefined;
  /**
   * RunTurn only: the output credit window (bytes in flight between the agent and the consumer);
   * absent = the relay's default. RunTurn needs room for one whole CLI event line (turn-runner.ts).
   */
  readonly outputWindowBytes?: number | undefined;
  /**
   * RunTurn only (never from the public Exec): run on the member's CLI process kept between turns —
   * start it (`argv`; the member's older idle one is ended first) or attach to the one named.
   */
  readonly turnProcess?: { readonly mode: 'start'; readonly commandDigest: string } | { readonly mode: 'attach'; readonly processId: string } | undefined;
}

export interface ExecStartedView {
  readonly execId: string;
  readonly hostId: string;
  readonly hostEpoch: number;
  readonly generation: number;
  readonly containerId: string;
  /** The container's start time (unix ms) as a string. */
  readonly incarnation: string;
  /** With `turnProcess`: the turn process's id (its identity is `<incarnation>/<processId>`). */
  readonly processId?: string | undefined;
}

/** `detached`: a turn process's turn ended and the process was kept (it did not exit). */
export type ExecEndKind = 'exited' | 'cancelled' | 'deadline' | 'output_limit' | 'detached';

export interface ExecExitView {
  readonly end: ExecEndKind;
  readonly exitCode: number;
  readonly stdoutBytes: number;
  readonly stderrBytes: number;
  readonly durationMs: number;
}

export type ExecEvent =
  | { readonly kind: 'output'; readonly stream: 'stdout' | 'stderr'; readonly data: Uint8Array }
  | { readonly kind: 'stdin_credit'; readonly bytes: number }
  | { readonly kind: 'exit'; readonly exit: ExecExitView };

/**
 * A running exec. `events()` yields output, stdin credits and finally one exit; the consumer calls
 * `consumed(bytes)` once it has passed output on (that is what grants the host more output credit:
 * a slow consumer slows the process, nothing queues without bound). A transport or fencing failure
 * ends `events()` with a typed error (UNAVAILABLE). A consumer that stops reading before the exit
 * must call `abandon()`: the process is cancelled and its remaining output credited back unread,
 * so it can flush and exit instead of blocking on a full pipe.
 */
export interface ExecSession {
  readonly started: ExecStartedView;
  events(): AsyncIterable<ExecEvent>;
  consumed(bytes: number): void;
  writeStdin(bytes: Uint8Array): void;
  closeStdin(): void;
  cancel(graceMs?: number): void;
  /** Nobody reads any more: cancel the process; queued and later output is dropped and credited back. */
  abandon(): void;
  /** Turn processes only: the turn is over; the exec ends `detached` and the process is kept. */
  detach(): void;
}

export interface RunTurnInput {
  readonly idempotencyKey: string;
  readonly groupId: string;
  readonly memberId: string;
  readonly prompt: string;
  readonly locator?: string | undefined;
  readonly model: string;
  readonly timeoutMs: number;
  /** As CompleteTurnInput.protectInBackground, for the completion the turn ends with. */
  readonly protectInBackground?: boolean | undefined;
}

export interface RunTurnEndView {
  readonly completion: CompleteTurnView;
  readonly evidence: TurnEvidenceInput;
  readonly observedLocator: string | undefined;
  readonly exit: ExecExitView | undefined;
}

export type RunTurnEvent =
  | { readonly kind: 'begun'; readonly begun: BeginTurnView }
  | { readonly kind: 'cli_event'; readonly line: Uint8Array }
  | { readonly kind: 'stderr'; readonly data: Uint8Array }
  | { readonly kind: 'end'; readonly end: RunTurnEndView };

export interface ExecBackend {
  /** Start a process; refusals throw typed FleetErrors. `signal` aborts it (the caller went away). */
  exec(input: ExecStartInput, signal: AbortSignal): Promise<ExecSession>;
  /** A whole turn; the iterable ends after `end` (or throws). `signal`: the caller went away. */
  runTurn(input: RunTurnInput, signal: AbortSignal): AsyncIterable<RunTurnEvent>;
}
