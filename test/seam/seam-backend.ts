// NAMED SEAM for the API seam tests (test/seam): a RunnerBackend built from the real core
// rules (member-session.ts beginTurn/completeTurn, group.ts transitions, clean-stop.ts) over a
// compare-and-set record store, with a simulated host in place of the control plane's agents.
// It is NOT the control plane (src/control-plane); it exists so the gRPC server can be tested
// before and independently of it. Every answer comes from the core functions, never canned:
// idempotency (first answer stored per key, concurrent repeats converge on it), deterministic turn
// ids, CAS retries, LOST on unconfirmed turns, locator refusals at begin and end.
// The record store is any CasStore: in memory (MemoryCasStore, the seam tests) or NATS KV (KvRepository).
import { createHash } from 'node:crypto';
import {
  beginTurn as coreBeginTurn,
  completeTurn as coreCompleteTurn,
  Conflict,
  createGroup,
  decideStopCleanliness,
  FleetError,
  IdentityRefused,
  InvalidArgument,
  isFleetError,
  newMemberSession,
  NoCapacity,
  NotFound,
  onContainerStopped,
  PreconditionFailed,
  transitionGroup,
  type GroupLifecycle,
  type MemberSession,
  type ProcessIdentity,
  type TurnEnd,
} from '../../src/core/index.ts';
import type {
  BeginTurnInput,
  BeginTurnView,
  CompleteTurnInput,
  CompleteTurnView,
  GroupView,
  OpenGroupInput,
  RunnerBackend,
  StopGroupInput,
  StopGroupView,
  TurnEvidenceInput,
} from '../../src/core/runner-port.ts';
import type { Locator } from '../../src/core/ids.ts';
import { StoreUnavailableError } from '../../src/store/errors.ts';

// ---------------------------------------------------------------------------------------------
// CAS record store.

export interface Versioned<T> {
  readonly value: T;
  readonly revision: number;
}

/** The subset of src/store KvRepository the seam needs; KvRepository satisfies it as is. */
export interface CasStore<T> {
  get(key: string): Promise<Versioned<T> | undefined>;
  create(key: string, value: T): Promise<number>;
  update(key: string, value: T, expectedRevision: number): Promise<number>;
}

/** In-memory CAS store with the KV semantics (create = expect absent; update = expect revision). */
export class MemoryCasStore<T> implements CasStore<T> {
  readonly #data = new Map<string, Versioned<T>>();
  #revision = 0;
  /** Test knob: throw StoreUnavailableError from every call while true. */
  down = false;
  /** Test knob: a concurrent writer bumps the next `n` updates' keys between their read and write. */
  interfereNextUpdates = 0;

  async get(key: string): Promise<Versioned<T> | undefined> {
    this.#check();
    const v = this.#data.get(key);
    return v === undefined ? undefined : { value: structuredClone(v.value), revision: v.revision };
  }

  async create(key: string, value: T): Promise<number> {
    this.#check();
    if (this.#data.has(key)) throw new Conflict('cas_conflict', `create ${key}: exists`, { details: { key } });
    this.#data.set(key, { value: structuredClone(value), revision: ++this.#revision });
    return this.#revision;
  }

  async update(key: string, value: T, expectedRevision: number): Promise<number> {
    this.#check();
    const current = this.#data.get(key);
    if (this.interfereNextUpdates > 0 && current !== undefined) {
      this.interfereNextUpdates -= 1;
      this.#data.set(key, { value: current.value, revision: ++this.#revision });
    }
    if (this.#data.get(key)?.revision !== expectedRevision) {
      throw new Conflict('cas_conflict', `update ${key}: expected revision ${expectedRevision}`, { details: { key, expectedRevision } });
    }
    this.#data.set(key, { value: structuredClone(value), revision: ++this.#revision });
    return this.#revision;
  }

  #check(): void {
    if (this.down) throw new StoreUnavailableError('memory store is down', false);
  }
}

// ---------------------------------------------------------------------------------------------
// Simulated host: containers and processes per member.

interface SimContainer {
  present: boolean;
  layerIntact: boolean;
  running: boolean;
  process?: ProcessIdentity | undefined;
}

export class SeamHost {
  readonly hostId: string;
  readonly epoch: number;
  /** Groups the host accepts; openGroup beyond it is RESOURCE_EXHAUSTED. */
  maxGroups: number;
  /** Test knob: the next begin's observation throws this (an unexpected, non-domain failure). */
  failNextObservation: Error | undefined;
  readonly #containers = new Map<string, SimContainer>();
  readonly #groups = new Set<string>();
  #incarnation = 0;

  constructor(hostId = 'seam-host-1', epoch = 1, maxGroups = 1_000_000) {
    this.hostId = hostId;
    this.epoch = epoch;
    this.maxGroups = maxGroups;
  }

  #key(groupId: string, memberId: string): string {
    return `${groupId}/${memberId}`;
  }

  createGroup(groupId: string, memberIds: readonly string[]): void {
    if (!this.#groups.has(groupId) && this.#groups.size >= this.maxGroups) {
      throw new NoCapacity('no_capacity', `host ${this.hostId} has no capacity`, { details: { hostId: this.hostId } });
    }
    this.#groups.add(groupId);
    for (const m of memberIds) if (!this.#containers.has(this.#key(groupId, m))) this.#containers.set(this.#key(groupId, m), { present: true, layerIntact: true, running: true });
  }

  containerId(groupId: string, memberId: string): string {
    return `ctr-${createHash('sha256').update(this.#key(groupId, memberId)).digest('hex').slice(0, 12)}`;
  }

  observe(groupId: string, memberId: string): { containerPresent: boolean; layerIntact: boolean; runningProcess?: ProcessIdentity; sessionFilesPresent?: boolean } {
    const failure = this.failNextObservation;
    if (failure !== undefined) {
      this.failNextObservation = undefined;
      throw failure;
    }
    const c = this.#containers.get(this.#key(groupId, memberId));
    if (c === undefined || !c.present) return { containerPresent: false, layerIntact: false };
    return { containerPresent: true, layerIntact: c.layerIntact, ...(c.running && c.process ? { runningProcess: c.process } : {}) };
  }

  startProcess(groupId: string, memberId: string): ProcessIdentity {
    const c = this.#containers.get(this.#key(groupId, memberId));
    if (c === undefined) throw new Error(`no container for ${groupId}/${memberId}`);
    c.running = true;
    c.process = { containerId: this.containerId(groupId, memberId), incarnation: String(++this.#incarnation) };
    return c.process;
  }

  runningProcess(groupId: string, memberId: string): ProcessIdentity | undefined {
    const c = this.#containers.get(this.#key(groupId, memberId));
    return c?.running ? c.process : undefined;
  }

  exitProcess(groupId: string, memberId: string): void {
    const c = this.#containers.get(this.#key(groupId, memberId));
    if (c !== undefined) c.process = undefined;
  }

  stopGroup(groupId: string, memberIds: readonly string[]): void {
    for (const m of memberIds) {
      const c = this.#containers.get(this.#key(groupId, m));
      if (c !== undefined) {
        c.running = false;
        c.process = undefined;
      }
    }
  }

  startGroup(groupId: string, memberIds: readonly string[]): void {
    for (const m of memberIds) {
      const c = this.#containers.get(this.#key(groupId, m));
      if (c !== undefined && c.present) c.running = true;
    }
  }

  /** Test knob: the container (and its writable layer) vanished. */
  removeContainer(groupId: string, memberId: string): void {
    const c = this.#containers.get(this.#key(groupId, memberId));
    if (c !== undefined) {
      c.present = false;
      c.layerIntact = false;
      c.process = undefined;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Records.

export interface SeamGroupRecord {
  readonly groupId: string;
  readonly conversationId: string;
  readonly hostId: string;
  readonly hostEpoch: number;
  readonly lifecycle: GroupLifecycle;
  readonly members: readonly MemberSession[];
  readonly lastContext: Readonly<Record<string, 'NEW' | 'LIVE' | 'RESTORED' | 'LOST'>>;
  readonly createdAtMs: number;
  readonly updatedAtMs: number;
}

export type SeamRecord =
  | { readonly kind: 'group'; readonly group: SeamGroupRecord }
  | { readonly kind: 'conversation'; readonly groupId: string }
  | {
      readonly kind: 'idempotency';
      readonly requestHash: string;
      readonly outcome: { ok: true; value: unknown } | { ok: false; errorClass: string; reason: string; message: string; details: Record<string, string | number | boolean> };
    };

const hash = (s: string): string => createHash('sha256').update(s).digest('hex').slice(0, 40);
const Keys = {
  group: (groupId: string) => `group.${hash(groupId)}`,
  conversation: (conversationId: string) => `conv.${hash(conversationId)}`,
  idempotency: (operation: string, key: string) => `idem.${operation}.${hash(key)}`,
};

function evidenceToTurnEnd(e: TurnEvidenceInput): TurnEnd {
  if (!e.nativeTurnEnded) {
    const cause = ({ disconnect: 'transport_disconnect', timeout: 'timeout', cancelled: 'cancelled', rejected: 'command_rejected' } as const)[e.kind as 'disconnect'];
    return { kind: 'not_ended', cause: cause ?? 'no_end_event' };
  }
  return {
    kind: 'ended',
    success: e.succeeded,
    cleanupFinished: e.cleanupFinished,
    // R-S5 (c): transport AND locator must still be usable.
    transportUsable: e.transportUsable && e.locatorUsable,
    processExits: e.processExited || e.kind === 'api_retry',
  };
}

function revive(o: Extract<Extract<SeamRecord, { kind: 'idempotency' }>['outcome'], { ok: false }>): FleetError {
  const opts = { details: o.details };
  const reason = o.reason as never;
  switch (o.errorClass) {
    case 'IdentityRefused':
      return new IdentityRefused(reason, o.message, opts);
    case 'PreconditionFailed':
      return new PreconditionFailed(reason, o.message, opts);
    case 'InvalidArgument':
      return new InvalidArgument(reason, o.message, opts);
    default:
      return new NotFound(reason, o.message, opts);
  }
}

export interface SeamBackendOptions {
  readonly store: CasStore<SeamRecord>;
  readonly host?: SeamHost;
  /** Internal CAS retries before a conflict escapes as ABORTED (the control plane retries too). */
  readonly casRetries?: number;
  readonly now?: () => number;
}

/** The seam RunnerBackend. */
export class SeamBackend implements RunnerBackend {
  readonly host: SeamHost;
  readonly #store: CasStore<SeamRecord>;
  /** Internal CAS retries before a conflict escapes (ABORTED); tests set 0 to exercise client retries. */
  casRetries: number;
  /** Test knob: simulated latency at the start of every call (deadline tests). */
  latencyMs = 0;
  readonly #now: () => number;
  /** Backend invocations per method (tests: "the call never started work"). */
  readonly calls = { openGroup: 0, beginTurn: 0, completeTurn: 0, stopGroup: 0, getGroupState: 0 };

  constructor(opts: SeamBackendOptions) {
    this.#store = opts.store;
    this.host = opts.host ?? new SeamHost();
    this.casRetries = opts.casRetries ?? 8;
    this.#now = opts.now ?? Date.now;
  }

  async openGroup(input: OpenGroupInput): Promise<{ group: GroupView; created: boolean }> {
    this.calls.openGroup += 1;
    return this.#idempotent('open', input.idempotencyKey, input, async () => {
      const conv = await this.#store.get(Keys.conversation(input.conversationId));
      const wanted = input.members.map((m) => `${m.memberId}:${m.cli}`).sort().join(',');
      const existingId = conv?.value.kind === 'conversation' ? conv.value.groupId : undefined;
      if (existingId !== undefined) return this.#reopen(existingId, wanted);
      const groupId = `g-${hash(`${input.conversationId}`).slice(0, 20)}`;
      const now = this.#now();
      this.host.createGroup(groupId, input.members.map((m) => m.memberId));
      const started = transitionGroup(createGroup(this.host.hostId, now), { type: 'started' }, now);
      if (!started.ok) throw started.error;
      const record: SeamGroupRecord = {
        groupId,
        conversationId: input.conversationId,
        hostId: this.host.hostId,
        hostEpoch: this.host.epoch,
        lifecycle: started.value,
        members: input.members.map((m) => newMemberSession(m.memberId, m.cli)),
        lastContext: {},
        createdAtMs: now,
        updatedAtMs: now,
      };
      try {
        await this.#store.create(Keys.group(groupId), { kind: 'group', group: record });
        await this.#store.create(Keys.conversation(input.conversationId), { kind: 'conversation', groupId });
      } catch (error) {
        // A concurrent open of the same conversation won: answer with its group.
        if (error instanceof Conflict) return this.#reopen(groupId, wanted);
        throw error;
      }
      return { group: this.#view(record, 1), created: true };
    });
  }

  async #reopen(groupId: string, wanted: string): Promise<{ group: GroupView; created: boolean }> {
    const { record, revision } = await this.#readGroup(groupId);
    const have = record.members.map((m) => `${m.memberId}:${m.cli}`).sort().join(',');
    if (have !== wanted) throw new InvalidArgument('member_set_mismatch', 'members differ from the existing group', { details: { field: 'members', groupId } });
    return { group: this.#view(record, revision), created: false };
  }

  async beginTurn(input: BeginTurnInput): Promise<BeginTurnView> {
    this.calls.beginTurn += 1;
    // Deterministic: concurrent repeats of one begin compute the same turn id, so the core sees a replay.
    const turnId = `t-${hash(`${input.groupId}/${input.memberId}/${input.idempotencyKey}`).slice(0, 24)}`;
    return this.#idempotent('begin', input.idempotencyKey, input, () =>
      this.#mutateGroup(input.groupId, (record) => {
        const now = this.#now();
        let lifecycle = record.lifecycle;
        let members = record.members;
        if (lifecycle.state === 'STOPPED') {
          // Resume on the same host (R-G2: clean or unclean).
          const resumed = transitionGroup(lifecycle, { type: 'started' }, now);
          if (!resumed.ok) throw resumed.error;
          lifecycle = resumed.value;
          this.host.startGroup(record.groupId, members.map((m) => m.memberId));
        } else if (lifecycle.state !== 'RUNNING') {
          throw new PreconditionFailed('invalid_transition', `group is ${lifecycle.state}`, { details: { groupId: record.groupId, state: lifecycle.state } });
        }
        const member = members.find((m) => m.memberId === input.memberId);
        if (member === undefined) throw new NotFound('member_not_found', `no member ${input.memberId}`, { details: { groupId: record.groupId, memberId: input.memberId } });
        const observation = this.host.observe(record.groupId, member.memberId);
        const outcome = coreBeginTurn(member, { turnId, locator: input.locator as Locator | undefined }, observation, now);
        members = members.map((m) => (m.memberId === member.memberId ? outcome.member : m));
        const lastContext = { ...record.lastContext };
        if (!outcome.ok) {
          if (outcome.contextState === 'LOST') lastContext[member.memberId] = 'LOST';
          return { next: { ...record, lifecycle, members, lastContext, updatedAtMs: now }, error: outcome.error };
        }
        lastContext[member.memberId] = outcome.contextState;
        if (outcome.reclaimProcess !== undefined) this.host.exitProcess(record.groupId, member.memberId);
        if (outcome.startProcess && !outcome.replayed) this.host.startProcess(record.groupId, member.memberId);
        const inFlight = outcome.member.inFlight;
        const view: BeginTurnView = {
          turnId,
          contextState: outcome.contextState,
          locator: outcome.effectiveLocator,
          hostId: record.hostId,
          hostEpoch: record.hostEpoch,
          generation: lifecycle.generation,
          containerId: this.host.containerId(record.groupId, member.memberId),
          startedAtMs: inFlight?.startedAtMs ?? now,
        };
        return { next: { ...record, lifecycle, members, lastContext, updatedAtMs: now }, value: view };
      }),
    );
  }

  async completeTurn(input: CompleteTurnInput): Promise<CompleteTurnView> {
    this.calls.completeTurn += 1;
    return this.#idempotent('complete', input.idempotencyKey, input, () =>
      this.#mutateGroup(input.groupId, (record) => {
        const now = this.#now();
        const member = record.members.find((m) => m.memberId === input.memberId);
        if (member === undefined) throw new NotFound('member_not_found', `no member ${input.memberId}`, { details: { groupId: record.groupId, memberId: input.memberId } });
        const end = evidenceToTurnEnd(input.evidence);
        const outcome = coreCompleteTurn(member, {
          turnId: input.turnId,
          observedLocator: input.observedLocator,
          end,
          process: this.host.runningProcess(record.groupId, member.memberId),
        });
        if (!outcome.ok) throw outcome.error;
        if (outcome.duplicate) return { next: undefined, value: this.#completeView(outcome.member, outcome.outcome) };
        if (end.kind === 'ended' && end.processExits) this.host.exitProcess(record.groupId, member.memberId);
        const members = record.members.map((m) => (m.memberId === member.memberId ? outcome.member : m));
        const touched = transitionGroup(record.lifecycle, { type: 'turn_completed' }, now);
        const lifecycle = touched.ok ? touched.value : record.lifecycle;
        const next = { ...record, lifecycle, members, updatedAtMs: now };
        if (outcome.refusal !== undefined) return { next, error: outcome.refusal };
        return { next, value: this.#completeView(outcome.member, outcome.outcome) };
      }),
    );
  }

  #completeView(member: MemberSession, outcome: CompleteTurnView['outcome']): CompleteTurnView {
    const kept = outcome === 'completed' || outcome === 'failed_kept';
    const next = member.phase === 'FRESH' ? 'NEW' : member.phase === 'RETAINED' ? (member.process !== undefined ? 'LIVE' : 'RESTORED') : 'LOST';
    return { outcome, sessionKept: kept, savedLocator: member.savedLocator, nextContextState: next };
  }

  async stopGroup(input: StopGroupInput): Promise<StopGroupView> {
    this.calls.stopGroup += 1;
    return this.#idempotent('stop', input.idempotencyKey, input, async () => {
      const group = await this.#mutateGroup(input.groupId, (record) => {
        const now = this.#now();
        const requested = transitionGroup(record.lifecycle, { type: 'stop_requested' }, now);
        if (!requested.ok) throw requested.error;
        const graceMs = input.graceMs ?? 10_000;
        // The simulated processes exit by themselves right after SIGTERM, with status 0.
        const verdict = decideStopCleanliness({
          graceMs,
          memberIds: record.members.map((m) => m.memberId),
          members: record.members.map((m) => ({
            memberId: m.memberId,
            turnInFlight: m.phase === 'IN_TURN',
            sigtermAtMs: now,
            exitedAtMs: now,
            exitCode: 0,
            killed: false,
            containerExists: this.host.observe(record.groupId, m.memberId).containerPresent,
            writableLayerExists: this.host.observe(record.groupId, m.memberId).layerIntact,
          })),
        });
        const stopped = transitionGroup(requested.value, { type: 'stopped', verdict }, now);
        if (!stopped.ok) throw stopped.error;
        this.host.stopGroup(record.groupId, record.members.map((m) => m.memberId));
        const next = { ...record, lifecycle: stopped.value, members: record.members.map(onContainerStopped), updatedAtMs: now };
        return { next, value: undefined };
      });
      void group;
      const { record, revision } = await this.#readGroup(input.groupId);
      return { group: this.#view(record, revision) };
    });
  }

  async getGroupState(query: { groupId?: string | undefined; conversationId?: string | undefined }): Promise<GroupView> {
    this.calls.getGroupState += 1;
    let groupId = query.groupId;
    if (groupId === undefined && query.conversationId !== undefined) {
      const conv = await this.#store.get(Keys.conversation(query.conversationId));
      if (conv?.value.kind !== 'conversation') throw new NotFound('group_not_found', 'no group for this conversation', { details: { conversationId: query.conversationId } });
      groupId = conv.value.groupId;
    }
    if (groupId === undefined) throw new InvalidArgument('malformed', 'groupId or conversationId required', { details: { field: 'group_id' } });
    const { record, revision } = await this.#readGroup(groupId);
    return this.#view(record, revision);
  }

  async #readGroup(groupId: string): Promise<{ record: SeamGroupRecord; revision: number }> {
    const got = await this.#store.get(Keys.group(groupId));
    if (got?.value.kind !== 'group') throw new NotFound('group_not_found', `no group ${groupId}`, { details: { groupId } });
    return { record: got.value.group, revision: got.revision };
  }

  /**
   * Read-modify-write with CAS. `change` returns the record to write (or undefined: nothing to
   * write) and either a value or a refusal; a refusal is thrown only after its record is written
   * (a refusal can make a member LOST, and that must stick).
   */
  async #mutateGroup<T>(groupId: string, change: (r: SeamGroupRecord) => { next: SeamGroupRecord | undefined; value?: T; error?: FleetError }): Promise<T> {
    for (let attempt = 0; ; attempt++) {
      const { record, revision } = await this.#readGroup(groupId);
      const result = change(record);
      try {
        if (result.next !== undefined) await this.#store.update(Keys.group(groupId), { kind: 'group', group: result.next }, revision);
      } catch (error) {
        if (error instanceof Conflict && attempt < this.casRetries) continue;
        throw error;
      }
      if (result.error !== undefined) throw result.error;
      return result.value as T;
    }
  }

  async #idempotent<T>(operation: string, key: string, request: unknown, run: () => Promise<T>): Promise<T> {
    if (this.latencyMs > 0) await new Promise((resolve) => setTimeout(resolve, this.latencyMs));
    const k = Keys.idempotency(operation, key);
    const requestHash = hash(JSON.stringify(request));
    const replay = (rec: SeamRecord | undefined): T => {
      if (rec?.kind !== 'idempotency') throw new Error('idempotency record missing');
      if (rec.requestHash !== requestHash) {
        throw new InvalidArgument('idempotency_key_reused', `idempotency key already used for a different ${operation} request`, { details: { field: 'idempotency_key' } });
      }
      if (rec.outcome.ok) return rec.outcome.value as T;
      throw revive(rec.outcome);
    };
    const existing = await this.#store.get(k);
    if (existing !== undefined) return replay(existing.value);
    let outcome: Extract<SeamRecord, { kind: 'idempotency' }>['outcome'];
    let value: T | undefined;
    let thrown: unknown;
    try {
      value = await run();
      outcome = { ok: true, value: JSON.parse(JSON.stringify(value)) };
    } catch (error) {
      // Only final refusals are remembered; transient ones (ABORTED, UNAVAILABLE) may succeed on retry.
      const final = isFleetError(error) && (error.status === 'FAILED_PRECONDITION' || error.status === 'INVALID_ARGUMENT' || error.status === 'NOT_FOUND');
      if (!final) throw error;
      thrown = error;
      const details: Record<string, string | number | boolean> = {};
      for (const [dk, dv] of Object.entries(error.details)) if (dv !== undefined) details[dk] = dv;
      outcome = { ok: false, errorClass: error.constructor.name, reason: error.reason, message: error.message, details };
    }
    try {
      await this.#store.create(k, { kind: 'idempotency', requestHash, outcome });
    } catch (error) {
      if (error instanceof Conflict) return replay((await this.#store.get(k))?.value);
      throw error;
    }
    if (thrown !== undefined) throw thrown;
    return value as T;
  }

  #view(r: SeamGroupRecord, revision: number): GroupView {
    const stop = r.lifecycle.stop;
    return {
      groupId: r.groupId,
      conversationId: r.conversationId,
      state: r.lifecycle.state,
      hostId: r.hostId,
      hostEpoch: r.hostEpoch,
      generation: r.lifecycle.generation,
      stopClean: stop === undefined ? undefined : stop.clean,
      lostReason: r.lifecycle.lostReason,
      members: r.members.map((m) => ({
        memberId: m.memberId,
        cli: m.cli,
        phase: m.phase,
        savedLocator: m.savedLocator,
        containerId: this.host.containerId(r.groupId, m.memberId),
        turnInFlightId: m.inFlight?.turnId,
        completedTurns: m.completedTurns,
        lastContextState: r.lastContext[m.memberId],
        lostReason: m.lostReason,
      })),
      createdAtMs: r.createdAtMs,
      updatedAtMs: r.updatedAtMs,
      lastActivityAtMs: r.lifecycle.lastActivityAtMs,
      activityVersion: r.lifecycle.activityVersion,
      revision,
    };
  }
}
