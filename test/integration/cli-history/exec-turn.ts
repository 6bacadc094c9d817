// A runner's turn driven the way the fleet offers it to runners without Docker access (R-I9): the
// CLI (or its bridge client) runs in the member container through the fleet's Exec, its stdout is
// read by the runner SDK's turn-end detector, and the runner completes the turn with that evidence.
// Used by the cli-history tests for the CLIs the fleet does not run itself (Codex `exec --json`,
// OpenCode and Kilo behind the live bridge).
import { Readable } from 'node:stream';
import type { BeginTurnResponse, CompleteTurnResponse } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { completeTurnEvidence, driveDetector, type RunnerClient, type TurnEndDetector, type TurnEndEvidence } from '../../../src/runner-sdk/index.ts';

export interface ExecTurnResult {
  readonly evidence: TurnEndEvidence;
  /** The process's exit code; undefined when the exec was cancelled before it exited. */
  readonly exitCode: number | undefined;
  readonly stdout: string;
  readonly stderr: string;
}

/**
 * Run `argv` in the member through Exec and feed its stdout to `detector` until the native end;
 * the rest of the output and the exit are read too. `cancelAfter`: cancel the exec (SIGINT) once
 * stdout carried this text (a runner whose stream drops mid-turn).
 */
export async function execAndDetect(runner: RunnerClient, args: { groupId: string; memberId: string; argv: string[]; generation?: number; env?: Record<string, string>; timeoutMs?: number }, detector: TurnEndDetector, options: { cancelWhen?: (stdout: string) => boolean } = {}): Promise<ExecTurnResult> {
  const exec = await runner.exec({
    groupId: args.groupId, memberId: args.memberId, argv: args.argv, timeoutMs: args.timeoutMs ?? 120_000,
    ...(args.env !== undefined ? { env: args.env } : {}),
    ...(args.generation !== undefined ? { expectedGeneration: args.generation } : {}),
  });
  let stdout = '';
  let stderr = '';
  let exitCode: number | undefined;
  let cancelled = false;
  const output = exec.output()[Symbol.asyncIterator]();
  // The detector reads stdout as a byte stream; stderr and the exit are collected on the side.
  async function* stdoutChunks(): AsyncIterable<Buffer> {
    for (let r = await output.next(); r.done !== true; r = await output.next()) {
      const e = r.value;
      if (e.kind === 'stdout') {
        stdout += e.data.toString('utf8');
        yield e.data;
        if (!cancelled && options.cancelWhen?.(stdout) === true) {
          cancelled = true;
          exec.cancel(1_000);
        }
      } else if (e.kind === 'stderr') stderr += e.data.toString('utf8');
      else if (e.kind === 'exit') exitCode = e.exit.exitCode;
    }
  }
  const source = Readable.from(stdoutChunks());
  const { evidence } = await driveDetector(source, detector);
  // Drain what is left (the process exits after its end event).
  for await (const chunk of source) void chunk;
  return { evidence, exitCode, stdout, stderr };
}

/** CompleteTurn with the detector's evidence; `processExited`: the CLI process is gone (exec per turn). */
export function completeWith(runner: RunnerClient, groupId: string, memberId: string, begun: BeginTurnResponse, r: ExecTurnResult, processExited: boolean): Promise<CompleteTurnResponse> {
  return runner.completeTurn({
    groupId, memberId, turnId: begun.turnId,
    ...completeTurnEvidence(r.evidence, { cleanupFinished: true, exitConfirmed: processExited && r.exitCode !== undefined, ...(processExited && r.exitCode !== undefined ? { exitCode: r.exitCode } : {}) }),
  });
}

/** Run a command in the member through the fleet's Exec and wait for its exit; its output. */
export async function execCommand(runner: RunnerClient, args: { groupId: string; memberId: string; argv: string[]; env?: Record<string, string>; timeoutMs?: number }): Promise<{ exitCode: number | undefined; stdout: string; stderr: string }> {
  const e = await runner.exec({ groupId: args.groupId, memberId: args.memberId, argv: args.argv, timeoutMs: args.timeoutMs ?? 60_000, ...(args.env !== undefined ? { env: args.env } : {}) });
  let stdout = '';
  let stderr = '';
  let exitCode: number | undefined;
  for await (const o of e.output()) {
    if (o.kind === 'stdout') stdout += o.data.toString('utf8');
    else if (o.kind === 'stderr') stderr += o.data.toString('utf8');
    else if (o.kind === 'exit') exitCode = o.exit.exitCode;
  }
  return { exitCode, stdout, stderr };
}
