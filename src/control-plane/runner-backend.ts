// The runner backend (R-I1, R-S1..R-S8): implements core's RunnerBackend over the group records.
// Every member change goes through core member-session (beginTurn/completeTurn), every group change
// through transitionGroup (via GroupOps), each written with compare-and-set.
//
// The turn hot path (issue 5 benchmark) costs ONE fsynced write per call:
// - Idempotency of BeginTurn/CompleteTurn rides inside the same CAS as the member change: each member
//   keeps its last begin and last complete answer ({key digest, request digest, answer}) plus the
//   digests of its 16 previous keys (idempotency.ts). A repeat with the same key and request gets
//   the stored answer; the same key with another request, or an older key whose answer is no longer
//   kept, is refused `idempotency_key_reused` — never executed twice. Keys are scoped per member.
//   Turn ids are still derived from the key, so a retried BeginTurn also replays the turn in flight.
//   A begin refused `turn_in_flight` is stored beside the begin answer, never over it.
// - Per-turn evidence (issue 13): CompleteTurn appends what the turn end reported and what was
//   decided to the member's `turns` (bounded) in that same compare-and-set.
// - LOST stays loud: a conversation whose group is LOST or DESTROYED is refused `conversation_lost`
//   at OpenGroup unless the runner asks to start anew; BeginTurn, CompleteTurn and StopGroup on such
//   a group answer `context_lost` with the group's lost reason.
// - OpenGroup places by the read model, but the host's agent has the last word on room (it counts
//   the containers on its engine): a group it refuses is withdrawn (DESTROYED before it held
//   anything, marked, never named by the conversation) and the open tries the next host; with none
//   left it is RESOURCE_EXHAUSTED no_capacity. The conversation names its group only once the
//   group's containers exist.
// - R-S1 evidence without asking the agent (see liveEvidence): LIVE needs proof that the process
//   that ran the member's last turn is still the one running. The member record names that process
//   (container id + container start time, recorded at the turn's end); a heartbeat of the host's
//   current epoch, received at most `freshness` ago, listing that very container with that very start
//   time, running, layer present, is that proof: containers run with restart policy "no" and every
//   start goes through the control plane (start, restore), which clears the recorded process — so no
//   other process can carry that identity, and the only change possible since the heartbeat is an
//   exit, which the same race allows with a per-turn inventory too (it is only a few seconds wider).
//   Everything else — NEW, RESTORED, a process to start or reclaim, any doubt, and every decision
//   that could make a member LOST — asks the agent for a fresh inventory, as before: stale
//   heartbeat evidence is used only to say "yes, same process", never "no, it is gone".
// - Turn processes (RunTurn keeps Claude Code and Pi running between turns, turn-runner.ts): their
//   identity is `<container start ms>/<process id>`, recorded at the turn's end (CompleteTurn of the
//   fleet names the process it ran the turn on). LIVE for one is decided from a FRESH inventory
//   only: the agent lists the turn processes it keeps (idle, in that very container run, started
//   with the same command — RunTurn's begin names the command's digest), and core reuses one only
//   if it is listed. Never from a heartbeat: a CLI process can die between beats (a crash, the
//   agent restarting), and a turn begun LIVE on a process that is gone cannot run (the turn is
//   unconfirmed). The fresh inventory costs one agent round trip (milliseconds next to a model
//   call) and narrows that window to the time between it and the turn's attach, which the agent
//   checks again. A runner's own begin never reuses a turn process, and RunTurn never reuses a
//   process a runner drove itself (core member-session.ts): each is RESTORED, with the container
//   run restarted first if the other's process may still run on the session (R-S6).
// - RunTurn's driver (turn-runner.ts): a fleet begin carries a per-call token; the begin that creates
//   the turn writes it, with the replica and a lease, as the member's `turnDriver` in its own CAS and
//   answers it (`driverToken`, kept with the stored answer), so a repeat of the call learns from the
//   answer alone that another call drives the turn. The driver renews the lease by CAS
//   (renewTurnDriver); a completion that takes the turn over from a driver whose lease lapsed is
//   itself checked in the completion's CAS (a driver that renewed meanwhile wins).
import { createHash } from 'node:crypto';
import {
  CLI_KINDS,
  Fenced,
  IdentityRefused,
  InvalidArgument,
  NoCapacity,
  NotFound,
  Unavailable,
  beginTurn,
  completeTurn,
  containerRunOf,
  isTurnProcess,
  turnProcessIn,
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
  type FleetError,
  type Reason,
} from '../core/index.ts';
import { isSafeId } from '../core/checkpoint-manifest.ts';
import { parseIdleStopAfterMs, type IdleStopAfter } from '../core/idle-stop.ts';
import type { BeginTurnInput, BeginTurnView, CompleteTurnInput, CompleteTurnView, GroupView, OpenGroupInput, RunnerBackend, StopGroupInput, StopGroupView, TurnEvidenceInput } from '../core/runner-port.ts';
import { ContainerState } from '../gen/sandboxfleet/v1/agent.ts';
import { CasConflictError } from '../store/errors.ts';
import { AgentCommandFailed } from './agent-client.ts';
import type { Versioned } from '../store/kv-repository.ts';
import { CommandIds } from '../wire/agent-protocol.ts';
import { candidates, isTerminal } from './fleet.ts';
import type { FleetState } from './fleet-state.ts';
import { GroupOps } from './group-ops.ts';
import { protectAfterTurn } from './idle-stop.ts';
import { findTurnCall, isFinalRefusal, keyDigest, recordTurnCall, refusalOutcome, replayOutcome, requestHash, validateIdempotencyKey, valueOutcome, withIdempotency } from './idempotency.ts';
import { chooseHost } from './placement.ts';
import { groupView } from './views.ts';
import { cliKindFromName as cliKindToProto } from '../wire/cli-kind.ts';
import { appendTurnEvidence, encodeTurnFlags, turnEvidenceBudget, type GroupRecord, type HeartbeatRecord, type HostRecord, type MemberRecord, type TurnEvidenceRecord } from './records.ts';
import { Keys, type ControlPlaneDeps } from './state.ts';

/** Withdrawn groups of one conversation passed over before an open gives up (a bound, not a budget). */
const MAX_WITHDRAWN_OPENS = 2 ** 16;

/** OpenGroup of a conversation whose group is gone (LOST, DESTROYED, absent): loud, never replaced silently. */
function conversationLost(conversationId: string, groupId: string, state: string, lostReason: string | undefined): IdentityRefused {
  return new IdentityRefused('conversation_lost', `conversation ${conversationId}: its group ${groupId} is ${state}${lostReason !== undefined ? ` (${lostReason})` : ''}; its native history is gone. OpenGroup with start_anew opens a new, empty group`, {
    details: { groupId, groupState: state, lostReason },
  });
}

/** The agent refused a command for want of room (it did nothing). */
function isCapacityRefusal(err: unknown): err is AgentCommandFailed {
  return err instanceof AgentCommandFailed && err.outcome === 'refused' && err.reason === 'no_capacity';
}

/** Agent answers that say the command itself was wrong (a contract bug): no retry can cure them. */
const CONTRACT_REFUSALS: ReadonlySet<string> = new Set(['invalid_argument', 'malformed', 'too_large', 'wrong_host', 'unexpected_result']);

/**
 * A host that failed a command a runner call needed (its engine down, a failure on the host, an
 * answer fenced by a newer epoch): transient to the runner, who retries with the same key
 * (UNAVAILABLE), never an internal error it would not retry. Refusals with a meaning of their own are
 * mapped where they are handled (no_capacity at open, the slot reclaim), before this.
 */
function hostFailure(err: unknown): unknown {
  // An answer from another epoch of the host (it registered again mid-call): the retry re-reads it.
  if (err instanceof Fenced && err.reason !== 'stale_incarnation') {
    return new Unavailable('host_unreachable', `the group's host changed during the call (${err.reason}); retry`, { cause: err, details: { agentReason: err.reason } });
  }
  if (!(err instanceof AgentCommandFailed) || CONTRACT_REFUSALS.has(err.reason)) return err;
  return new Unavailable('host_unreachable', `the group's host could not carry out the call (${err.outcome}: ${err.reason}); retry`, { cause: err, details: { agentReason: err.reason } });
}

/** The `attempt`-th deterministic group id of a conversation opened (anew after `previous`). */
function groupIdFor(conversationId: string, previous: string | undefined, attempt: number): string {
  // Attempt 0 keeps the id every group had before withdrawn opens existed.
  const seed = attempt === 0 ? `${conversationId}|${previous ?? ''}` : `${conversationId}|${previous ?? ''}|${attempt}`;
  return `g-${createHash('sha256').update(seed).digest('hex').slice(0, 24)}`;
}

export type RunnerBackendDeps = Pick<ControlPlaneDeps, 'config' | 'fleet' | 'groups' | 'hosts' | 'checkpoints' | 'conversations' | 'idempotency' | 'chunks' | 'agents' | 'gcLocks' | 'events' | 'metrics' | 'logger' | 'now' | 'replicaId'>;

const MAX_MEMBERS = 16;
const INVENTORY_TIMEOUT_MS = 10_000;
/** Re-reads after a lost CAS race before the caller sees the conflict (ABORTED). */
const CAS_ATTEMPTS = 8;

/**
 * A turn the fleet runs itself (RunTurn): the digest of the command its turn process is started with
 * (undefined: the fleet runs one process per turn and reuses none), and the calling driver's token
 * and lease (turn-runner.ts): written only if this begin creates the turn.
 */
export interface FleetTurn {
  readonly commandDigest: string | undefined;
  readonly driver?: { readonly token: string; readonly leaseMs: number } | undefined;
}

/** A driver's lease counts as lapsed only this long after its end by the reader's clock (replicas' clocks differ). */
export const DRIVER_LEASE_SKEW_MS = 5_000;

/** How a completion relates to RunTurn's driver of the turn (see FleetTurn). */
export interface FleetCompletion {
  /** The turn process RunTurn started for this turn (NEW or RESTORED). */
  readonly process?: ProcessIdentity | undefined;
  /**
   * The token of a driver whose lease lapsed: complete the turn in its place — refused
   * `turn_in_flight` unless that driver still holds the turn and its lease ended
   * DRIVER_LEASE_SKEW_MS ago by this replica's clock.
   */
  readonly takeOverFrom?: string | undefined;
}

/** A turn call's identity for idempotency: digests of its key and of its request. */
interface Call {
  readonly key: string;
  readonly request: string;
}

/**
 * R-S1 LIVE evidence from the host's heartbeat (see the header): the observation when the member's
 * recorded process is listed running, with its layer, in a fresh heartbeat of the host's current
 * epoch; undefined when anything is missing or doubtful (the caller then asks the agent).
 */
export function liveEvidence(g: GroupRecord, m: MemberRecord, host: HostRecord | undefined, hb: HeartbeatRecord | undefined, nowMs: number, freshnessMs: number): (MemberObservation & { runningProcess: ProcessIdentity }) | undefined {
  const p = m.session.process;
  if (g.lifecycle.state !== 'RUNNING' || m.session.phase !== 'RETAINED' || p === undefined || m.session.savedLocator === undefined) return undefined;
  // A turn process is proven running by a fresh inventory only (see the header).
  if (isTurnProcess(p)) return undefined;
  if (host === undefined || (host.lifecycle.state !== 'READY' && host.lifecycle.state !== 'DRAINING')) return undefined;
  if (hb === undefined || hb.epoch !== host.lifecycle.epoch || nowMs - hb.receivedAtMs > freshnessMs || hb.receivedAtMs > nowMs + freshnessMs) return undefined;
  const c = hb.containers.find((x) => x.groupId === g.groupId && x.memberId === m.session.memberId && x.generation === g.lifecycle.generation);
  if (c === undefined || !c.running || !c.writableLayerPresent || c.containerId !== p.containerId || String(c.startedAtMs) !== p.incarnation) return undefined;
  return { containerPresent: true, layerIntact: true, runningProcess: p };
}

/**
 * Thrown when a decision that writes nothing was about to be made from a cached group record: the
 * caller reads the record fresh and decides again (answers never rest on a possibly stale copy).
 */
class NeedsFreshRead extends Error {}

/**
 * The last version of each group this backend wrote (write-through): a turn call compare-and-sets
 * against it without reading first. A copy made stale by any other writer only costs a CAS conflict
 * and a fresh read; an answer that writes nothing is always decided from a fresh read.
 */
class GroupCache {
  readonly #entries = new Map<string, Versioned<GroupRecord>>();

  get(groupId: string): Versioned<GroupRecord> | undefined {
    return this.#entries.get(groupId);
  }

  set(groupId: string, v: Versioned<GroupRecord>): void {
    this.#entries.delete(groupId);
    this.#entries.set(groupId, v);
    if (this.#entries.size > 8192) this.#entries.delete(this.#entries.keys().next().value as string);
  }

  drop(groupId: string): void {
    this.#entries.delete(groupId);
  }
}

/**
 * LIVE evidence from the read model: the host record (its current epoch) and its latest heartbeat,
 * both in memory (every replica receives every heartbeat). Whether the evidence is fresh enough is
 * judged from the heartbeat's own arrival time (liveEvidence), never assumed.
 */
class Evidence {
  constructor(private readonly fleet: FleetState) {}

  host(hostId: string): HostRecord | undefined {
    return this.fleet.host(Keys.host(hostId))?.value;
  }

  heartbeat(hostId: string): HeartbeatRecord | undefined {
    return this.fleet.heartbeat(hostId);
  }
}

function must<T>(r: { ok: true; value: T } | { ok: false; error: Error }): T {
  if (!r.ok) throw r.error;
  return r.value;
}

/** The members of a group as a comparable set (ids with their CLI kinds; order does not matter). */
function memberSet(members: readonly { readonly memberId: string; readonly cli: string }[]): string {
  return members.map((m) => `${m.memberId}:${m.cli}`).sort().join(',');
}

/** OpenGroup for a live group with other members: refused, members are fixed for a group's life. */
function requireSameMembers(g: GroupRecord, wanted: readonly { readonly memberId: string; readonly cli: CliKind }[]): void {
  const have = memberSet(g.members.map((m) => ({ memberId: m.session.memberId, cli: m.session.cli })));
  if (have !== memberSet(wanted)) {
    throw new InvalidArgument('member_set_mismatch', `conversation ${g.conversationId} has group ${g.groupId} with members ${have}; members are fixed for a group's life`, { details: { field: 'members', groupId: g.groupId, members: have } });
  }
}

/**
 * A call about a LOST or DESTROYED group (BeginTurn, CompleteTurn, StopGroup): the native state is
 * gone, so the answer is a refusal that says why, never a normal-looking one.
 */
function groupLostRefusal(g: GroupRecord, memberId?: string): IdentityRefused {
  const state = g.lifecycle.state;
  const reason = g.lifecycle.lostReason;
  return new IdentityRefused('context_lost', `group ${g.groupId} is ${state}${reason !== undefined ? ` (${reason})` : ''}`, {
    details: { groupId: g.groupId, ...(memberId !== undefined ? { memberId } : {}), groupState: state, lostReason: reason },
  });
}

/** A safe byte count for the evidence, or undefined (the counts are diagnosis only, never refused here). */
function byteCount(n: number | undefined): number | undefined {
  return n !== undefined && Number.isSafeInteger(n) && n >= 0 ? n : undefined;
}

/** The stored evidence of one turn end: what the driver reported, and what was decided. */
function turnEvidenceRecord(g: GroupRecord, turnId: string, inFlight: { readonly contextState: 'NEW' | 'LIVE' | 'RESTORED'; readonly startedAtMs: number }, observedLocator: string | undefined, e: TurnEvidenceInput, outcome: CompleteTurnView['outcome'], refusal: FleetError<Reason> | undefined, nowMs: number): TurnEvidenceRecord {
  const entry: TurnEvidenceRecord = {
    turnId,
    contextState: inFlight.contextState,
    generation: g.lifecycle.generation,
    beganAtMs: inFlight.startedAtMs,
    durationMs: Math.max(0, nowMs - inFlight.startedAtMs),
    kind: e.kind,
    flags: encodeTurnFlags(e),
    exitCode: e.exitCode !== undefined && Number.isInteger(e.exitCode) ? e.exitCode : undefined,
    observedLocator: observedLocator === undefined || observedLocator === '' ? undefined : observedLocator,
    nativeTurnId: e.nativeTurnId === undefined || e.nativeTurnId === '' ? undefined : e.nativeTurnId.slice(0, 64),
    inputBytes: byteCount(e.inputBytes),
    outputBytes: byteCount(e.outputBytes),
    outcome,
    refusal: refusal?.reason === 'locator_mismatch' || refusal?.reason === 'locator_missing' || refusal?.reason === 'locator_invalid' ? refusal.reason : undefined,
  };
  // Absent, not undefined: the stored JSON and its replay stay the same shape.
  return Object.fromEntries(Object.entries(entry).filter(([, v]) => v !== undefined)) as TurnEvidenceRecord;
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
    exitConfirmed: e.processExited && e.exitConfirmed,
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
  readonly #evidence: Evidence;
  readonly #groups = new GroupCache();
  /** How old a heartbeat may be to prove LIVE (two beats: one late beat does not force the slow path). */
  readonly #freshnessMs: number;
  #fastBegins = 0;
  #agentBegins = 0;
  /**
   * Groups being protected after a completion answered (protectInBackground), one run per group;
   * `again`: another completion asked meanwhile, so the run goes once more (the first may have
   * found that completion's turn still in flight and left the group unprotected).
   */
  readonly #background = new Map<string, { again: boolean; done: Promise<void> }>();

  constructor(private readonly ctx: RunnerBackendDeps) {
    this.#ops = new GroupOps(ctx);
    this.#freshnessMs = Math.min(ctx.config.heartbeatTtlMs, 2 * ctx.config.heartbeatIntervalMs);
    this.#evidence = new Evidence(ctx.fleet);
  }

  /** Begins decided from heartbeat evidence vs. from a fresh agent inventory (for benchmarks and tests). */
  get beginEvidenceCounts(): { readonly heartbeat: number; readonly agent: number } {
    return { heartbeat: this.#fastBegins, agent: this.#agentBegins };
  }

  async #view(g: GroupRecord, revision: number): Promise<GroupView> {
    return groupView(g, revision, this.#evidence.host(g.lifecycle.hostId)?.lifecycle.epoch ?? 0);
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

    const startAnew = input.startAnew === true;
    // start_anew is part of the request (a key reused without it is another request); absent when
    // false, so the answers stored before the field existed still match their repeats.
    // The group's idle auto-stop (absent: the fleet's default), in the request hash only when set.
    const idle = input.idleStopAfterMs;
    if (idle !== undefined && idle !== 'never') must(parseIdleStopAfterMs(idle));
    return withIdempotency(this.ctx, 'open', input.idempotencyKey, { conversationId, members, ...(startAnew ? { startAnew } : {}), ...(idle !== undefined ? { idle } : {}) }, async () => {
      const convKey = Keys.conversation(conversationId);
      const conv = await this.ctx.conversations.get(convKey);
      let previous: string | undefined;
      if (conv !== undefined) {
        const existing = await this.ctx.groups.get(conv.value.groupId);
        if (existing !== undefined && !isTerminal(existing.value)) {
          requireSameMembers(existing.value, members);
          if (idle !== undefined && existing.value.idleStopAfterMs !== idle) await this.#setIdleStop(existing.value.groupId, idle);
          // (A conversation named its PENDING group before its containers existed in older releases.)
          if (existing.value.lifecycle.state === 'PENDING') await this.#finishOpening(existing.value).catch((err: unknown) => {
            throw isCapacityRefusal(err) ? new NoCapacity('no_capacity', `host ${existing.value.lifecycle.hostId} has no room for the group now; try again later`, { details: { members: members.length } }) : hostFailure(err);
          });
          return { group: await this.#viewOf(existing.value.groupId), created: false };
        }
        // The conversation's native history is gone (LOST, DESTROYED, or a record that is not
        // there): say so, and open a new, empty group only when the runner asked for one.
        if (!startAnew) {
          throw conversationLost(conversationId, conv.value.groupId, existing?.value.lifecycle.state ?? 'absent', existing?.value.lifecycle.lostReason);
        }
        previous = conv.value.groupId;
      }
      // Hosts whose agent refused the group for want of room (the read model still counted it).
      const refusedBy = new Set<string>();
      for (;;) {
        const { groupId, group: found } = await this.#groupToOpen(conversationId, previous);
        let group = found;
        if (group === undefined) {
          const chosen = chooseHost(candidates(this.ctx.fleet), { members: members.length, exclude: refusedBy });
          if (chosen === undefined) {
            throw new NoCapacity('no_capacity', refusedBy.size > 0 ? `no READY host has room for the group (full: ${[...refusedBy].join(', ')})` : 'no READY host has room for the group', { details: { members: members.length } });
          }
          const now = this.ctx.now();
          group = {
            groupId,
            conversationId,
            lifecycle: createGroup(chosen.hostId, now),
            members: members.map((m): MemberRecord => ({ session: newMemberSession(m.memberId, m.cli) })),
            starts: 0,
            stops: 0,
            ...(idle !== undefined ? { idleStopAfterMs: idle } : {}),
            createdAtMs: now,
            updatedAtMs: now,
          };
          try {
            await this.ctx.groups.create({ record: group, events: [{ type: 'group_created', toState: 'PENDING', reason: previous !== undefined ? 'started_anew' : 'placed', version: 'created', detail: { hostId: chosen.hostId, conversationId, members: members.length, ...(previous !== undefined ? { previousGroupId: previous } : {}) } }] });
          } catch (err) {
            if (!(err instanceof CasConflictError)) throw err;
            group = (await this.#ops.get(groupId)).value;
            // A concurrent open created it and its host refused it since: the next id.
            if (group.openRefusedAtMs !== undefined) continue;
          }
        }
        // A concurrent open of the conversation (or a crashed earlier attempt) made this group: it
        // must be the group asked for.
        requireSameMembers(group, members);
        // Past PENDING: an earlier attempt (crashed before its claim, or a concurrent open) opened it.
        if (group.lifecycle.state === 'PENDING') {
          try {
            await this.#finishOpening(group);
          } catch (err) {
            const lc = group.lifecycle;
            // A concurrent open's host refused this group and withdrew it while this open worked on
            // it: whatever this open made there is deleted (the withdrawn record proves it unneeded;
            // its own delete may have come before this open's create), and the next id is tried.
            const now = (await this.ctx.groups.get(groupId))?.value;
            if (now?.openRefusedAtMs !== undefined) {
              await this.#ops.deleteOn(lc.hostId, groupId, lc.generation, 'open_withdrawn');
              continue;
            }
            if (!isCapacityRefusal(err)) throw hostFailure(err);
            refusedBy.add(lc.hostId);
            // Withdrawn here, or moved past PENDING by a concurrent open (then claimed as it is).
            await this.#withdrawRefusedOpen(group, err.detail);
            continue;
          }
        }
        // The conversation names its group only once the group holds containers, so an open its host
        // refused leaves the conversation as it was.
        await this.#claimConversation(conversationId, groupId, conv?.revision);
        const view = await this.#viewOf(groupId);
        if (view.state === 'LOST' || view.state === 'DESTROYED') {
          // Ended before this open's claim (a host lost right after the start): as loud as any LOST group.
          throw conversationLost(conversationId, groupId, view.state, view.lostReason);
        }
        return { group: view, created: true };
      }
    });
  }

  /**
   * The group an open of `conversationId` (started anew after `previous`) creates or finishes: the
   * first of its deterministic ids (a retry after a crash finds the group it began to create) whose
   * group was not withdrawn because its host refused it.
   */
  async #groupToOpen(conversationId: string, previous: string | undefined): Promise<{ groupId: string; group: GroupRecord | undefined }> {
    const read = async (attempt: number) => {
      const groupId = groupIdFor(conversationId, previous, attempt);
      return { groupId, group: (await this.ctx.groups.get(groupId))?.value };
    };
    const first = await read(0);
    if (first.group?.openRefusedAtMs === undefined) return first;
    // Withdrawn ids are always a prefix (id n is created only after id n-1 was seen withdrawn, and a
    // withdrawn group stays so): gallop to a free or live id, then bisect to the first one, in
    // O(log n) reads however often the conversation's opens were refused.
    let withdrawn = 0;
    let beyond = 1;
    for (;;) {
      const r = await read(beyond);
      if (r.group?.openRefusedAtMs === undefined) break;
      withdrawn = beyond;
      if (beyond >= MAX_WITHDRAWN_OPENS) throw new NoCapacity('no_capacity', `conversation ${conversationId}: its opens were refused by full hosts ${beyond} times; try again later`, { details: { conversationId } });
      beyond *= 2;
    }
    while (beyond - withdrawn > 1) {
      const mid = Math.floor((withdrawn + beyond) / 2);
      if ((await read(mid)).group?.openRefusedAtMs !== undefined) withdrawn = mid;
      else beyond = mid;
    }
    return read(beyond);
  }

  /**
   * The host refused to create the group (full: the agent counts its containers, the read model may
   * lag behind a placement made a moment ago). The PENDING group is DESTROYED by compare-and-set
   * before anything runs in it, marked so the conversation's next open takes the next group id, and
   * a delete is sent to the host for whatever a concurrent open of the same group created there (the
   * record proves nothing of it is needed; the host's registration deletes it otherwise).
   */
  async #withdrawRefusedOpen(group: GroupRecord, agentSays: string): Promise<void> {
    const lc = group.lifecycle;
    const now = this.ctx.now();
    const after = await this.#ops.transition(group.groupId, { type: 'destroyed' }, `host ${lc.hostId} refused the open: ${agentSays}`,
      (c) => c.lifecycle.state === 'PENDING' && c.openRefusedAtMs === undefined && c.lifecycle.generation === lc.generation && c.lifecycle.hostId === lc.hostId,
      () => ({ openRefusedAtMs: now }));
    this.ctx.logger.warn({ groupId: group.groupId, hostId: lc.hostId, withdrawn: after !== undefined, agentSays }, 'host refused the open for want of room');
    // Not withdrawn: another writer moved the group on (a concurrent open finished it, or withdrew it).
    if (after !== undefined) await this.#ops.deleteOn(lc.hostId, group.groupId, lc.generation, 'open_refused');
  }

  /** Reopening a live group with another idle auto-stop changes its setting (the idle queue re-judges it). */
  async #setIdleStop(groupId: string, idle: IdleStopAfter): Promise<void> {
    await this.ctx.groups.transact(groupId, (c) => (c === undefined || isTerminal(c) || c.idleStopAfterMs === idle ? undefined : { record: { ...c, idleStopAfterMs: idle, updatedAtMs: this.ctx.now() } }));
  }

  async #claimConversation(conversationId: string, groupId: string, revision: number | undefined): Promise<void> {
    const key = Keys.conversation(conversationId);
    const record = { conversationId, groupId, createdAtMs: this.ctx.now() };
    try {
      if (revision === undefined) await this.ctx.conversations.create(key, record);
      else await this.ctx.conversations.update(key, record, revision);
    } catch (err) {
      if (!(err instanceof CasConflictError)) throw err;
      const now = await this.ctx.conversations.get(key);
      if (now?.value.groupId !== groupId) throw err;
    }
  }

  /** Create and start the containers of a PENDING group on its host. */
  async #finishOpening(group: GroupRecord): Promise<void> {
    const lc = group.lifecycle;
    const host = await this.ctx.hosts.get(lc.hostId);
    if (host === undefined) throw new Unavailable('host_unreachable', `host ${lc.hostId} vanished`, { details: { hostId: lc.hostId } });
    const target = await this.#ops.target(lc.hostId, lc.generation);
    const created = await this.ctx.agents.send(target, CommandIds.create(group.groupId, lc.generation), {
      $case: 'createGroup',
      value: {
        groupId: group.groupId,
        conversationId: group.conversationId,
        members: group.members.map((m) => ({ memberId: m.session.memberId, kind: cliKindToProto(m.session.cli) })),
        imageRef: host.value.attestation.imageRef,
        imageDigest: host.value.attestation.imageDigest,
      },
    }, 'createGroup');
    await this.ctx.groups.transact(group.groupId, (c) => {
      if (c === undefined || c.lifecycle.generation !== lc.generation) return undefined;
      return { record: { ...c, members: c.members.map((m) => ({ ...m, containerId: created.containerIds[m.session.memberId] ?? m.containerId })) } };
    });
    await this.#ops.start(group.groupId);
  }

  // ---- BeginTurn ---------------------------------------------------------------------------------

  /**
   * `fleet`: the fleet runs this turn itself (RunTurn) with a turn process started by the command of
   * digest `commandDigest`; only such a process is reused LIVE (see the header).
   */
  async beginTurn(input: BeginTurnInput, fleet?: FleetTurn): Promise<BeginTurnView> {
    const groupId = must(parseGroupId(input.groupId));
    const memberId = must(parseMemberId(input.memberId));
    const locator = must(parseOptionalLocator(input.locator));
    const key = validateIdempotencyKey(input.idempotencyKey);
    const call: Call = { key: keyDigest('begin', key), request: requestHash({ groupId, memberId, locator: locator ?? null }) };
    const turnId = must(parseTurnId(`t-${createHash('sha256').update(`${groupId}|${memberId}|${key}`).digest('hex').slice(0, 32)}`));
    const driver = fleet?.driver;
    if (driver !== undefined && (!/^[A-Za-z0-9_-]{8,64}$/.test(driver.token) || !Number.isSafeInteger(driver.leaseMs) || driver.leaseMs < 1_000 || driver.leaseMs > 600_000)) {
      throw new InvalidArgument('malformed', 'a turn driver needs a token [A-Za-z0-9_-]{8,64} and a lease of 1..600 s', { details: { field: 'driver' } });
    }
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.#begin(groupId, memberId, locator, turnId, call, attempt === 0, fleet);
      } catch (err) {
        // Another write to the group won the race (or a cached copy cannot answer): re-read, re-check
        // the stored calls, redo.
        this.#groups.drop(groupId);
        if (err instanceof NeedsFreshRead) continue;
        if (!(err instanceof CasConflictError) || attempt >= CAS_ATTEMPTS) throw hostFailure(err);
      }
    }
  }

  /**
   * Wait (bounded: the stop grace plus 10 s) until the read model no longer shows the group
   * STOPPING; UNAVAILABLE if it still does. The caller then decides again from a fresh read.
   */
  async #awaitStopEnd(groupId: string, seenRevision: number): Promise<void> {
    const until = this.ctx.now() + this.ctx.config.stopGraceMs + 10_000;
    const key = Keys.group(groupId);
    const stopping = (): boolean => {
      const m = this.ctx.fleet.group(key);
      // A model behind the record we read still has to show the stop.
      return m === undefined || m.revision <= seenRevision || m.value.lifecycle.state === 'STOPPING';
    };
    while (stopping()) {
      if (this.ctx.now() > until) throw new Unavailable('host_unreachable', `group ${groupId} is still stopping; retry shortly`, { details: { groupId, state: 'STOPPING' } });
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  /** The group record to decide from: the cached copy on a first attempt, else a fresh read. */
  async #load(groupId: string, useCache: boolean): Promise<{ gv: Versioned<GroupRecord>; cached: boolean }> {
    const hit = useCache ? this.#groups.get(groupId) : undefined;
    if (hit !== undefined) return { gv: hit, cached: true };
    return { gv: await this.#ops.get(groupId), cached: false };
  }

  /** Write `next` over exactly the version the decision was made from, and keep it cached. */
  async #write(before: GroupRecord, next: GroupRecord, revision: number): Promise<void> {
    const written = await this.ctx.groups.put(before, { record: next }, revision);
    this.#groups.set(before.groupId, written);
  }

  async #begin(groupId: string, memberId: string, locator: Locator | undefined, turnId: string, call: Call, useCache: boolean, fleet: FleetTurn | undefined): Promise<BeginTurnView> {
    const fleetDriven = fleet !== undefined;
    const loaded = await this.#load(groupId, useCache);
    let gv = loaded.gv;
    const fresh = (): void => {
      if (loaded.cached) throw new NeedsFreshRead();
    };
    const g0 = gv.value;
    const member0 = g0.members.find((m) => m.session.memberId === memberId);
    if (member0 === undefined) {
      fresh();
      throw new NotFound('member_not_found', `member ${memberId} not in group ${groupId}`, { details: { groupId, memberId } });
    }
    // A stored answer never changes once written: a cached copy that has it is as good as a fresh one.
    const prior = findTurnCall(member0.calls, 'begin', call.key, call.request);
    if (prior !== undefined) {
      if ('refusal' in prior) throw prior.refusal;
      return replayOutcome<BeginTurnView>(prior.outcome);
    }
    const state = g0.lifecycle.state;
    if (state === 'LOST' || state === 'DESTROYED') {
      this.ctx.metrics.turns.inc({ context_state: 'LOST', cli: member0.session.cli });
      throw groupLostRefusal(g0, memberId);
    }
    if (state === 'STOPPING' && g0.evacuation === undefined) {
      // A stop (an idle stop, a runner's StopGroup) is under way: wait for it, then start the group
      // again (RESTORED) instead of refusing the turn.
      fresh();
      await this.#awaitStopEnd(groupId, gv.revision);
      throw new NeedsFreshRead();
    }
    if (state === 'MIGRATING' || state === 'STOPPING' || g0.evacuation !== undefined) {
      fresh();
      throw new Unavailable('host_unreachable', `group ${groupId} is moving or stopping; retry shortly`, { details: { groupId, state } });
    }
    if (member0.session.phase === 'IN_TURN' && member0.session.inFlight?.turnId === turnId) {
      // A repeat of the turn in flight needs no observation: core replays it (from a fresh read).
      fresh();
      const host = this.#evidence.host(g0.lifecycle.hostId);
      return this.#applyBegin(gv, false, memberId, { turnId, locator, fleetDriven, driver: fleet?.driver }, { containerPresent: true, layerIntact: true }, call, host?.lifecycle.epoch ?? 0);
    }
    if (state === 'PENDING' || state === 'STOPPED') {
      fresh();
      await this.#ops.start(groupId);
      gv = await this.#ops.get(groupId);
    }
    const g = gv.value;
    const member = g.members.find((m) => m.session.memberId === memberId)!;
    const host = this.#evidence.host(g.lifecycle.hostId);
    const heartbeat = this.#evidence.heartbeat(g.lifecycle.hostId);
    // Heartbeat evidence proves a runner's own process only (the container run it lives in).
    const fast = fleetDriven ? undefined : liveEvidence(g, member, host, heartbeat, this.ctx.now(), this.#freshnessMs);
    if (fast !== undefined) {
      this.#fastBegins += 1;
      return this.#applyBegin(gv, loaded.cached, memberId, { turnId, locator, fleetDriven, driver: fleet?.driver }, fast, call, host!.lifecycle.epoch, fast.runningProcess);
    }
    // The state is unknown or a process must be (re)started: ask the agent (R-S1 slow path), about
    // the record as it is now.
    fresh();
    this.#agentBegins += 1;
    const target = await this.#ops.target(g.lifecycle.hostId, g.lifecycle.generation);
    const inventory = await this.ctx.agents.send(target, CommandIds.inventory(turnId, this.ctx.now()), { $case: 'inventory', value: { groupId } }, 'inventory', INVENTORY_TIMEOUT_MS);
    const usable = (x: (typeof inventory.containers)[number]): boolean => x.groupId === groupId && x.placementGeneration === g.lifecycle.generation && x.state !== ContainerState.REMOVING && x.state !== ContainerState.DEAD;
    if (!inventory.containers.some(usable)) {
      // The host lists no usable container of the group at its placement (its engine came back on
      // an empty data root, they were removed by hand, or only dead ones are left): the group's
      // layers are gone from it, as when a start or stop finds `group_not_found`. The running group
      // is then recovered as a whole (LOST host_lost_running, with its event and metric) rather than
      // this member alone marked LOST in a group that would stay RUNNING with nothing behind it.
      // Unless the group moved since our read (a stop, a drain): then the listing is of a placement
      // that is no longer the group's, and the begin decides again from a fresh read.
      const now = (await this.#ops.get(groupId)).value.lifecycle;
      if (now.hostId !== g.lifecycle.hostId || now.generation !== g.lifecycle.generation || now.state !== g.lifecycle.state) throw new CasConflictError(this.ctx.groups.bucket, Keys.group(groupId), gv.revision);
      await this.#ops.containersGone(g);
    }
    const c = inventory.containers.find((x) => x.groupId === groupId && x.memberId === memberId && x.placementGeneration === g.lifecycle.generation);
    const present = c !== undefined && usable(c);
    const running: ProcessIdentity | undefined = c !== undefined && c.state === ContainerState.RUNNING ? { containerId: c.containerId, incarnation: String(c.startedAtUnixMs) } : undefined;
    // The turn processes this driver could reuse: for RunTurn, the member's idle ones in that very
    // container run started with the same command; for a runner's own begin, none.
    const turnProcesses = fleet?.commandDigest === undefined || running === undefined || c === undefined ? [] : inventory.turnProcesses
      .filter((t) => t.groupId === groupId && t.memberId === memberId && t.containerId === c.containerId && t.containerStartedAtUnixMs === c.startedAtUnixMs && !t.attached && t.commandDigest === fleet.commandDigest)
      .map((t) => turnProcessIn(running, t.processId));
    const observation: MemberObservation = { containerPresent: present, layerIntact: present && (c?.writableLayerPresent ?? false), runningProcess: running, turnProcesses };
    return this.#applyBegin(gv, false, memberId, { turnId, locator, fleetDriven, driver: fleet?.driver }, observation, call, target.epoch, running);
  }

  /**
   * Decide with core and write the member change AND the call's answer in one compare-and-set on
   * the revision the decision was made from (so the observation still belongs to the member as it
   * was read; any change since is a CasConflictError and the caller observes again).
   */
  async #applyBegin(gv: Versioned<GroupRecord>, cached: boolean, memberId: string, request: { turnId: string; locator: Locator | undefined; fleetDriven: boolean; driver?: FleetTurn['driver'] }, observation: MemberObservation, call: Call, hostEpoch: number, observed?: ProcessIdentity): Promise<BeginTurnView> {
    let running = observed;
    const now = this.ctx.now();
    const g = gv.value;
    if (g.lifecycle.state !== 'RUNNING') throw new CasConflictError(this.ctx.groups.bucket, Keys.group(g.groupId), gv.revision);
    const fresh = (): void => {
      if (cached) throw new NeedsFreshRead();
    };
    const seen = g.members.find((m) => m.session.memberId === memberId)!;
    const o = beginTurn(seen.session, { turnId: request.turnId, locator: request.locator, fleetDriven: request.fleetDriven }, observation, now);
    // The driver of a turn this begin creates; a replayed begin echoes the one that created it.
    const driver = o.ok && !o.replayed && request.driver !== undefined
      ? { turnId: request.turnId, token: request.driver.token, replicaId: this.ctx.replicaId.slice(0, 64), leaseUntilMs: now + request.driver.leaseMs }
      : seen.turnDriver?.turnId === request.turnId ? seen.turnDriver : undefined;
    const cli = seen.session.cli;
    let slotReclaimed = false;
    if (o.ok && o.reclaimProcess !== undefined) {
      // R-S6: end the lingering process before the record says a new one may start. Only a fresh
      // observation can name it (heartbeat evidence proves LIVE only), so this is never a cached decision.
      fresh();
      running = await this.#reclaimSlot(g, memberId, o.reclaimProcess, hostEpoch, request.turnId);
      slotReclaimed = true;
    }
    const view = (member: MemberRecord): BeginTurnView | undefined => (!o.ok ? undefined : {
      turnId: request.turnId,
      contextState: o.contextState,
      locator: o.effectiveLocator,
      hostId: g.lifecycle.hostId,
      hostEpoch,
      generation: g.lifecycle.generation,
      containerId: member.containerId ?? '',
      startedAtMs: o.member.inFlight?.startedAtMs ?? now,
      ...(slotReclaimed ? { slotReclaimed } : {}),
      ...(driver !== undefined ? { driverToken: driver.token } : {}),
    });
    if (o.ok && o.replayed) {
      fresh();
      return view(seen)!;
    }
    if (!o.ok && !isFinalRefusal(o.error)) {
      // A transient refusal (no container yet): nothing to remember, nothing changed.
      fresh();
      throw o.error;
    }
    const contextState: ContextState = o.ok ? o.contextState : o.contextState ?? seen.lastContextState ?? 'NEW';
    const changed: MemberRecord = {
      ...seen,
      session: o.member,
      ...(o.ok ? { lastContextState: contextState, turnProcess: running, containerId: running?.containerId ?? seen.containerId, turnDriver: driver } : o.contextState === 'LOST' ? { lastContextState: 'LOST' as const } : {}),
    };
    const answer = view(changed);
    const outcome = answer !== undefined ? valueOutcome(answer) : refusalOutcome((o as { error: FleetError<Reason> }).error);
    // Refused because another turn is in flight: stored beside that turn's answer, never over it
    // (its retry with its own key must still get the turn).
    const slot = !o.ok && o.error.reason === 'turn_in_flight' ? 'refusedInFlight' : 'answer';
    const written: GroupRecord = {
      ...g,
      members: g.members.map((x) => (x.session.memberId !== memberId ? x : { ...changed, calls: recordTurnCall(seen.calls, 'begin', call.key, call.request, outcome, slot) })),
      updatedAtMs: now,
    };
    await this.#write(g, written, gv.revision);
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
    this.ctx.metrics.turns.inc({ context_state: o.contextState, cli });
    return answer!;
  }

  /**
   * R-S6 slot reclaim: restart the member's container (SIGTERM, grace, SIGKILL, start) so no process
   * of the lingering incarnation survives; the writable layer, and with it the native session, stays.
   * The agent restarts only while that incarnation runs, so a retried begin converges; the command
   * id also names the turn, so a failure the agent cached is not replayed to every later turn. A
   * failed or refused restart is UNAVAILABLE to the runner (retry), never INTERNAL.
   */
  async #reclaimSlot(g: GroupRecord, memberId: string, lingeringRun: ProcessIdentity, hostEpoch: number, turnId: string): Promise<ProcessIdentity> {
    const lingering = containerRunOf(lingeringRun);
    const startedAtUnixMs = Number(lingering.incarnation);
    if (!Number.isSafeInteger(startedAtUnixMs)) throw new Unavailable('host_unreachable', `member ${memberId}: cannot name the process to reclaim`, { details: { groupId: g.groupId, memberId } });
    const target = await this.#ops.target(g.lifecycle.hostId, g.lifecycle.generation);
    const graceMs = this.ctx.config.stopGraceMs;
    let result: { containerId: string; startedAtUnixMs: number; restarted: boolean };
    try {
      result = await this.ctx.agents.send(
        target,
        CommandIds.reclaim(g.groupId, memberId, lingering.incarnation, turnId),
        { $case: 'restartMember', value: { groupId: g.groupId, memberId, containerId: lingering.containerId, startedAtUnixMs, graceMs } },
        'restartMember',
        INVENTORY_TIMEOUT_MS + graceMs,
      );
    } catch (err) {
      if (!(err instanceof AgentCommandFailed)) throw err;
      this.ctx.metrics.slotReclaims.inc({ outcome: 'failed' });
      throw new Unavailable('host_unreachable', `reclaiming member ${memberId}'s slot failed (${err.reason}); retry`, { details: { groupId: g.groupId, memberId, agentReason: err.reason } });
    }
    this.ctx.metrics.slotReclaims.inc({ outcome: result.restarted ? 'restarted' : 'already_gone' });
    // Not running any more (a stop got in first): no turn starts on it; the retry sees the stop.
    if (result.startedAtUnixMs === 0) throw new Unavailable('container_missing', `member ${memberId} is not running; retry`, { details: { groupId: g.groupId, memberId } });
    await this.ctx.events.record({
      subjectKind: 'group',
      subjectId: g.groupId,
      type: 'member_slot_reclaimed',
      reason: 'exit_unconfirmed',
      version: `${memberId}:${lingering.containerId}:${lingering.incarnation}`,
      detail: { memberId, hostId: g.lifecycle.hostId, hostEpoch, containerId: result.containerId, restarted: result.restarted },
    });
    return { containerId: result.containerId, incarnation: String(result.startedAtUnixMs) };
  }

  // ---- CompleteTurn ------------------------------------------------------------------------------

  /**
   * RunTurn's driver: the turn is still in flight under `token`: extend its lease to `leaseMs` from
   * now (CAS). False when it is not (completed, taken over by a repeat, never ours): stop driving.
   */
  async renewTurnDriver(groupId: string, memberId: string, turnId: string, token: string, leaseMs: number): Promise<boolean> {
    for (let attempt = 0; ; attempt++) {
      try {
        const { gv, cached } = await this.#load(groupId, attempt === 0);
        const g = gv.value;
        const m = g.members.find((x) => x.session.memberId === memberId);
        const ours = m !== undefined && m.session.phase === 'IN_TURN' && m.session.inFlight?.turnId === turnId && m.turnDriver?.turnId === turnId && m.turnDriver.token === token;
        if (!ours) {
          if (cached) throw new NeedsFreshRead();
          return false;
        }
        const leaseUntilMs = this.ctx.now() + leaseMs;
        // Nothing but the lease changes: not the group's activity, not its update time.
        const written: GroupRecord = { ...g, members: g.members.map((x) => (x !== m ? x : { ...m, turnDriver: { ...m.turnDriver!, leaseUntilMs } })) };
        await this.#write(g, written, gv.revision);
        return true;
      } catch (err) {
        this.#groups.drop(groupId);
        if (err instanceof NeedsFreshRead) continue;
        if (!(err instanceof CasConflictError) || attempt >= CAS_ATTEMPTS) throw err;
      }
    }
  }

  /**
   * `fleet.process`: the turn process RunTurn started for this turn (NEW or RESTORED), which may be
   * reused LIVE next if the evidence keeps it; taken only inside the container run the turn began in.
   * `fleet.takeOverFrom`: see FleetCompletion.
   */
  async completeTurn(input: CompleteTurnInput, fleet?: FleetCompletion): Promise<CompleteTurnView> {
    const groupId = must(parseGroupId(input.groupId));
    const memberId = must(parseMemberId(input.memberId));
    const turnId = must(parseTurnId(input.turnId));
    if (input.observedLocator !== undefined && typeof input.observedLocator === 'string' && input.observedLocator.length > 1024) {
      throw new InvalidArgument('value_too_long', 'observedLocator too long', { details: { field: 'observedLocator' } });
    }
    const end = turnEndFromEvidence(input.evidence);
    const key = validateIdempotencyKey(input.idempotencyKey);
    const call: Call = { key: keyDigest('complete', key), request: requestHash({ groupId, memberId, turnId, observed: input.observedLocator ?? null, end }) };
    let view: CompleteTurnView;
    for (let attempt = 0; ; attempt++) {
      try {
        view = await this.#complete(groupId, memberId, turnId, input.observedLocator, end, input.evidence, call, attempt === 0, fleet);
        break;
      } catch (err) {
        this.#groups.drop(groupId);
        if (err instanceof NeedsFreshRead) continue;
        if (!(err instanceof CasConflictError) || attempt >= CAS_ATTEMPTS) throw hostFailure(err);
      }
    }
    if (input.protectInBackground === true) return this.#protectAfterAnswer(groupId, memberId, turnId, view);
    return this.#protectAfterTurn(groupId, memberId, turnId, view);
  }

  /** Background protections still running (tests, shutdown). */
  async whenBackgroundIdle(): Promise<void> {
    while (this.#background.size > 0) await Promise.allSettled([...this.#background.values()].map((b) => b.done));
  }

  /**
   * idleStopAfter 0 with protectInBackground: the answer goes now and the group is stopped and
   * checkpointed after it, by the same steps as #protectAfterTurn (compare-and-set: a next turn that
   * begins first wins and the stop is not taken). Until then the group counts as unprotected (the
   * protection gauges); if this process dies first, the idle queue takes the group over once the
   * completing call's hand-off time has passed, as for a synchronous completion that failed.
   */
  async #protectAfterAnswer(groupId: string, memberId: string, turnId: string, view: CompleteTurnView): Promise<CompleteTurnView> {
    const g = this.#groups.get(groupId)?.value ?? (await this.#ops.get(groupId)).value;
    if (isTerminal(g) || (g.idleStopAfterMs ?? this.ctx.config.idleStopAfterMs) !== 0) return view;
    const running = this.#background.get(groupId);
    if (running !== undefined) {
      running.again = true;
      return { ...view, protectionPending: true };
    }
    const entry = { again: false, done: Promise.resolve() };
    entry.done = (async () => {
      try {
        do {
          entry.again = false;
          await this.#protectAfterTurn(groupId, memberId, turnId, view);
        } while (entry.again);
      } catch (err) {
        this.ctx.logger.warn({ groupId, memberId, turnId, err }, 'protecting a group after its completion answered failed; the idle queue retries');
      } finally {
        this.#background.delete(groupId);
      }
    })();
    this.#background.set(groupId, entry);
    return { ...view, protectionPending: true };
  }

  /**
   * idleStopAfter 0 (R-G6): the answer comes only once the group is stopped cleanly with a checkpoint
   * of its state (idle-stop.ts protectAfterTurn), so a runner holding the answer holds a protected
   * conversation; a repeat of the call gets there too (a no-op once protected). A stop or checkpoint
   * that fails does not fail the turn, whose end is stored: the answer stands, the metric and a
   * `turn_end_unprotected` event say the group is not protected yet, and the idle queue retries.
   * Protected: the member's process is gone, so the next turn is RESTORED, never LIVE.
   */
  async #protectAfterTurn(groupId: string, memberId: string, turnId: string, view: CompleteTurnView): Promise<CompleteTurnView> {
    const g = this.#groups.get(groupId)?.value ?? (await this.#ops.get(groupId)).value;
    if (isTerminal(g) || (g.idleStopAfterMs ?? this.ctx.config.idleStopAfterMs) !== 0) return view;
    const t0 = this.ctx.now();
    const p = await protectAfterTurn(this.ctx, this.#ops, groupId);
    if (p.acted) this.#groups.drop(groupId);
    if (p.protected) {
      if (p.acted) this.ctx.metrics.idleStops.inc({ result: 'stopped' });
      return { ...view, groupProtected: true, ...(view.nextContextState === 'LIVE' ? { nextContextState: 'RESTORED' as const } : {}) };
    }
    // A turn that began meanwhile (this member's next, another member's) saves the group at its own
    // end; an evacuation is the controller's: nothing to report for those.
    if (p.why === 'turn_in_flight' || p.why === 'activity_since_turn' || p.why === 'evacuating' || p.why === 'terminal') {
      if (p.acted || p.why !== 'evacuating') this.ctx.metrics.idleStops.inc({ result: 'lost_race' });
      return view;
    }
    this.ctx.metrics.idleStops.inc({ result: p.why === 'stopped_unclean' ? 'unclean' : 'failed' });
    this.ctx.logger.warn({ groupId, memberId, turnId, why: p.why, error: p.error, ms: this.ctx.now() - t0 }, 'turn completed, but its group is not protected yet (idle_stop_after 0); the idle queue retries');
    await this.ctx.events.record({
      subjectKind: 'group', subjectId: groupId, type: 'turn_end_unprotected', reason: p.why, version: `${memberId}:${turnId}:after_turn`,
      detail: { memberId, turnId, ...(p.error !== undefined ? { error: p.error } : {}) },
    }).catch((err: unknown) => this.ctx.logger.warn({ groupId, err }, 'recording turn_end_unprotected failed'));
    return view;
  }

  async #complete(groupId: string, memberId: string, turnId: string, observedLocator: string | undefined, end: TurnEnd, evidence: TurnEvidenceInput, call: Call, useCache: boolean, fleet: FleetCompletion | undefined): Promise<CompleteTurnView> {
    const started = fleet?.process;
    const { gv, cached } = await this.#load(groupId, useCache);
    const fresh = (): void => {
      if (cached) throw new NeedsFreshRead();
    };
    const current = gv.value;
    const m = current.members.find((x) => x.session.memberId === memberId);
    if (m === undefined) fresh();
    if (m === undefined) throw new NotFound('member_not_found', `member ${memberId} not in group ${groupId}`, { details: { groupId, memberId } });
    const prior = findTurnCall(m.calls, 'complete', call.key, call.request);
    if (prior !== undefined) {
      if ('refusal' in prior) throw prior.refusal;
      return replayOutcome<CompleteTurnView>(prior.outcome);
    }
    const before = m.session;
    // A turn process the fleet started counts only inside the container run the turn began in.
    const run = m.turnProcess;
    const process = started !== undefined && isTurnProcess(started) && run !== undefined && started.containerId === run.containerId && containerRunOf(started).incarnation === containerRunOf(run).incarnation ? started : run;
    const o = completeTurn(m.session, { turnId, observedLocator, end, process });
    // A LOST (or DESTROYED) group took its turns with it: say so, with the group's reason, rather
    // than "no such turn" (a repeat of a turn completed before the loss is still answered below).
    if (isTerminal(current) && !(o.ok && o.duplicate)) {
      fresh();
      throw groupLostRefusal(current, memberId);
    }
    if (!o.ok) fresh();
    if (!o.ok) throw o.error;
    if (fleet?.takeOverFrom !== undefined && !o.duplicate) {
      // Only a driver that is still this turn's and whose lease lapsed is taken over; decided on
      // the record this completion writes over (a renewal since is a CAS conflict: decided again).
      fresh();
      const d = m.turnDriver;
      if (d === undefined || d.turnId !== turnId || d.token !== fleet.takeOverFrom || this.ctx.now() <= d.leaseUntilMs + DRIVER_LEASE_SKEW_MS) {
        throw new IdentityRefused('turn_in_flight', `turn ${turnId} still has its driver`, { details: { memberId, turnId } });
      }
    }
    const view: CompleteTurnView = {
      outcome: o.outcome,
      sessionKept: o.member.phase === 'RETAINED',
      savedLocator: o.member.savedLocator,
      nextContextState: nextContextState(o.member),
    };
    // The same turn completed under another key: core answers it (from a fresh read) — a refused end
    // is refused again; nothing to write.
    if (o.duplicate) {
      fresh();
      if (o.refusal !== undefined) throw o.refusal;
      return view;
    }
    const now = this.ctx.now();
    // Every completion is a group turn_completed (R-G4: older checkpoints become stale).
    const lc = transitionGroup(current.lifecycle, { type: 'turn_completed' }, now);
    const outcome = o.refusal !== undefined ? refusalOutcome(o.refusal) : valueOutcome(view);
    // Not a duplicate, so this very turn was in flight (core checked it).
    const inFlight = before.inFlight!;
    const record = turnEvidenceRecord(current, turnId, inFlight, observedLocator, evidence, o.outcome, o.refusal, now);
    const budget = turnEvidenceBudget(current.members.length);
    const written: GroupRecord = {
      ...current,
      lifecycle: lc.ok ? lc.value : current.lifecycle,
      lastTurnCompletedAtMs: now,
      members: current.members.map((x) => (x.session.memberId !== memberId ? x : {
        ...x,
        session: o.member,
        turnProcess: undefined,
        turnDriver: undefined,
        calls: recordTurnCall(x.calls, 'complete', call.key, call.request, outcome),
        turns: appendTurnEvidence(x.turns, record, budget),
      })),
      updatedAtMs: now,
    };
    await this.#write(current, written, gv.revision);
    if (o.outcome === 'locator_mismatch') this.ctx.metrics.locatorMismatches.inc({ phase: 'end' });
    if (before.phase !== o.member.phase && (o.member.phase === 'UNCONFIRMED' || o.outcome === 'locator_mismatch')) {
      await this.ctx.events.record({ subjectKind: 'group', subjectId: groupId, type: 'turn_end_refused', reason: o.outcome, version: `${memberId}:${turnId}`, detail: { memberId, turnId } });
    }
    if (o.refusal !== undefined) throw o.refusal;
    return view;
  }

  // ---- StopGroup / GetGroupState -----------------------------------------------------------------

  async stopGroup(input: StopGroupInput): Promise<StopGroupView> {
    const groupId = must(parseGroupId(input.groupId));
    const grace = input.graceMs ?? this.ctx.config.stopGraceMs;
    if (!Number.isInteger(grace) || grace < 0 || grace > 600_000) throw new InvalidArgument('out_of_range', 'graceMs must be 0..600000', { details: { field: 'graceMs' } });
    return withIdempotency(this.ctx, 'stop', input.idempotencyKey, { groupId, grace }, async () => {
      const g = await this.#ops.stop(groupId, grace, 'runner stop').catch((err: unknown) => {
        throw hostFailure(err);
      });
      // Nothing to stop cleanly or checkpoint: a refusal that says why (not OK with no outcome).
      if (isTerminal(g)) throw groupLostRefusal(g);
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
    const conv = await this.ctx.conversations.get(Keys.conversation(conversationId));
    if (conv === undefined) throw new NotFound('group_not_found', 'no group for this conversation', { details: { field: 'conversationId' } });
    return this.#viewOf(conv.value.groupId);
  }
}
