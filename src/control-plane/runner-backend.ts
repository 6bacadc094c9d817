// The runner backend (R-I1, R-S1..R-S8): implements core's RunnerBackend over the group records.
// Every member change goes through core member-session (beginTurn/completeTurn), every group change
// through transitionGroup (via GroupOps), each written with compare-and-set; mutating calls are
// idempotent by key (idempotency.ts) and turn ids are derived from the key, so a retried BeginTurn
// replays the turn in flight instead of colliding with it (R-S8).
import { createHash } from 'node:crypto';
import {
  CLI_KINDS,
  IdentityRefused,
  InvalidArgument,
  NoCapacity,
  NotFound,
  Unavailable,
  beginTurn,
  completeTurn,
  parseConversationId,
  parseGroupId,
  parseMemberId,
  parseOptionalLocator,
  parseTurnId,
  transitionGroup,
  newMemberSession,
  createGroup,
  type CliKind,
  type Locator,
  type ContextState,
  type MemberObservation,
  type MemberSession,
  type ProcessIdentity,
  type TurnEnd,
} from '../core/index.ts';
import { isSafeId } from '../core/checkpoint-manifest.ts';
import type { BeginTurnInput, BeginTurnView, CompleteTurnInput, CompleteTurnView, GroupView, OpenGroupInput, RunnerBackend, StopGroupInput, StopGroupView, TurnEvidenceInput } from '../core/runner-port.ts';
import { ContainerState } from '../gen/sandboxfleet/v1/agent.ts';
import { CasConflictError } from '../store/errors.ts';
import { candidates, isTerminal, listGroups, listHosts } from './fleet.ts';
import { GroupOps } from './group-ops.ts';
import { withIdempotency } from './idempotency.ts';
import { chooseHost } from './placement.ts';
import { cliKindToProto } from './checkpoints.ts';
import type { GroupRecord, MemberRecord } from './records.ts';
import { Keys, type ControlPlaneContext } from './state.ts';

const MAX_MEMBERS = 16;
const INVENTORY_TIMEOUT_MS = 10_000;

function must<T>(r: { ok: true; value: T } | { ok: false; error: Error }): T {
  if (!r.ok) throw r.error;
  return r.value;
}

/** Map the runner SDK's turn-end evidence to core's classified end (R-S5, R-S6). */
export function turnEndFromEvidence(e: TurnEvidenceInput): TurnEnd {
  if (!e.nativeTurnEnded) {
    const cause = e.kind === 'disconnect' ? 'transport_disconnect' : e.kind === 'timeout' ? 'timeout' : e.kind === 'cancelled' ? 'cancelled' : e.kind === 'rejected' ? 'command_rejected' : 'no_end_event';
    return { kind: 'not_ended', cause };
  }
  return {
    kind: 'ended',
    success: e.succeeded,
    cleanupFinished: e.cleanupFinished,
    transportUsable: e.transportUsable && e.locatorUsable,
    processExits: e.processExited || e.kind === 'api_retry',
  };
}

function nextContextState(m: MemberSession): ContextState {
  switch (m.phase) {
    case 'FRESH': return 'NEW';
    case 'RETAINED': return m.process !== undefined ? 'LIVE' : 'RESTORED';
    case 'IN_TURN': return m.inFlight?.contextState ?? 'LOST';
    default: return 'LOST';
  }
}

export class ControlPlaneRunnerBackend implements RunnerBackend {
  readonly #ops: GroupOps;

  constructor(private readonly ctx: ControlPlaneContext) {
    this.#ops = new GroupOps(ctx);
  }

  async #view(g: GroupRecord, revision: number): Promise<GroupView> {
    const host = await this.ctx.repos.hosts.get(Keys.host(g.lifecycle.hostId));
    return {
      groupId: g.groupId,
      conversationId: g.conversationId,
      state: g.lifecycle.state,
      hostId: g.lifecycle.hostId,
      hostEpoch: host?.value.lifecycle.epoch ?? 0,
      generation: g.lifecycle.generation,
      stopClean: g.lifecycle.stop?.clean,
      lostReason: g.lifecycle.lostReason,
      members: g.members.map((m) => ({
        memberId: m.session.memberId,
        cli: m.session.cli,
        phase: m.session.phase,
        savedLocator: m.session.savedLocator,
        containerId: m.containerId,
        turnInFlightId: m.session.inFlight?.turnId,
        completedTurns: m.session.completedTurns,
        lastContextState: m.lastContextState,
        lostReason: m.session.lostReason,
      })),
      latestCheckpointId: g.latestCheckpointId,
      createdAtMs: g.createdAtMs,
      updatedAtMs: g.updatedAtMs,
      lastActivityAtMs: g.lifecycle.lastActivityAtMs,
      activityVersion: g.lifecycle.activityVersion,
      revision,
    };
  }

  async #viewOf(groupId: string): Promise<GroupView> {
    const g = await this.#ops.get(groupId);
    return this.#view(g.value, g.revision);
  }

  // ---- OpenGroup ---------------------------------------------------------------------------------

  async openGroup(input: OpenGroupInput): Promise<{ readonly group: GroupView; readonly created: boolean }> {
    const conversationId = must(parseConversationId(input.conversationId));
    if (!Array.isArray(input.members) || input.members.length === 0 || input.members.length > MAX_MEMBERS) {
      throw new InvalidArgument('out_of_range', `a group has 1..${MAX_MEMBERS} members`, { details: { field: 'members' } });
    }
    const members = input.members.map((m, i) => {
      const memberId = must(parseMemberId(m.memberId, `members[${i}].memberId`));
      // Member ids land in checkpoint manifests, whose id rule is stricter (no dots).
      if (!isSafeId(memberId)) throw new InvalidArgument('invalid_characters', 'memberId must be 1-64 of A-Za-z0-9_-', { details: { field: `members[${i}].memberId` } });
      if (!CLI_KINDS.includes(m.cli)) throw new InvalidArgument('malformed', `unknown CLI kind`, { details: { field: `members[${i}].cli` } });
      return { memberId: memberId as string, cli: m.cli as CliKind };
    });
    if (new Set(members.map((m) => m.memberId)).size !== members.length) throw new InvalidArgument('malformed', 'duplicate memberId', { details: { field: 'members' } });

    return withIdempotency(this.ctx, 'open', input.idempotencyKey, { conversationId, members }, async () => {
      const convKey = Keys.conversation(conversationId);
      const conv = await this.ctx.repos.conversations.get(convKey);
      let previous: string | undefined;
      if (conv !== undefined) {
        const existing = await this.ctx.repos.groups.get(Keys.group(conv.value.groupId));
        if (existing !== undefined && !isTerminal(existing.value)) {
          if (existing.value.lifecycle.state === 'PENDING') await this.#finishOpening(existing.value);
          return { group: await this.#viewOf(existing.value.groupId), created: false };
        }
        previous = conv.value.groupId;
      }
      // Deterministic id: a retry after a crash finds the group it began to create.
      const groupId = `g-${createHash('sha256').update(`${conversationId}|${previous ?? ''}`).digest('hex').slice(0, 24)}`;
      let group = (await this.ctx.repos.groups.get(Keys.group(groupId)))?.value;
      if (group === undefined) {
        const [hosts, groups] = await Promise.all([listHosts(this.ctx), listGroups(this.ctx)]);
        const chosen = chooseHost(candidates(hosts.map((h) => h.value), groups.map((g) => g.value)), { members: members.length });
        if (chosen === undefined) throw new NoCapacity('no_capacity', 'no READY host has room for the group', { details: { members: members.length } });
        const now = this.ctx.now();
        group = {
          groupId,
          conversationId,
          lifecycle: createGroup(chosen.hostId, now),
          members: members.map((m): MemberRecord => ({ session: newMemberSession(m.memberId, m.cli) })),
          starts: 0,
          stops: 0,
          createdAtMs: now,
          updatedAtMs: now,
        };
        try {
          await this.ctx.repos.groups.create(Keys.group(groupId), group);
          await this.ctx.events.record({ subjectKind: 'group', subjectId: groupId, type: 'group_created', toState: 'PENDING', reason: 'placed', version: 'created', detail: { hostId: chosen.hostId, conversationId, members: members.length } });
        } catch (err) {
          if (!(err instanceof CasConflictError)) throw err;
          group = (await this.#ops.get(groupId)).value;
        }
      }
      await this.#claimConversation(conversationId, groupId, conv?.revision);
      await this.#finishOpening(group);
      return { group: await this.#viewOf(groupId), created: true };
    });
  }

  async #claimConversation(conversationId: string, groupId: string, revision: number | undefined): Promise<void> {
    const key = Keys.conversation(conversationId);
    const record = { conversationId, groupId, createdAtMs: this.ctx.now() };
    try {
      if (revision === undefined) await this.ctx.repos.conversations.create(key, record);
      else await this.ctx.repos.conversations.update(key, record, revision);
    } catch (err) {
      if (!(err instanceof CasConflictError)) throw err;
      const now = await this.ctx.repos.conversations.get(key);
      if (now?.value.groupId !== groupId) throw err;
    }
  }

  /** Create and start the containers of a PENDING group on its host. */
  async #finishOpening(group: GroupRecord): Promise<void> {
    const lc = group.lifecycle;
    const host = await this.ctx.repos.hosts.get(Keys.host(lc.hostId));
    if (host === undefined) throw new Unavailable('host_unreachable', `host ${lc.hostId} vanished`, { details: { hostId: lc.hostId } });
    const target = await this.#ops.target(lc.hostId, lc.generation);
    const created = await this.ctx.agents.send(target, `create-${group.groupId}-g${lc.generation}`, {
      $case: 'createGroup',
      value: {
        groupId: group.groupId,
        conversationId: group.conversationId,
        members: group.members.map((m) => ({ memberId: m.session.memberId, kind: cliKindToProto(m.session.cli) })),
        imageRef: host.value.attestation.imageRef,
        imageDigest: host.value.attestation.imageDigest,
      },
    }, 'createGroup');
    await this.ctx.repos.groups.mutate(Keys.group(group.groupId), (c) => {
      if (c === undefined || c.lifecycle.generation !== lc.generation) return undefined;
      return { ...c, members: c.members.map((m) => ({ ...m, containerId: created.containerIds[m.session.memberId] ?? m.containerId })) };
    });
    await this.#ops.start(group.groupId);
  }

  // ---- BeginTurn ---------------------------------------------------------------------------------

  async beginTurn(input: BeginTurnInput): Promise<BeginTurnView> {
    const groupId = must(parseGroupId(input.groupId));
    const memberId = must(parseMemberId(input.memberId));
    const locator = must(parseOptionalLocator(input.locator));
    const turnId = must(parseTurnId(`t-${createHash('sha256').update(`${groupId}|${memberId}|${input.idempotencyKey}`).digest('hex').slice(0, 32)}`));
    return withIdempotency(this.ctx, 'begin', input.idempotencyKey, { groupId, memberId, locator: locator ?? null }, async () => {
      for (let attempt = 0; ; attempt++) {
        try {
          return await this.#begin(groupId, memberId, locator, turnId);
        } catch (err) {
          if (!(err instanceof CasConflictError) || attempt >= 4) throw err;
        }
      }
    });
  }

  async #begin(groupId: string, memberId: string, locator: Locator | undefined, turnId: string): Promise<BeginTurnView> {
    let g = (await this.#ops.get(groupId)).value;
    const member0 = g.members.find((m) => m.session.memberId === memberId);
    if (member0 === undefined) throw new NotFound('member_not_found', `member ${memberId} not in group ${groupId}`, { details: { groupId, memberId } });
    const state = g.lifecycle.state;
    if (state === 'LOST' || state === 'DESTROYED') {
      this.ctx.metrics.turns.inc({ context_state: 'LOST', cli: member0.session.cli });
      throw new IdentityRefused('context_lost', `group ${groupId} is ${state}${g.lifecycle.lostReason ? ` (${g.lifecycle.lostReason})` : ''}`, { details: { groupId, lostReason: g.lifecycle.lostReason } });
    }
    if (state === 'MIGRATING' || state === 'STOPPING' || g.evacuation !== undefined) {
      throw new Unavailable('host_unreachable', `group ${groupId} is moving or stopping; retry shortly`, { details: { groupId, state } });
    }
    if (member0.session.phase === 'IN_TURN' && member0.session.inFlight?.turnId === turnId) {
      // A repeat of the turn in flight needs no observation: core replays it.
      return this.#applyBegin(g, memberId, { turnId, locator }, { containerPresent: true, layerIntact: true }, turnId);
    }
    if (state === 'PENDING' || state === 'STOPPED') g = await this.#ops.start(groupId);
    const target = await this.#ops.target(g.lifecycle.hostId, g.lifecycle.generation);
    const inventory = await this.ctx.agents.send(target, `inventory-${turnId}-${this.ctx.now()}`, { $case: 'inventory', value: {} }, 'inventory', INVENTORY_TIMEOUT_MS);
    const c = inventory.containers.find((x) => x.groupId === groupId && x.memberId === memberId && x.placementGeneration === g.lifecycle.generation);
    const present = c !== undefined && c.state !== ContainerState.REMOVING && c.state !== ContainerState.DEAD;
    const running: ProcessIdentity | undefined = c !== undefined && c.state === ContainerState.RUNNING ? { containerId: c.containerId, incarnation: String(c.startedAtUnixMs) } : undefined;
    const observation: MemberObservation = { containerPresent: present, layerIntact: present && (c?.writableLayerPresent ?? false), runningProcess: running };
    return this.#applyBegin(g, memberId, { turnId, locator }, observation, turnId, running);
  }

  async #applyBegin(g: GroupRecord, memberId: string, request: { turnId: string; locator: Locator | undefined }, observation: MemberObservation, turnId: string, running?: ProcessIdentity): Promise<BeginTurnView> {
    const now = this.ctx.now();
    let outcome: ReturnType<typeof beginTurn> | undefined;
    let written: GroupRecord | undefined;
    const seen = g.members.find((m) => m.session.memberId === memberId)!;
    await this.ctx.repos.groups.mutate(Keys.group(g.groupId), (current) => {
      written = undefined;
      if (current === undefined || current.lifecycle.generation !== g.lifecycle.generation || current.lifecycle.state !== 'RUNNING') {
        throw new CasConflictError(this.ctx.repos.groups.bucket, Keys.group(g.groupId), 0);
      }
      const m = current.members.find((x) => x.session.memberId === memberId)!;
      // The observation belongs to the member as it was read; a change since means observe again.
      if (JSON.stringify(m.session) !== JSON.stringify(seen.session)) throw new CasConflictError(this.ctx.repos.groups.bucket, Keys.group(g.groupId), 0);
      outcome = beginTurn(m.session, { turnId: request.turnId, locator: request.locator }, observation, now);
      if (outcome.ok && outcome.replayed) return undefined;
      const contextState: ContextState = outcome.ok ? outcome.contextState : outcome.contextState ?? m.lastContextState ?? 'NEW';
      written = {
        ...current,
        members: current.members.map((x) => x.session.memberId !== memberId ? x : {
          ...x,
          session: outcome!.member,
          ...(outcome!.ok ? { lastContextState: contextState, turnProcess: running, containerId: running?.containerId ?? x.containerId } : outcome!.contextState === 'LOST' ? { lastContextState: 'LOST' as const } : {}),
        }),
        updatedAtMs: now,
      };
      return written;
    });
    const o = outcome!;
    const cli = seen.session.cli;
    if (!o.ok) {
      if (o.contextState === 'LOST') {
        this.ctx.metrics.turns.inc({ context_state: 'LOST', cli });
        if (seen.session.phase !== 'LOST' && o.member.phase === 'LOST') {
          this.ctx.metrics.lostSessions.inc({ reason: o.member.lostReason ?? 'turn_unconfirmed' });
          await this.ctx.events.record({ subjectKind: 'group', subjectId: g.groupId, type: 'member_lost', toState: 'LOST', reason: o.member.lostReason ?? 'turn_unconfirmed', version: `${memberId}:${o.member.completedTurns}`, detail: { memberId } });
        }
      }
      if (o.error.reason === 'locator_mismatch') this.ctx.metrics.locatorMismatches.inc({ phase: 'begin' });
      throw o.error;
    }
    if (!o.replayed) this.ctx.metrics.turns.inc({ context_state: o.contextState, cli });
    const rec = written ?? g;
    const host = await this.ctx.repos.hosts.get(Keys.host(rec.lifecycle.hostId));
    const mr = rec.members.find((x) => x.session.memberId === memberId)!;
    return {
      turnId,
      contextState: o.contextState,
      locator: o.effectiveLocator,
      hostId: rec.lifecycle.hostId,
      hostEpoch: host?.value.lifecycle.epoch ?? 0,
      generation: rec.lifecycle.generation,
      containerId: mr.containerId ?? '',
      startedAtMs: o.member.inFlight?.startedAtMs ?? now,
    };
  }

  // ---- CompleteTurn ------------------------------------------------------------------------------

  async completeTurn(input: CompleteTurnInput): Promise<CompleteTurnView> {
    const groupId = must(parseGroupId(input.groupId));
    const memberId = must(parseMemberId(input.memberId));
    const turnId = must(parseTurnId(input.turnId));
    if (input.observedLocator !== undefined && typeof input.observedLocator === 'string' && input.observedLocator.length > 1024) {
      throw new InvalidArgument('value_too_long', 'observedLocator too long', { details: { field: 'observedLocator' } });
    }
    const end = turnEndFromEvidence(input.evidence);
    return withIdempotency(this.ctx, 'complete', input.idempotencyKey, { groupId, memberId, turnId, observed: input.observedLocator ?? null, end }, async () => {
      const now = this.ctx.now();
      let outcome: ReturnType<typeof completeTurn> | undefined;
      let before: MemberSession | undefined;
      await this.ctx.repos.groups.mutate(Keys.group(groupId), (current) => {
        if (current === undefined) throw new NotFound('group_not_found', `group ${groupId} not found`, { details: { groupId } });
        const m = current.members.find((x) => x.session.memberId === memberId);
        if (m === undefined) throw new NotFound('member_not_found', `member ${memberId} not in group ${groupId}`, { details: { groupId, memberId } });
        before = m.session;
        outcome = completeTurn(m.session, { turnId, observedLocator: input.observedLocator, end, process: m.turnProcess });
        if (!outcome.ok || outcome.duplicate) return undefined;
        // Every completion is a group turn_completed (R-G4: older checkpoints become stale).
        const lc = transitionGroup(current.lifecycle, { type: 'turn_completed' }, now);
        return {
          ...current,
          lifecycle: lc.ok ? lc.value : current.lifecycle,
          lastTurnCompletedAtMs: now,
          members: current.members.map((x) => x.session.memberId !== memberId ? x : { ...x, session: outcome!.ok ? outcome!.member : x.session, turnProcess: undefined }),
          updatedAtMs: now,
        };
      });
      const o = outcome!;
      if (!o.ok) throw o.error;
      if (!o.duplicate) {
        if (o.outcome === 'locator_mismatch') this.ctx.metrics.locatorMismatches.inc({ phase: 'end' });
        if (before?.phase !== o.member.phase && (o.member.phase === 'UNCONFIRMED' || o.outcome === 'locator_mismatch')) {
          await this.ctx.events.record({ subjectKind: 'group', subjectId: groupId, type: 'turn_end_refused', reason: o.outcome, version: `${memberId}:${turnId}`, detail: { memberId, turnId } });
        }
      }
      if (o.refusal !== undefined) throw o.refusal;
      return {
        outcome: o.outcome,
        sessionKept: o.member.phase === 'RETAINED',
        savedLocator: o.member.savedLocator,
        nextContextState: nextContextState(o.member),
      };
    });
  }

  // ---- StopGroup / GetGroupState -----------------------------------------------------------------

  async stopGroup(input: StopGroupInput): Promise<StopGroupView> {
    const groupId = must(parseGroupId(input.groupId));
    const grace = input.graceMs ?? this.ctx.config.stopGraceMs;
    if (!Number.isInteger(grace) || grace < 0 || grace > 600_000) throw new InvalidArgument('out_of_range', 'graceMs must be 0..600000', { details: { field: 'graceMs' } });
    return withIdempotency(this.ctx, 'stop', input.idempotencyKey, { groupId, grace }, async () => {
      const g = await this.#ops.stop(groupId, grace, 'runner stop');
      let checkpointId: string | undefined;
      if (g.lifecycle.state === 'STOPPED' && g.lifecycle.stop?.clean) {
        try {
          // R-G3: checkpoint right after a clean stop.
          checkpointId = (await this.#ops.checkpoint(groupId)).checkpointId;
        } catch (err) {
          this.ctx.logger.warn({ err, groupId }, 'checkpoint after clean stop failed; the controller retries before any migration');
        }
      }
      return { group: await this.#viewOf(groupId), ...(checkpointId !== undefined ? { checkpointId } : {}) };
    });
  }

  async getGroupState(query: { readonly groupId?: string | undefined; readonly conversationId?: string | undefined }): Promise<GroupView> {
    if (query.groupId !== undefined && query.groupId !== '') return this.#viewOf(must(parseGroupId(query.groupId)));
    if (query.conversationId === undefined || query.conversationId === '') throw new InvalidArgument('empty_value', 'groupId or conversationId is required', { details: { field: 'groupId' } });
    const conversationId = must(parseConversationId(query.conversationId));
    const conv = await this.ctx.repos.conversations.get(Keys.conversation(conversationId));
    if (conv === undefined) throw new NotFound('group_not_found', 'no group for this conversation', { details: { field: 'conversationId' } });
    return this.#viewOf(conv.value.groupId);
  }
}
