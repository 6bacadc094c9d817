// What the control plane keeps in NATS KV, as zod schemas (R-R4: every record is validated and
// bounded on write and on read). The domain values (HostLifecycle, GroupLifecycle, MemberSession)
// come from src/core and change only through core's transition functions; these schemas only say
// how they are stored. One record per host and one per group, so every decision about a host or a
// group is a single compare-and-set on a single key (R-R2, R-R3).
import { z } from 'zod';
import {
  ATTESTATION_REASONS,
  CLI_KINDS,
  CONTEXT_STATES,
  GROUP_STATES,
  HOST_STATES,
  IDENTITY_REASONS,
  LOSS_REASONS,
  MEMBER_LOSS_REASONS,
  MEMBER_PHASES,
  REMOVAL_SOURCES,
  TURN_OUTCOMES,
  UNCLEAN_REASONS,
  UNCONFIRMED_CAUSES,
  type GroupLifecycle,
  type HostLifecycle,
  type MemberSession,
} from '../core/index.ts';
import { TURN_END_KIND_NAMES } from '../core/runner-port.ts';
import { IDLE_STOP_MAX_MS } from '../core/idle-stop.ts';

const id = z.string().min(1).max(256);
const ms = z.number().int().nonnegative();
const reasonText = z.string().min(1).max(128);

// ---- hosts -----------------------------------------------------------------------------------

// Every enum below is core's exhaustive list of its union (a member missing from a list does not
// compile there), so a stored form can never drift from the domain type it stores.
const removalSource = z.enum(REMOVAL_SOURCES);

const attestationReason = z.enum(ATTESTATION_REASONS);

export const HostLifecycleSchema = z.object({
  state: z.enum(HOST_STATES),
  epoch: z.number().int().nonnegative(),
  refusals: z.array(attestationReason).max(16).optional(),
  goingAway: removalSource.optional(),
}) as unknown as z.ZodType<HostLifecycle>;
// (casts: core types use readonly arrays and branded strings; these schemas check their stored form.)

/** What the host attested at its last registration (R-H1), as reported, plus the proven bridge. */
export const HostAttestationSchema = z.object({
  agentSha: z.string().max(128),
  apiSha: z.string().max(128),
  dockerVersion: z.string().max(64),
  storageDriver: z.string().max(64),
  imageRef: z.string().max(512),
  imageDigest: z.string().max(128),
  /** Set only when both the helper output and the label proved it (R-H2). */
  bridgeVersion: z.number().int().nonnegative().optional(),
  mismatches: z.array(z.string().max(512)).max(16),
});

export const HostRecordSchema = z.object({
  hostId: id,
  lifecycle: HostLifecycleSchema,
  attestation: HostAttestationSchema,
  agentInstanceId: z.string().max(128),
  registeredAtMs: ms,
  /** Term end (R-H4); absent = no term. Renewed on accepted heartbeats within the epoch's lease policy (hosts.ts), never past a fixed term. */
  leaseExpiresAtMs: ms.optional(),
  maxMembers: z.number().int().nonnegative(),
  updatedAtMs: ms,
});
export type HostRecord = z.infer<typeof HostRecordSchema>;

const containerInfo = z.object({
  containerId: z.string().max(128),
  groupId: z.string().max(256),
  memberId: z.string().max(128),
  generation: z.number().int().nonnegative(),
  running: z.boolean(),
  writableLayerPresent: z.boolean(),
  startedAtMs: ms,
});
export type ContainerSnapshot = z.infer<typeof containerInfo>;

/** The latest accepted heartbeat of a host (R-H3); `receivedAtMs` is the control plane's clock. */
export const HeartbeatRecordSchema = z.object({
  hostId: id,
  epoch: z.number().int().nonnegative(),
  sequence: z.number().int().nonnegative(),
  receivedAtMs: ms,
  usedMembers: z.number().int().nonnegative(),
  maxMembers: z.number().int().nonnegative(),
  containers: z.array(containerInfo).max(2048),
});
export type HeartbeatRecord = z.infer<typeof HeartbeatRecordSchema>;

// ---- groups ----------------------------------------------------------------------------------

const uncleanReason = z.enum(UNCLEAN_REASONS);
const stopVerdict = z.union([
  z.object({ clean: z.literal(true) }),
  z.object({ clean: z.literal(false), findings: z.array(z.object({ memberId: z.string().max(128), reason: uncleanReason })).max(256) }),
]);

export const LossReasonSchema = z.enum(LOSS_REASONS);

export const GroupLifecycleSchema = z.object({
  state: z.enum(GROUP_STATES),
  hostId: id,
  generation: z.number().int().nonnegative(),
  activityVersion: z.number().int().nonnegative(),
  lastActivityAtMs: ms,
  /** Set while RUNNING/STOPPING: when the containers last started (the unprotected exposure's start). */
  runningSinceMs: ms.optional(),
  stop: stopVerdict.optional(),
  migration: z.object({ targetHostId: id, checkpointId: id }).optional(),
  lostReason: LossReasonSchema.optional(),
}) as unknown as z.ZodType<GroupLifecycle>;

const cliKind = z.enum(CLI_KINDS);
const processIdentity = z.object({ containerId: z.string().max(128), incarnation: z.string().max(128) });
const locator = z.string().min(1).max(256);
const turnOutcome = z.enum(TURN_OUTCOMES);

export const MemberSessionSchema = z.object({
  memberId: z.string().min(1).max(64),
  cli: cliKind,
  phase: z.enum(MEMBER_PHASES),
  savedLocator: locator.optional(),
  completedTurns: z.number().int().nonnegative(),
  process: processIdentity.optional(),
  reclaim: processIdentity.optional(),
  inFlight: z.object({
    turnId: z.string().max(128),
    contextState: z.enum(CONTEXT_STATES).exclude(['LOST']),
    locator: locator.optional(),
    process: processIdentity.optional(),
    startedAtMs: ms,
  }).optional(),
  lastTurn: z.object({ turnId: z.string().max(128), outcome: turnOutcome }).optional(),
  unconfirmedCause: z.enum(UNCONFIRMED_CAUSES).optional(),
  lostReason: z.enum(MEMBER_LOSS_REASONS).optional(),
}) as unknown as z.ZodType<MemberSession>;

/** The answer of a mutating runner call: its value, or a final refusal rebuilt on replay (R-I1). */
export const CallOutcomeSchema = z.union([
  z.object({ ok: z.literal(true), value: z.unknown() }),
  z.object({ ok: z.literal(false), errorClass: z.string().max(64), reason: reasonText, message: z.string().max(1024), details: z.record(z.string().max(64), z.union([z.string().max(512), z.number(), z.boolean()])).optional() }),
]);
export type CallOutcome = z.infer<typeof CallOutcomeSchema>;

const digest = z.string().regex(/^[0-9a-f]{16,64}$/);

/**
 * A member's last BeginTurn or CompleteTurn answer, written in the SAME compare-and-set as the
 * member change it reports (R-I1 without a second fsynced write): `key` and `request` are digests
 * of the idempotency key and of the request.
 */
export const TurnCallSchema = z.object({ key: digest, request: digest, outcome: CallOutcomeSchema });
export type TurnCall = z.infer<typeof TurnCallSchema>;

/** Per-member turn idempotency: the last answer per call kind, and fingerprints of older keys. */
export const TurnCallsSchema = z.object({
  begin: TurnCallSchema.optional(),
  complete: TurnCallSchema.optional(),
  /**
   * The last BeginTurn refused because another turn was in flight (`turn_in_flight`): kept apart
   * from `begin`, so the refusal never displaces the answer of the turn in flight (whose retry with
   * its own key must still get its turn), and a repeat of the refused call is refused the same way.
   */
  refusedInFlight: TurnCallSchema.optional(),
  /** Keys of earlier begin/complete calls whose answers are no longer kept (newest last). */
  older: z.array(digest).max(32),
});
export type TurnCalls = z.infer<typeof TurnCallsSchema>;

/** Most turn ends kept per member (newest last). */
export const TURN_EVIDENCE_MAX = 8;
/**
 * Bytes of JSON all members' turn evidence may take in one group record (split evenly, so a
 * member's list holds fewer than TURN_EVIDENCE_MAX entries only in a big group with long values):
 * the group record is bounded (64 KiB) and also carries sessions and idempotency answers.
 */
export const TURN_EVIDENCE_BYTES_PER_GROUP = 20 * 1024;

/**
 * The turn-end evidence's booleans as one letter each, in this order, present when true (a stored
 * turn costs ~300 bytes instead of ~400, so a group of 8 members keeps 8 turns each).
 */
export const TURN_EVIDENCE_FLAGS = {
  nativeTurnEnded: 'e',
  succeeded: 's',
  cleanupFinished: 'c',
  transportUsable: 't',
  locatorUsable: 'l',
  processExited: 'x',
  exitConfirmed: 'k',
} as const;
export type TurnEvidenceFlag = keyof typeof TURN_EVIDENCE_FLAGS;

export function encodeTurnFlags(e: Readonly<Record<TurnEvidenceFlag, boolean>>): string {
  return (Object.keys(TURN_EVIDENCE_FLAGS) as TurnEvidenceFlag[]).filter((k) => e[k]).map((k) => TURN_EVIDENCE_FLAGS[k]).join('');
}

export function decodeTurnFlags(flags: string): Record<TurnEvidenceFlag, boolean> {
  const out = {} as Record<TurnEvidenceFlag, boolean>;
  for (const k of Object.keys(TURN_EVIDENCE_FLAGS) as TurnEvidenceFlag[]) out[k] = flags.includes(TURN_EVIDENCE_FLAGS[k]);
  return out;
}

/**
 * One turn end as recorded by CompleteTurn, in the same compare-and-set as the member change (per-
 * turn evidence, issue 13): what the runner's driver reported next to what the control plane
 * decided, for the diagnosis "compare what was sent with how the turn ended before blaming
 * persistence".
 */
export const TurnEvidenceRecordSchema = z.object({
  turnId: z.string().min(1).max(128),
  /** What BeginTurn answered. */
  contextState: z.enum(CONTEXT_STATES).exclude(['LOST']),
  /** The placement generation the turn ran on. */
  generation: z.number().int().nonnegative(),
  beganAtMs: ms,
  /** From BeginTurn to the recorded CompleteTurn. */
  durationMs: ms,
  kind: z.enum(TURN_END_KIND_NAMES),
  /** TURN_EVIDENCE_FLAGS of the evidence's booleans that were true. */
  flags: z.string().regex(/^e?s?c?t?l?x?k?$/),
  exitCode: z.number().int().optional(),
  observedLocator: z.string().min(1).max(1024).optional(),
  nativeTurnId: z.string().min(1).max(64).optional(),
  inputBytes: z.number().int().nonnegative().optional(),
  outputBytes: z.number().int().nonnegative().optional(),
  outcome: turnOutcome,
  /** The reason CompleteTurn was refused with (locator_mismatch, locator_missing, locator_invalid). */
  refusal: z.enum(IDENTITY_REASONS).optional(),
});
export type TurnEvidenceRecord = z.infer<typeof TurnEvidenceRecordSchema>;

/**
 * The member's turn evidence after recording `entry`: the newest TURN_EVIDENCE_MAX, then the oldest
 * dropped while the list's JSON is over `budgetBytes` (the newest is always kept; one entry's size is
 * bounded by its schema).
 */
export function appendTurnEvidence(turns: readonly TurnEvidenceRecord[] | undefined, entry: TurnEvidenceRecord, budgetBytes: number): TurnEvidenceRecord[] {
  const out = [...(turns ?? []), entry].slice(-TURN_EVIDENCE_MAX);
  while (out.length > 1 && Buffer.byteLength(JSON.stringify(out)) > budgetBytes) out.shift();
  return out;
}

/** A member's share of TURN_EVIDENCE_BYTES_PER_GROUP in a group of `members` members. */
export function turnEvidenceBudget(members: number): number {
  return Math.floor(TURN_EVIDENCE_BYTES_PER_GROUP / Math.max(1, members));
}

export const MemberRecordSchema = z.object({
  session: MemberSessionSchema,
  /** The member's container on the current placement (from create/start/restore results). */
  containerId: z.string().max(128).optional(),
  /** What the member's last begun turn reported (R-S1), for GetGroupState. */
  lastContextState: z.enum(CONTEXT_STATES).optional(),
  /** The container incarnation the in-flight turn runs in (its "process", see member-session.ts). */
  turnProcess: z.object({ containerId: z.string().max(128), incarnation: z.string().max(128) }).optional(),
  /**
   * RunTurn: who drives the in-flight turn `turnId` (turn-runner.ts) — the token of the call whose
   * begin created it, written in that begin's compare-and-set, and the replica running it — and
   * until when: the driver renews the lease while it runs; a repeat that finds it lapsed completes
   * the turn as not ended. Meaningful only while that turn is in flight.
   */
  turnDriver: z.object({
    turnId: z.string().max(128),
    token: z.string().min(8).max(64),
    replicaId: z.string().max(64),
    leaseUntilMs: ms,
  }).optional(),
  /** Turn call idempotency (absent in records written before it existed). */
  calls: TurnCallsSchema.optional(),
  /** The member's last turn ends, oldest first (bounded: TURN_EVIDENCE_MAX, TURN_EVIDENCE_BYTES_PER_GROUP). */
  turns: z.array(TurnEvidenceRecordSchema).max(TURN_EVIDENCE_MAX).optional(),
});
export type MemberRecord = z.infer<typeof MemberRecordSchema>;

/**
 * Controller work on a group whose host is going away (R-H4, R-H5, R-G3..R-G6). Written BEFORE the
 * controller acts (the migration intent), so a new leader resumes or rolls back from here (R-R3).
 */
export const EvacuationSchema = z.object({
  /** planned: the source host still runs (drain, remove, lease end, reclaim); unplanned: it is lost. */
  kind: z.enum(['planned', 'unplanned']),
  source: removalSource,
  sourceHostId: id,
  startedAtMs: ms,
  /** Bound on waiting for an in-flight turn (planned) and for an eligible target host. */
  deadlineMs: ms,
  /** Restore attempts so far and the hosts they went to (R-G5: retry on another host). */
  attempts: z.number().int().nonnegative(),
  triedHostIds: z.array(id).max(32),
});
export type Evacuation = z.infer<typeof EvacuationSchema>;

export const GroupRecordSchema = z.object({
  groupId: z.string().min(1).max(64),
  conversationId: z.string().min(1).max(128),
  lifecycle: GroupLifecycleSchema,
  members: z.array(MemberRecordSchema).min(1).max(16),
  latestCheckpointId: id.optional(),
  evacuation: EvacuationSchema.optional(),
  /** Counters that make agent command ids deterministic per step (a repeat gets the first answer). */
  starts: z.number().int().nonnegative(),
  stops: z.number().int().nonnegative(),
  /** Evidence of the last clean stop, copied into the checkpoint command (R-G2, R-G3). */
  lastCleanStop: z.object({
    stoppedAtMs: ms,
    graceMs: z.number().int().nonnegative(),
    members: z.array(z.object({ memberId: z.string().max(64), exitCode: z.number().int(), sigtermAtMs: ms, exitedAtMs: ms, stopDurationMs: ms })).max(16),
  }).optional(),
  /** When the last native turn completed (manifest evidence). */
  lastTurnCompletedAtMs: ms.optional(),
  /**
   * The group's own idle auto-stop (OpenGroup's idle_stop_after_ms): milliseconds without activity
   * before it is stopped cleanly and checkpointed (0: after every completed turn), or never; absent:
   * the fleet's `idleStopAfterMs`.
   */
  idleStopAfterMs: z.union([z.number().int().min(0).max(IDLE_STOP_MAX_MS), z.literal('never')]).optional(),
  /**
   * A start of the group's containers on its host is under way until this time (the start command's
   * deadline plus clock skew; group-ops.ts start). No move of the group begins before it has passed,
   * so a start and a drain never both act: the start's command is sent only once this is recorded
   * (by compare-and-set, on a group no evacuation holds), and a migration waits for it.
   */
  startingUntilMs: ms.optional(),
  /**
   * The open that placed this group was refused by its host (full, though the read model still saw
   * room): the group was DESTROYED before it held anything and never named by its conversation, and
   * the conversation's next open takes the next group id (runner-backend.ts groupIdFor).
   */
  openRefusedAtMs: ms.optional(),
  /** When the group became LOST: its layers are kept for the retention period from here (R-R6). */
  lostAtMs: ms.optional(),
  /** What made it LOST, in words (an agent's refusal message, a failed step), for operators. */
  lostDetail: z.string().max(1024).optional(),
  createdAtMs: ms,
  updatedAtMs: ms,
});
export type GroupRecord = z.infer<typeof GroupRecordSchema>;

/**
 * A group record as the read model reads it (fleet-state.ts): every field but the members'
 * turn-call idempotency state and turn evidence, which no control loop reads (the runner backend
 * reads them from the store, through GroupRecordSchema) and which are about half of a record's
 * bytes and of its validation. Left out of the schema, they are neither validated nor kept (zod
 * drops keys a schema does not name). A replica's catch-up validates 100,000s of group records at
 * once; bench/scale measured it ~10% faster this way.
 */
export const GroupReadModelSchema = GroupRecordSchema.extend({
  members: z.array(MemberRecordSchema.omit({ calls: true, turns: true })).min(1).max(16),
});

// ---- checkpoints -----------------------------------------------------------------------------

/** The control plane's index entry of a checkpoint whose manifest the agent wrote (R-G3, R-G7). */
export const CheckpointRecordSchema = z.object({
  checkpointId: id,
  groupId: id,
  placementGeneration: z.number().int().nonnegative(),
  /** The group's activityVersion when it was taken (R-G4 "nothing happened since"). */
  activityVersion: z.number().int().nonnegative(),
  sourceHostId: id,
  sourceEpoch: z.number().int().nonnegative(),
  createdAtMs: ms,
  baseImageDigest: z.string().max(128),
  bridgeVersion: z.number().int().nonnegative(),
  members: z.array(z.object({ memberId: z.string().max(64), layerDigest: z.string().max(128), sizeBytes: z.number().int().nonnegative() })).max(16),
  totalBytes: z.number().int().nonnegative(),
});
export type CheckpointRecord = z.infer<typeof CheckpointRecordSchema>;

// ---- runner-facing indexes -------------------------------------------------------------------

/** conversationId → groupId: one live group per conversation. */
export const ConversationRecordSchema = z.object({ conversationId: z.string().max(128), groupId: id, createdAtMs: ms });
export type ConversationRecord = z.infer<typeof ConversationRecordSchema>;

/** A lock of chunk-gc-locks.ts: who holds it and until when (a lock past its deadline is free). */
export const GcLockRecordSchema = z.object({ holder: z.string().max(128), deadlineMs: ms });
export type GcLockRecord = z.infer<typeof GcLockRecordSchema>;

/** The first answer to an idempotency key (R-I1): a repeat returns it; another request is refused. */
export const IdempotencyRecordSchema = z.object({
  operation: z.string().max(32),
  requestHash: z.string().max(128),
  createdAtMs: ms,
  outcome: CallOutcomeSchema,
});
export type IdempotencyRecord = z.infer<typeof IdempotencyRecordSchema>;

/** The leader lease (leadership bucket, server-side TTL). */
export const LeadershipRecordSchema = z.object({ holder: z.string().min(1).max(128), term: z.number().int().positive(), renewedAtMs: ms });
export type LeadershipRecord = z.infer<typeof LeadershipRecordSchema>;
