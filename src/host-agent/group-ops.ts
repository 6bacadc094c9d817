// Group lifecycle on the local engine (R-G1, R-G2): create member containers from the pinned image
// id, start them, stop them with a bounded SIGTERM grace collecting per-member exit evidence, and
// delete them. Every operation is idempotent through DockerRuntime's deterministic names and
// "already done counts as done" semantics, so a retried command converges.
import { existsSync } from 'node:fs';
import { decideStopCleanliness, type MemberStopEvidence as CoreMemberEvidence, type StopVerdict } from '../core/clean-stop.ts';
import type { ContainerInfo, DockerRuntime } from '../docker/runtime.ts';
import type { CleanStopEvidence, CreateGroupCommand, MemberStopEvidence, RestartMemberCommand, RestartMemberResult } from '../gen/sandboxfleet/v1/agent.ts';
import { failed, refused } from './command-error.ts';
import type { HostAgentConfig } from './config.ts';
import { isoToMs } from './wire.ts';
import { cliKindName } from '../wire/cli-kind.ts';

export interface GroupOpsDeps {
  readonly runtime: DockerRuntime;
  readonly config: HostAgentConfig;
  /** The pinned image id members are created from (resolved at start). */
  readonly imageId: () => string;
  readonly nowMs: () => number;
}

export interface StopOutcome {
  readonly evidence: CleanStopEvidence;
  readonly verdict: StopVerdict;
}

/** The writable layer exists on disk (the agent sees the Docker data root, R-G2). */
export function layerPresent(c: ContainerInfo | undefined): boolean {
  return c?.upperDir !== undefined && existsSync(c.upperDir);
}

export class GroupOps {
  constructor(private readonly deps: GroupOpsDeps) {}

  /** The group's containers of one placement generation, keyed by member id. */
  async membersAt(groupId: string, generation: number): Promise<Map<string, ContainerInfo>> {
    const all = await this.deps.runtime.listMembers(groupId);
    return new Map(all.filter((c) => c.member?.placementGeneration === generation).map((c) => [c.member!.memberId, c]));
  }

  /** The network member containers are created with (config `memberNetworkMode`). */
  get memberNetworkMode(): 'none' | 'host' {
    return this.deps.config.memberNetworkMode;
  }

  memberCommand(cliKind: string): string[] {
    return this.deps.config.memberCommands[cliKind] ?? this.deps.config.memberCommand;
  }

  async create(cmd: CreateGroupCommand, generation: number): Promise<Record<string, string>> {
    const imageId = this.deps.imageId();
    if (cmd.imageDigest !== imageId) throw refused('image_mismatch', `command wants image ${cmd.imageDigest || '(none)'}, this host runs ${imageId}`);
    if (cmd.members.length === 0 || cmd.members.length > 16) throw refused('invalid_argument', 'a group has 1..16 members');
    const kinds = cmd.members.map((m) => {
      const kind = cliKindName(m.kind);
      if (kind === undefined) throw refused('invalid_argument', `member ${m.memberId}: unknown CLI kind ${m.kind}`);
      return kind;
    });
    const existing = await this.membersAt(cmd.groupId, generation);
    const fresh = cmd.members.filter((m) => !existing.has(m.memberId)).length;
    await this.assertCapacity(fresh);
    const ids: Record<string, string> = {};
    for (const [i, m] of cmd.members.entries()) {
      const kind = kinds[i]!;
      const created = await this.deps.runtime.createMember({
        groupId: cmd.groupId,
        memberId: m.memberId,
        cliKind: kind,
        placementGeneration: generation,
        imageId,
        cmd: this.memberCommand(kind),
        env: { SANDBOXFLEET_GROUP_ID: cmd.groupId, SANDBOXFLEET_MEMBER_ID: m.memberId, SANDBOXFLEET_CLI: kind },
        networkMode: this.deps.config.memberNetworkMode,
      });
      ids[m.memberId] = created.id;
    }
    return ids;
  }

  /** Refuse (before touching anything) when `additional` members would exceed the host's capacity. */
  async assertCapacity(additional: number): Promise<void> {
    if (additional === 0) return;
    const used = (await this.deps.runtime.listMembers()).length;
    if (used + additional > this.deps.config.maxMembers) {
      throw refused('no_capacity', `host has ${used}/${this.deps.config.maxMembers} members, needs ${additional} more`);
    }
  }

  async start(groupId: string, generation: number, memberIds: readonly string[]): Promise<Record<string, string>> {
    const members = await this.membersAt(groupId, generation);
    if (members.size === 0) throw refused('group_not_found', `no containers of group ${groupId} at generation ${generation}`);
    const wanted = memberIds.length === 0 ? [...members.keys()] : [...memberIds];
    const missing = wanted.filter((id) => !members.has(id));
    if (missing.length > 0) throw refused('member_not_found', `no container for members ${missing.join(', ')}`);
    const ids: Record<string, string> = {};
    for (const id of wanted) {
      const c = members.get(id)!;
      await this.deps.runtime.start(c.id);
      ids[id] = c.id;
    }
    return ids;
  }

  /**
   * R-S6 slot reclaim: end every process of the named incarnation of one member's container by
   * stopping it (SIGTERM, grace, SIGKILL: the engine's escalation) and starting it again; the
   * writable layer stays. When the container no longer runs that incarnation, whatever ran in it is
   * already gone and nothing is touched: a stopped container is NOT started (a group stop that got
   * in first must stay a stop; the control plane starts groups, this command only reclaims), so the
   * answer then names no running incarnation (started_at 0). A repeated command converges.
   */
  async restartMember(groupId: string, generation: number, cmd: RestartMemberCommand): Promise<RestartMemberResult> {
    const c = (await this.membersAt(groupId, generation)).get(cmd.memberId);
    if (c === undefined) throw refused('member_not_found', `no container for member ${cmd.memberId} of group ${groupId} at generation ${generation}`);
    const lingering = c.id === cmd.containerId && c.running && isoToMs(c.startedAt) === cmd.startedAtUnixMs;
    if (lingering) {
      const graceSeconds = Math.ceil(Math.min(cmd.graceMs > 0 ? cmd.graceMs : this.deps.config.defaultStopGraceMs, this.deps.config.maxStopGraceMs) / 1000);
      await this.deps.runtime.stop(c.id, graceSeconds).catch((err: unknown) => {
        throw failed('stop_failed', `reclaim of member ${cmd.memberId}: ${(err as Error).message}`, err);
      });
      await this.deps.runtime.start(c.id);
    }
    const after = await this.deps.runtime.find(c.id);
    const startedAt = after?.running === true ? isoToMs(after.startedAt) : undefined;
    if (lingering && startedAt === undefined) throw failed('start_failed', `member ${cmd.memberId} did not run again after the reclaim`);
    return { containerId: c.id, startedAtUnixMs: startedAt ?? 0, restarted: lingering };
  }

  /**
   * Stop every member in parallel: SIGTERM, wait up to the grace, SIGKILL (the engine's escalation).
   * The writable layers stay. The verdict is core's decideStopCleanliness over the evidence (R-G2);
   * "turn in flight" is control-plane knowledge, so the agent judges the process facts only.
   */
  async stop(groupId: string, generation: number, requestedGraceMs: number): Promise<StopOutcome> {
    const { config } = this.deps;
    const members = await this.membersAt(groupId, generation);
    if (members.size === 0) throw refused('group_not_found', `no containers of group ${groupId} at generation ${generation}`);
    const asked = requestedGraceMs > 0 ? requestedGraceMs : config.defaultStopGraceMs;
    // The engine counts the grace in whole seconds; the evidence is judged against what it applied.
    const graceSeconds = Math.ceil(Math.min(asked, config.maxStopGraceMs) / 1000);
    const graceMs = graceSeconds * 1000;
    const stoppedAt = { ms: 0 };
    const evidence = await Promise.all(
      [...members.entries()].map(async ([memberId, c]): Promise<[MemberStopEvidence, CoreMemberEvidence]> => {
        const sigtermAt = this.deps.nowMs();
        const ev = await this.deps.runtime.stop(c.id, graceSeconds).catch((err: unknown) => {
          throw failed('stop_failed', `stop of member ${memberId}: ${(err as Error).message}`, err);
        });
        const after = await this.deps.runtime.find(c.id);
        const exitedAt = after !== undefined && !after.running ? isoToMs(after.finishedAt) : undefined;
        const exitCode = after !== undefined && !after.running ? after.exitCode : undefined;
        const killed = ev.engineKilled || ev.oomKilled;
        const sent = ev.alreadyStopped ? undefined : sigtermAt;
        stoppedAt.ms = Math.max(stoppedAt.ms, exitedAt ?? this.deps.nowMs());
        const present = layerPresent(after);
        const wire: MemberStopEvidence = {
          memberId,
          exitCode,
          exitedByItself: ev.exitedByItself,
          signal: ev.alreadyStopped ? '' : killed ? 'SIGKILL' : 'SIGTERM',
          withinGrace: ev.exitedByItself && sent !== undefined && exitedAt !== undefined && exitedAt - sent <= graceMs,
          containerPresent: after !== undefined,
          writableLayerPresent: present,
          stopDurationMs: ev.stopMillis,
          sigtermAtUnixMs: sent ?? 0,
          exitedAtUnixMs: exitedAt ?? 0,
          killed,
          turnInFlight: false,
        };
        const core: CoreMemberEvidence = {
          memberId,
          turnInFlight: false,
          sigtermAtMs: sent,
          exitedAtMs: exitedAt,
          exitCode,
          // An exit the engine did not see as "by itself" (exit 137, OOM) is not a clean exit either.
          killed: killed || (!ev.alreadyStopped && !ev.exitedByItself),
          containerExists: after !== undefined,
          writableLayerExists: present,
        };
        return [wire, core];
      }),
    );
    const verdict = decideStopCleanliness({ graceMs, memberIds: [...members.keys()], members: evidence.map(([, core]) => core) });
    return {
      verdict,
      evidence: { clean: verdict.clean, noTurnInFlight: false, graceMs, stoppedAtUnixMs: stoppedAt.ms, members: evidence.map(([wire]) => wire) },
    };
  }

  /**
   * Remove the group's containers of placement generation ≤ `upToGeneration`, with their writable
   * layers; a newer placement's containers stay (the decision to delete was about an older one).
   */
  async delete(groupId: string, upToGeneration: number): Promise<string[]> {
    const all = await this.deps.runtime.listMembers(groupId);
    const removed: string[] = [];
    for (const c of all) {
      if (c.member === undefined || c.member.placementGeneration > upToGeneration) continue;
      if ((await this.deps.runtime.remove(c.id, { force: true })).removed) removed.push(c.id);
    }
    return removed;
  }

  /** Stop the group's running containers (SIGTERM, then SIGKILL after `graceMs`); layers stay. */
  async stopAll(groupId: string, graceMs: number): Promise<string[]> {
    const stopped: string[] = [];
    for (const c of await this.deps.runtime.listMembers(groupId)) {
      if (!c.running) continue;
      await this.deps.runtime.stop(c.id, Math.ceil(graceMs / 1000));
      stopped.push(c.id);
    }
    return stopped;
  }
}
