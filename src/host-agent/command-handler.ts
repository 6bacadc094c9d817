// Executes AgentCommands (R-H6): decode (bounded), check it is for this host and not past its
// deadline, fence it by host epoch and placement generation (a stale command is REFUSED with the
// reason, counted and logged, and changes nothing), run it once per command id (repeats get the
// first result), one command per group at a time, and answer an AgentCommandResult.
import type { NatsConnection } from '@nats-io/transport-node';
import { CommandOutcome, AgentCommand, AgentCommandResult, ProbeEcho, ProbeEchoAck, type ProbeResult } from '../gen/sandboxfleet/v1/agent.ts';
import { API_SHA } from '../gen/api-sha.ts';
import type { Logger } from '../observability/logger.ts';
import { DockerRuntimeError } from '../docker/errors.ts';
import type { CheckpointOps } from './checkpoint-ops.ts';
import { CommandError, refused } from './command-error.ts';
import type { FenceState } from './fencing.ts';
import type { GroupOps } from './group-ops.ts';
import type { HostHealth } from './host-health.ts';
import type { AgentMetrics } from './metrics.ts';
import { CommandResultCache, KeyedLock } from './result-cache.ts';
import { boundMessage } from './wire.ts';
import type { AgentRefusalReason } from '../wire/agent-protocol.ts';
import type { ExecSessions } from './exec-sessions.ts';

/** Commands are small; a restore manifest is the largest (bounded by core at ~960 KiB). */
export const MAX_COMMAND_BYTES = 1024 * 1024;
const PROBE_TIMEOUT_MS = 5000;

type Payload = AgentCommandResult['result'];

export interface CommandHandlerDeps {
  readonly nc: NatsConnection;
  readonly hostId: string;
  readonly agentSha: string;
  readonly fence: FenceState;
  readonly groups: GroupOps;
  /** Processes in member containers for the control plane (R-I9). */
  readonly execs: ExecSessions;
  readonly checkpoints: CheckpointOps;
  readonly health: HostHealth;
  readonly metrics: AgentMetrics;
  readonly logger: Logger;
  readonly nowMs: () => number;
  /** False while attestation refused this host: it may report and clean up, not take work. */
  readonly admitted: () => boolean;
}

/** Group id of a group-scoped command; undefined for host-scoped ones (inventory, probe). */
function groupIdOf(cmd: AgentCommand): string | undefined {
  const c = cmd.command;
  if (c === undefined || c.$case === 'inventory' || c.$case === 'probe' || c.$case === 'fenced') return undefined;
  return c.value.groupId;
}

/**
 * Refusals that speak only of the moment (the host is full now, the command came after its
 * deadline): never cached, so the same command id sent again later is judged again rather than
 * refused until the cache forgets it. A group command refused so did nothing (both are checked
 * before it acts); exec ids are never sent twice.
 */
const MOMENTARY_REFUSALS: ReadonlySet<string> = new Set<AgentRefusalReason>(['no_capacity', 'deadline_exceeded']);

/** Commands whose FAILED result is not kept: safe to run again, and retried with the same id. */
const RERUN_AFTER_FAILURE: ReadonlySet<string> = new Set(['createGroup', 'stopGroup', 'startGroup', 'checkpoint']);
/** FAILED reasons that running again cannot change (the frozen layer breaks a rule): kept, not recaptured. */
const PERMANENT_FAILURES: ReadonlySet<string> = new Set<AgentRefusalReason>(['layer_refused']);

/**
 * Whether a repeat of `cmd` gets `result` back instead of running again. Not kept: a momentary
 * refusal, and a FAILED create, stop, start or checkpoint (unless it failed for good). Each is safe
 * to run again: a create adopts a container of the same name and identity; a container the failed
 * stop stopped is found stopped, reported so and never claimed clean (R-G2); a start starts what
 * does not run and leaves what runs; a checkpoint whose manifest (written last) exists answers it,
 * and chunks are write-once. Each is retried with the same command id: the control plane
 * finishes a stop left STOPPING with it, a start's id moves only when a start succeeds, and a
 * checkpoint's id names the state it captures. A cached failure would keep the group STOPPING (chaos
 * seed 4108), never let it start on this host again after an engine that failed the start came
 * back, or fail every retry of a checkpoint that a NATS blip failed until the group is LOST
 * no_checkpoint (the chaos workload over gRPC), for as long as the cache remembers it.
 */
export function keepResult(cmd: AgentCommand, result: AgentCommandResult): boolean {
  if (result.outcome === CommandOutcome.REFUSED) return !MOMENTARY_REFUSALS.has(result.reason);
  if (result.outcome === CommandOutcome.FAILED) return !RERUN_AFTER_FAILURE.has(cmd.command?.$case ?? '') || PERMANENT_FAILURES.has(result.reason);
  return true;
}

export class CommandHandler {
  private readonly cache = new CommandResultCache<AgentCommandResult>();
  private readonly locks = new KeyedLock();

  constructor(private readonly deps: CommandHandlerDeps) {}

  /** Handle one encoded command; always returns an encoded result (never throws). */
  async handleBytes(data: Uint8Array): Promise<Uint8Array> {
    if (data.length > MAX_COMMAND_BYTES) return this.encode(this.reply(undefined, CommandOutcome.REFUSED, 'too_large', `command of ${data.length} bytes`));
    let cmd: AgentCommand;
    try {
      cmd = AgentCommand.decode(data);
    } catch (err) {
      return this.encode(this.reply(undefined, CommandOutcome.REFUSED, 'malformed', `undecodable command: ${(err as Error).message}`));
    }
    return this.encode(await this.handle(cmd));
  }

  async handle(cmd: AgentCommand): Promise<AgentCommandResult> {
    const kind = cmd.command?.$case ?? 'none';
    if (cmd.commandId === '' || cmd.commandId.length > 128) return this.reply(cmd, CommandOutcome.REFUSED, 'invalid_argument', 'command_id must be 1..128 chars');
    const { result, repeat } = await this.cache.run(cmd.commandId, () => this.execute(cmd), (r) => keepResult(cmd, r));
    if (repeat) this.deps.logger.info({ commandId: cmd.commandId, kind }, 'repeated command answered from the first result');
    return result;
  }

  private async execute(cmd: AgentCommand): Promise<AgentCommandResult> {
    const { deps } = this;
    const kind = cmd.command?.$case ?? 'none';
    const started = deps.nowMs();
    const log = deps.logger.child({ commandId: cmd.commandId, kind, epoch: cmd.hostEpoch, generation: cmd.placementGeneration });
    let result: AgentCommandResult;
    try {
      result = await this.run(cmd);
    } catch (err) {
      if (err instanceof CommandError) result = this.reply(cmd, err.outcome, err.reason, err.message);
      else if (err instanceof DockerRuntimeError) result = this.reply(cmd, CommandOutcome.FAILED, `docker_${err.reason}`, err.message);
      else result = this.reply(cmd, CommandOutcome.FAILED, 'internal', (err as Error).message ?? String(err));
    }
    const outcome = result.outcome === CommandOutcome.OK ? 'ok' : result.outcome === CommandOutcome.REFUSED ? 'refused' : 'failed';
    deps.metrics.commands.inc({ command: kind, outcome, reason: result.reason });
    deps.metrics.commandDuration.observe({ command: kind }, (deps.nowMs() - started) / 1000);
    if (result.outcome === CommandOutcome.OK) log.info('command done');
    else log.warn({ outcome, reason: result.reason, detail: result.message }, 'command not done');
    return result;
  }

  private async run(cmd: AgentCommand): Promise<AgentCommandResult> {
    const { deps } = this;
    const c = cmd.command;
    if (c === undefined) throw refused('malformed', 'command has no body');
    if (cmd.hostId !== deps.hostId) throw refused('wrong_host', `command is for host ${cmd.hostId}`);
    if (cmd.deadlineUnixMs > 0 && deps.nowMs() > cmd.deadlineUnixMs) throw refused('deadline_exceeded', 'command arrived after its deadline');
    const groupId = groupIdOf(cmd);
    if (groupId !== undefined && (groupId === '' || groupId.length > 128)) throw refused('invalid_argument', 'group_id must be 1..128 chars');
    const fenced = (): void => {
      const verdict = deps.fence.check(cmd.hostEpoch, groupId, cmd.placementGeneration);
      if (!verdict.ok) {
        deps.metrics.fenced(verdict.reason);
        throw refused(verdict.reason, verdict.detail);
      }
    };
    fenced();
    if (groupId === undefined) return this.runHostScoped(cmd);
    return this.locks.with(groupId, async () => {
      fenced(); // again: an earlier command of the group may have moved the generation while we waited
      if ((c.$case === 'createGroup' || c.$case === 'restore') && !deps.admitted()) throw refused('host_not_admitted', 'attestation refused this host');
      const payload = await this.runGroup(cmd, groupId);
      return this.reply(cmd, CommandOutcome.OK, '', '', payload);
    });
  }

  private async runGroup(cmd: AgentCommand, groupId: string): Promise<{ payload: Payload; outcome?: CommandOutcome; reason?: string; message?: string }> {
    const { deps } = this;
    const gen = cmd.placementGeneration;
    const c = cmd.command!;
    switch (c.$case) {
      case 'createGroup': {
        const ids = await deps.groups.create(c.value, gen);
        deps.fence.observe(groupId, gen);
        return { payload: { $case: 'createGroup', value: { containerIds: ids } } };
      }
      case 'startGroup':
        return { payload: { $case: 'startGroup', value: { containerIds: await deps.groups.start(groupId, gen, c.value.memberIds) } } };
      case 'restartMember':
        return { payload: { $case: 'restartMember', value: await deps.groups.restartMember(groupId, gen, c.value) } };
      case 'stopGroup': {
        const { evidence, verdict } = await deps.groups.stop(groupId, gen, c.value.graceMs);
        const message = verdict.clean ? 'clean' : `unclean: ${verdict.findings.map((f) => `${f.memberId}:${f.reason}`).join(', ')}`;
        return { payload: { $case: 'stopGroup', value: { evidence } }, message };
      }
      case 'checkpoint': {
        const t0 = deps.nowMs();
        const manifest = await deps.checkpoints.checkpoint(c.value, gen, cmd.deadlineUnixMs);
        return { payload: { $case: 'checkpoint', value: { manifest, durationMs: deps.nowMs() - t0 } } };
      }
      case 'restore': {
        const t0 = deps.nowMs();
        const out = await deps.checkpoints.restore(c.value, gen);
        const value = { members: out.members, verified: out.verified, durationMs: deps.nowMs() - t0 };
        if (!out.verified) {
          const detail = out.problems.map((p) => `${p.memberId}:${p.path}:${p.problem}`).join(', ');
          return { payload: { $case: 'restore', value }, outcome: CommandOutcome.FAILED, reason: 'session_files_missing', message: `cold-start check failed: ${detail}` };
        }
        deps.fence.observe(groupId, gen);
        return { payload: { $case: 'restore', value } };
      }
      case 'execStart':
        // Returns once the process runs; its bytes flow on the exec's own subjects (exec-sessions.ts).
        return { payload: { $case: 'execStart', value: await deps.execs.start(c.value, gen) } };
      case 'deleteGroup':
        // Only this placement and older ones: a delete decided about a placement never reaches a newer one (R-R6).
        return { payload: { $case: 'deleteGroup', value: { removedContainerIds: await deps.groups.delete(groupId, gen) } } };
      default:
        throw refused('malformed', `not a group command: ${c.$case}`);
    }
  }

  private async runHostScoped(cmd: AgentCommand): Promise<AgentCommandResult> {
    const c = cmd.command!;
    if (c.$case === 'inventory') {
      const groupId = c.value.groupId;
      if (groupId.length > 128) throw refused('invalid_argument', 'group_id must be at most 128 chars');
      const take = () => this.deps.health.inventory();
      const value = groupId === '' ? await take() : await this.locks.with(groupId, take);
      return this.reply(cmd, CommandOutcome.OK, '', '', { payload: { $case: 'inventory', value } });
    }
    if (c.$case === 'probe') {
      const probe = await this.probe(cmd.hostEpoch, c.value.nonce, c.value.callbackSubject);
      return this.reply(cmd, probe.callbackOk ? CommandOutcome.OK : CommandOutcome.FAILED, probe.callbackOk ? '' : 'probe_failed', probe.error, { payload: { $case: 'probe', value: probe } });
    }
    throw refused('malformed', `not a host command: ${c.$case}`);
  }

  /** Reverse probe (R-H7): call the control plane back on the host's own probe subject and time it. */
  private async probe(epoch: number, nonce: string, callbackSubject: string): Promise<ProbeResult> {
    const { deps } = this;
    const result: ProbeResult = { nonce, callbackOk: false, callbackRoundTripMs: 0, answeredBy: '', error: '' };
    if (nonce === '' || nonce.length > 128) return { ...result, error: 'nonce must be 1..128 chars' };
    // Per-host credentials allow publishing only sf.probe.<host> (R-R5): refuse anything else up front.
    if (!/^[A-Za-z0-9._~-]{1,256}$/.test(callbackSubject) || !callbackSubject.startsWith('sf.probe.')) {
      return { ...result, error: `callback subject ${JSON.stringify(callbackSubject.slice(0, 64))} is not a probe subject` };
    }
    const echo: ProbeEcho = { hostId: deps.hostId, hostEpoch: epoch, nonce, agentBuildSha: deps.agentSha, apiSha: API_SHA, sentAtUnixMs: deps.nowMs() };
    const t0 = performance.now();
    try {
      const reply = await deps.nc.request(callbackSubject, ProbeEcho.encode(echo).finish(), { timeout: PROBE_TIMEOUT_MS });
      const rtt = Math.max(0, Math.round(performance.now() - t0));
      const ack = ProbeEchoAck.decode(reply.data);
      if (ack.nonce !== nonce) return { ...result, callbackRoundTripMs: rtt, error: 'probe ack carries another nonce' };
      return { ...result, callbackOk: true, callbackRoundTripMs: rtt, answeredBy: ack.replica };
    } catch (err) {
      return { ...result, error: `probe callback failed: ${(err as Error).message}` };
    }
  }

  private reply(
    cmd: AgentCommand | undefined,
    outcome: CommandOutcome,
    reason: string,
    message: string,
    group?: { payload: Payload; outcome?: CommandOutcome; reason?: string; message?: string },
  ): AgentCommandResult {
    return {
      commandId: cmd?.commandId ?? '',
      hostId: this.deps.hostId,
      hostEpoch: this.deps.fence.epoch ?? 0,
      placementGeneration: cmd?.placementGeneration ?? 0,
      outcome: group?.outcome ?? outcome,
      reason: group?.reason ?? reason,
      message: boundMessage(group?.message ?? message),
      completedAtUnixMs: this.deps.nowMs(),
      result: group?.payload,
    };
  }

  private encode(result: AgentCommandResult): Uint8Array {
    return AgentCommandResult.encode(result).finish();
  }
}
