// The runner SDK's own turn-end evidence (R-S5, R-S6): what a driver observed about how one native
// CLI turn ended. Plain TypeScript so detectors stay free of generated code; it maps field by field
// onto the proto `TurnEndEvidence` (runner.proto) when the runner calls CompleteTurn.

/** The native agent CLIs a member can run (section 1; proto `CliKind`). */
export type CliKind = 'claude-code' | 'codex' | 'pi' | 'opencode' | 'kilo';

/**
 * Native turn ends: the CLI itself reported that this turn is over (R-S5 table). `api_retry` is
 * Claude Code's retry defect (R-S6): the driver ends the turn there and lets the process exit.
 */
export type NativeEndKind = 'result' | 'turn_completed' | 'agent_end' | 'settled' | 'api_retry';

/** Things that happen to the transport; NEVER a native turn end (R-S5). */
export type TransportKind = 'disconnect' | 'timeout' | 'cancelled' | 'rejected';

/**
 * How the turn ended as far as the driver knows. `process_exited`: the CLI's stream ended with no
 * native end (the process went away); `none`: nothing decisive was seen yet.
 */
export type EndKind = NativeEndKind | TransportKind | 'process_exited' | 'none';

export const NATIVE_END_KINDS: readonly NativeEndKind[] = ['result', 'turn_completed', 'agent_end', 'settled', 'api_retry'];
export const TRANSPORT_KINDS: readonly TransportKind[] = ['disconnect', 'timeout', 'cancelled', 'rejected'];

/** Two different root session ids were reported within one turn (R-S2, R-S4). */
export interface LocatorConflict {
  /** The locator kept: the first root id observed, or the expected one. */
  readonly kept: string;
  /** The different id that was reported and NOT taken. */
  readonly other: string;
  /** `observed`: two ids seen in this turn; `expected`: the CLI reported an id other than the one resumed. */
  readonly source: 'observed' | 'expected';
}

/** Counters that explain what the detector did with its input (audit and tests). */
export interface DetectorStats {
  /** Events passed to observe(). */
  readonly events: number;
  /** Well-formed events that did not concern this turn (other turn ids, sub-agents, after the end). */
  readonly ignored: number;
  /** Inputs that did not have the documented shape. */
  readonly invalid: number;
}

/** The evidence for one turn of one member (R-S5). Immutable snapshot returned by `result()`. */
export interface TurnEndEvidence {
  readonly cli: CliKind;
  /** (a) of R-S5: the CLI reported the end of THIS turn. Only a native event can set it. */
  readonly nativeTurnEnded: boolean;
  /** The native turn ended without error. Always false when the turn did not natively end. */
  readonly succeeded: boolean;
  readonly endKind: EndKind;
  /** Root native session locator (Claude session id, Codex thread id, Pi session id, OpenCode/Kilo session id). */
  readonly observedLocator?: string;
  /** Set when a second, different root id showed up; `observedLocator` keeps the first (R-S2). */
  readonly locatorConflict?: LocatorConflict;
  /** Native turn id the end event named (Codex turn id, bridge turn id) for the audit trail. */
  readonly nativeTurnId?: string;
  /** Error text when !succeeded, at most MAX_ERROR_CHARS. */
  readonly error?: string;
  /** R-S6: the driver lets the CLI process exit after this turn, so the next turn is RESTORED. */
  readonly processWillExit: boolean;
  /** The first transport event reported, even if a native end came before or after it. */
  readonly transport?: { readonly kind: TransportKind; readonly detail?: string };
  /** False once a disconnect was reported: the stream is gone (R-S7: not replayable). */
  readonly transportUsable: boolean;
  /** The assistant's own final text for this turn, at most the detector's text bound. */
  readonly assistantText?: string;
  readonly stats: DetectorStats;
}

/** Bound of `error` (proto `error_message` is bounded to 4 KiB). */
export const MAX_ERROR_CHARS = 4096;
/** Default bound of `assistantText`. */
export const DEFAULT_MAX_TEXT_CHARS = 256 * 1024;

/** True for kinds that are a native turn end (R-S5); the proto enum's first five values. */
export function isNativeEndKind(kind: EndKind): kind is NativeEndKind {
  return (NATIVE_END_KINDS as readonly string[]).includes(kind);
}
