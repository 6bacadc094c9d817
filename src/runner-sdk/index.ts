// Public surface of the runner SDK (package export `./runner-sdk`): the typed gRPC client for the
// runner API (R-I1), the turn-end detectors for the five native CLIs (R-S4..R-S7) with their
// evidence types, and the mapping from a detector's evidence to the CompleteTurn wire message.
export * from './detectors/index.ts';
export * from './evidence.ts';
export {
  ExecHandle,
  RunnerClient,
  RunnerError,
  completeTurnEvidence,
  cliKindFromProto,
  cliKindToProto,
  errorDetailOf,
  toRunnerError,
  type BeginTurnArgs,
  type BeginTurnResponse,
  type CallOptions,
  type CompleteTurnArgs,
  type CompleteTurnResponse,
  type ContextState,
  type DriverFacts,
  type ExecArgs,
  type ExecExit,
  type ExecOutputEvent,
  type ExecStarted,
  type RunTurnArgs,
  type RunTurnResponse,
  type GetGroupStateArgs,
  type GetGroupStateResponse,
  type OpenGroupArgs,
  type OpenGroupResponse,
  type RunnerClientOptions,
  type RunnerClientTls,
  type StopGroupArgs,
  type StopGroupResponse,
  type WireTurnEndEvidence,
  WORK_DEADLINE_MS,
} from './client.ts';
export { ContextState as WireContextState, TurnEndKind as WireTurnEndKind, CliKind as WireCliKind } from '../gen/sandboxfleet/v1/common.ts';
