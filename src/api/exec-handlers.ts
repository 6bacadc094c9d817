// RunnerService.Exec and RunTurn (R-I9): protobuf frames ⇄ the control plane's ExecBackend. Exec
// is bidirectional: the first client frame must be ExecStart; stdin, close_stdin and cancel
// frames are read concurrently with the output written back, and output is acknowledged to the
// backend (which grants the host more output) only once the gRPC stream has taken it — so a slow
// reader slows the process and nothing queues without bound. The caller going away (or its
// deadline passing), or the handler ending before the exit for any other reason, abandons the
// session: the process is cancelled and its remaining output credited back unread (exec-port.ts).
// RunTurn is a server stream of the turn's events.
import { InvalidArgument } from '../core/index.ts';
import type { ExecBackend, ExecEvent, ExecExitView, ExecSession, RunTurnEvent } from '../core/exec-port.ts';
import type { TurnEvidenceInput } from '../core/runner-port.ts';
import { ExecEnd, ExecStream, type ExecExit, type ExecRequest, type ExecResponse } from '../gen/sandboxfleet/v1/exec.ts';
import { TurnEndKind } from '../gen/sandboxfleet/v1/common.ts';
import type { RunTurnRequest, RunTurnResponse, TurnEndEvidence } from '../gen/sandboxfleet/v1/runner.ts';
import { bidiStream, serverStream, type CallContext, type HandlerDeps } from './call-handler.ts';
import { beginTurnToProto, completeTurnToProto, parseIdempotencyKey } from './mapping.ts';
import type { PeerRole } from './peer-identity.ts';

const END: Record<ExecExitView['end'], ExecEnd> = {
  exited: ExecEnd.EXITED,
  cancelled: ExecEnd.CANCELLED,
  deadline: ExecEnd.DEADLINE,
  output_limit: ExecEnd.OUTPUT_LIMIT,
  detached: ExecEnd.DETACHED,
};

const KIND: Record<TurnEvidenceInput['kind'], TurnEndKind> = {
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

function exitToProto(e: ExecExitView): ExecExit {
  return { end: END[e.end], exitCode: e.exitCode, stdoutBytes: e.stdoutBytes, stderrBytes: e.stderrBytes, durationMs: e.durationMs };
}

function frame(e: ExecEvent): ExecResponse {
  switch (e.kind) {
    case 'output':
      return { frame: { $case: 'output', value: { stream: e.stream === 'stderr' ? ExecStream.STDERR : ExecStream.STDOUT, data: Buffer.from(e.data.buffer, e.data.byteOffset, e.data.byteLength) } } };
    case 'stdin_credit':
      return { frame: { $case: 'stdinCredit', value: e.bytes } };
    case 'exit':
      return { frame: { $case: 'exit', value: exitToProto(e.exit) } };
  }
}

function evidenceToProto(e: TurnEvidenceInput): TurnEndEvidence {
  return {
    kind: KIND[e.kind], nativeTurnEnded: e.nativeTurnEnded, succeeded: e.succeeded, cleanupFinished: e.cleanupFinished,
    transportUsable: e.transportUsable, locatorUsable: e.locatorUsable, processExited: e.processExited, exitConfirmed: e.exitConfirmed,
    ...(e.exitCode !== undefined ? { exitCode: e.exitCode } : {}), nativeTurnId: e.nativeTurnId ?? '', errorMessage: e.errorMessage ?? '',
    ...(e.inputBytes !== undefined ? { inputBytes: e.inputBytes } : {}), ...(e.outputBytes !== undefined ? { outputBytes: e.outputBytes } : {}),
  };
}

/** Reads the client's frames after the start: stdin, close_stdin, cancel. A protocol error cancels. */
async function pumpClient(frames: AsyncIterator<ExecRequest>, session: ExecSession): Promise<void> {
  for (let r = await frames.next(); r.done !== true; r = await frames.next()) {
    const f = r.value.frame;
    if (f === undefined) continue;
    switch (f.$case) {
      case 'stdin':
        session.writeStdin(f.value);
        break;
      case 'closeStdin':
        if (f.value) session.closeStdin();
        break;
      case 'cancel':
        session.cancel(f.value.graceMs);
        break;
      case 'start':
        throw new InvalidArgument('malformed', 'ExecStart may only be the first frame', { details: { field: 'start' } });
    }
  }
}

async function* exec(backend: ExecBackend, requests: AsyncIterable<ExecRequest>, ctx: CallContext): AsyncIterable<ExecResponse> {
  const frames = requests[Symbol.asyncIterator]();
  const first = await frames.next();
  const start = first.done === true ? undefined : first.value.frame;
  if (start?.$case !== 'start') throw new InvalidArgument('malformed', 'the first Exec frame must be ExecStart', { details: { field: 'start' } });
  const s = start.value;
  const session = await backend.exec({
    groupId: s.groupId, memberId: s.memberId, argv: s.argv, env: s.env, workingDir: s.workingDir, stdin: s.stdin,
    timeoutMs: s.timeoutMs, outputLimitBytes: s.outputLimitBytes, expectedGeneration: s.expectedGeneration, cancelGraceMs: s.cancelGraceMs,
    expectedIncarnation: s.expectedIncarnation,
  }, ctx.signal);
  let exited = false;
  try {
    const st = session.started;
    yield { frame: { $case: 'started', value: { execId: st.execId, hostId: st.hostId, hostEpoch: st.hostEpoch, placementGeneration: st.generation, containerId: st.containerId, incarnation: st.incarnation } } };
    let clientError: unknown;
    void pumpClient(frames, session).catch((err: unknown) => {
      clientError = err;
      session.cancel();
    });
    for await (const e of session.events()) {
      if (e.kind === 'exit') exited = true;
      yield frame(e);
      // The stream took the frame: the host may send that much more.
      if (e.kind === 'output') session.consumed(e.data.length);
    }
    if (clientError !== undefined) throw clientError;
  } finally {
    // Returned early (the caller went away, a write failed) or failed: nobody reads on, so the
    // process must not go on holding one of the host's exec slots.
    if (!exited) session.abandon();
  }
}

async function* runTurn(backend: ExecBackend, request: RunTurnRequest, ctx: CallContext): AsyncIterable<RunTurnResponse> {
  const events: AsyncIterable<RunTurnEvent> = backend.runTurn({
    idempotencyKey: parseIdempotencyKey(request.idempotencyKey),
    groupId: request.groupId,
    memberId: request.memberId,
    prompt: request.prompt,
    locator: request.locator,
    model: request.model,
    timeoutMs: request.timeoutMs,
    ...(request.protectInBackground ? { protectInBackground: true } : {}),
  }, ctx.signal);
  for await (const e of events) {
    switch (e.kind) {
      case 'begun':
        yield { event: { $case: 'begun', value: beginTurnToProto(e.begun) } };
        break;
      case 'cli_event':
        yield { event: { $case: 'cliEvent', value: Buffer.from(e.line.buffer, e.line.byteOffset, e.line.byteLength) } };
        break;
      case 'stderr':
        yield { event: { $case: 'stderr', value: Buffer.from(e.data.buffer, e.data.byteOffset, e.data.byteLength) } };
        break;
      case 'end':
        yield {
          event: {
            $case: 'end',
            value: {
              completion: completeTurnToProto(e.end.completion),
              evidence: evidenceToProto(e.end.evidence),
              observedLocator: e.end.observedLocator ?? '',
              ...(e.end.exit !== undefined ? { exit: exitToProto(e.end.exit) } : {}),
            },
          },
        };
        break;
    }
  }
}

/** The Exec and RunTurn handlers of the runner service (mutations: runners only). */
export function execHandlers(deps: HandlerDeps, backend: ExecBackend, roles: readonly PeerRole[]) {
  return {
    exec: bidiStream<ExecRequest, ExecResponse>(deps, 'RunnerService/Exec', roles, (requests, ctx) => exec(backend, requests, ctx)),
    runTurn: serverStream<RunTurnRequest, RunTurnResponse>(deps, 'RunnerService/RunTurn', roles, (request, ctx) => runTurn(backend, request, ctx)),
  };
}
