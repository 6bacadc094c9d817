// Public surface of the runner SDK's turn-end detectors (R-S4..R-S7): one factory per native CLI,
// the shared detector contract, the evidence types, and the JSON-lines reader that feeds them.

export type {
  CliKind,
  DetectorStats,
  EndKind,
  LocatorConflict,
  NativeEndKind,
  TransportKind,
  TurnEndEvidence,
} from '../evidence.ts';
export { DEFAULT_MAX_TEXT_CHARS, MAX_ERROR_CHARS, NATIVE_END_KINDS, TRANSPORT_KINDS, isNativeEndKind } from '../evidence.ts';
export { DetectorOptionError, type DetectorOptions, type TurnEndDetector } from './detector.ts';
export { createClaudeCodeDetector } from './claude-code.ts';
export { createCodexDetector, type CodexDetectorOptions } from './codex.ts';
export { createCodexExecDetector } from './codex-exec.ts';
export { createPiDetector } from './pi.ts';
export { createKiloDetector, createOpenCodeDetector, type LiveBridgeDetectorOptions } from './live-bridge.ts';
export { createDetector, type AnyDetectorOptions } from './factory.ts';
export {
  DEFAULT_MAX_LINE_CHARS,
  JsonLineDecoder,
  readJsonLines,
  type JsonLineStats,
  type ReadJsonLinesOptions,
  type ReadJsonLinesResult,
  type ReadOutcome,
} from './json-lines.ts';
export { driveDetector, type DriveOptions, type DriveResult } from './drive.ts';
