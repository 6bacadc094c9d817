// The AdminService handlers over the control plane's operator façade (R-I1, R-I7, R-H7): validate
// and bound every request field (R-R4), call ControlPlane.admin, map the answer to protobuf.
// Authorization (admin role only), deadlines, logging, metrics and error mapping are added by
// admin-service.ts around these functions. Mutating calls carry idempotency keys (R-I1): migrate
// and destroy store their first answer, drain and remove are idempotent by nature.
import {
  InvalidArgument,
  parseGroupId,
  parseHostId,
  type Result,
} from '../core/index.ts';
import type { ControlPlane } from '../control-plane/control-plane.ts';
import { hostStateToProto, type AdminEvent, type CheckpointDetail, type GroupStateName, type GroupTurnsDetail, type HostDetail, type HostStateName } from '../control-plane/admin-ops.ts';
import { manifestToProto } from '../control-plane/checkpoints.ts';
import { withIdempotency } from '../control-plane/idempotency.ts';
import { Host, TurnRecord, type CheckpointInfo, type GroupTurns } from '../gen/sandboxfleet/v1/admin.ts';
import { GroupState, HostState, TurnEndKind, type Event } from '../gen/sandboxfleet/v1/common.ts';
import type { TurnEndKindName } from '../core/runner-port.ts';
import { decodeTurnFlags, type TurnEvidenceRecord } from '../control-plane/records.ts';
import type { AdminHandlers } from './admin-service.ts';
import { contextToProto, groupToProto, parseIdempotencyKey } from './mapping.ts';

/** List bounds (admin.proto): page_size defaults to 100, at most 1000. */
export const DEFAULT_PAGE_SIZE = 100;
export const MAX_PAGE_SIZE = 1000;
const MAX_REASON = 256;
const EVENT_KIND = /^[a-z][a-z0-9_-]{0,31}$/;

function must<T>(r: Result<T, InvalidArgument>): T {
  if (!r.ok) throw r.error;
  return r.value;
}

function invalid(field: string, message: string): InvalidArgument {
  return new InvalidArgument('malformed', message, { details: { field } });
}

/** One page of `items` from an opaque token (a base64url offset) and a bounded size. */
export function page<T>(items: readonly T[], pageSize: number, token: string): { items: T[]; next: string } {
  const size = pageSize === 0 ? DEFAULT_PAGE_SIZE : pageSize;
  if (!Number.isInteger(size) || size < 1 || size > MAX_PAGE_SIZE) {
    throw new InvalidArgument('out_of_range', `page_size must be 0..${MAX_PAGE_SIZE}`, { details: { field: 'page_size', max: MAX_PAGE_SIZE } });
  }
  let offset = 0;
  if (token !== '') {
    const m = token.length <= 32 ? /^o(\d{1,9})$/.exec(Buffer.from(token, 'base64url').toString('utf8')) : null;
    if (m === null) throw invalid('page_token', 'page_token is not one this server issued');
    offset = Number(m[1]);
  }
  const slice = items.slice(offset, offset + size);
  const end = offset + slice.length;
  return { items: slice, next: end < items.length ? Buffer.from(`o${end}`).toString('base64url') : '' };
}

const HOST_STATE_FROM_PROTO = new Map<HostState, HostStateName>([
  [HostState.REGISTERING, 'REGISTERING'], [HostState.READY, 'READY'], [HostState.UNATTESTED, 'UNATTESTED'], [HostState.SUSPECT, 'SUSPECT'],
  [HostState.DEAD, 'DEAD'], [HostState.DRAINING, 'DRAINING'], [HostState.REMOVED, 'REMOVED'],
]);
const GROUP_STATE_FROM_PROTO = new Map<GroupState, GroupStateName>([
  [GroupState.PENDING, 'PENDING'], [GroupState.RUNNING, 'RUNNING'], [GroupState.STOPPING, 'STOPPING'], [GroupState.STOPPED, 'STOPPED'],
  [GroupState.MIGRATING, 'MIGRATING'], [GroupState.LOST, 'LOST'], [GroupState.DESTROYED, 'DESTROYED'],
]);

function enumFilter<E, D>(table: Map<E, D>, value: E, unspecified: E, field: string): D | undefined {
  if (value === unspecified) return undefined;
  const d = table.get(value);
  if (d === undefined) throw new InvalidArgument('out_of_range', `${field} is not a known state`, { details: { field } });
  return d;
}

function optionalText(raw: string, field: string, max: number): string {
  if (raw.length > max) throw new InvalidArgument('value_too_long', `${field} exceeds ${max} characters`, { details: { field, maxLength: max } });
  return raw;
}

export function hostToProto(d: HostDetail): Host {
  const r = d.record;
  const lc = r.lifecycle;
  const reason = lc.state === 'UNATTESTED' ? (lc.refusals ?? []).join(',') : lc.goingAway ?? '';
  return Host.fromPartial({
    hostId: r.hostId,
    state: hostStateToProto(lc.state),
    stateReason: reason,
    hostEpoch: lc.epoch,
    leaseExpiresAtUnixMs: r.leaseExpiresAtMs ?? 0,
    registeredAtUnixMs: r.registeredAtMs,
    lastHeartbeatAtUnixMs: d.heartbeat?.receivedAtMs ?? 0,
    lastHeartbeatSequence: d.heartbeat?.sequence ?? 0,
    attestation: {
      agentBuildSha: r.attestation.agentSha,
      apiSha: r.attestation.apiSha,
      engineVersion: r.attestation.dockerVersion,
      storageDriver: r.attestation.storageDriver,
      imageRef: r.attestation.imageRef,
      imageDigest: r.attestation.imageDigest,
      bridge: {
        helperVersion: r.attestation.bridgeVersion === undefined ? '' : String(r.attestation.bridgeVersion),
        labelVersion: r.attestation.bridgeVersion === undefined ? '' : String(r.attestation.bridgeVersion),
        agree: r.attestation.bridgeVersion !== undefined,
      },
      measuredAtUnixMs: r.registeredAtMs,
    },
    attested: lc.state !== 'UNATTESTED' && lc.state !== 'REGISTERING' && (lc.refusals ?? []).length === 0,
    refusalReasons: [...(lc.refusals ?? [])],
    attestationMismatches: [...r.attestation.mismatches],
    capacity: { maxMembers: r.maxMembers, usedMembers: d.heartbeat?.usedMembers ?? 0 },
    groupCount: d.groupCount,
    revision: d.revision,
    removalSource: lc.goingAway ?? '',
  });
}

export function checkpointToProto(c: CheckpointDetail): CheckpointInfo {
  const r = c.record;
  const manifest = c.manifest !== undefined
    ? manifestToProto(c.manifest, r)
    : {
      // The index record without its manifest (deleted or unreadable): what the index knows.
      schemaVersion: 0, checkpointId: r.checkpointId, groupId: r.groupId, placementGeneration: r.placementGeneration,
      sourceHostId: r.sourceHostId, sourceHostEpoch: r.sourceEpoch, createdAtUnixMs: r.createdAtMs, members: [],
      baseImageDigest: r.baseImageDigest, baseImageRef: '', bridgeVersion: r.bridgeVersion, activityVersion: r.activityVersion, lastCompletedTurnId: '',
    };
  return {
    manifest,
    totalBytes: r.totalBytes,
    latest: c.latest,
    unusableReason: c.manifest === undefined ? 'checkpoint_corrupt' : c.unusableReason,
  };
}

const END_KIND_TO_PROTO: Readonly<Record<TurnEndKindName, TurnEndKind>> = {
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

export function turnToProto(t: TurnEvidenceRecord): TurnRecord {
  return TurnRecord.fromPartial({
    turnId: t.turnId,
    contextState: contextToProto(t.contextState),
    placementGeneration: t.generation,
    beganAtUnixMs: t.beganAtMs,
    completedAtUnixMs: t.beganAtMs + t.durationMs,
    endKind: END_KIND_TO_PROTO[t.kind],
    ...decodeTurnFlags(t.flags),
    exitCode: t.exitCode,
    observedLocator: t.observedLocator ?? '',
    nativeTurnId: t.nativeTurnId ?? '',
    inputBytes: t.inputBytes,
    outputBytes: t.outputBytes,
    outcome: t.outcome,
    refusal: t.refusal ?? '',
  });
}

export function groupTurnsToProto(d: GroupTurnsDetail): GroupTurns {
  return { members: d.members.map((m) => ({ memberId: m.memberId, turns: m.turns.map(turnToProto) })) };
}

export function eventToProto(e: AdminEvent): Event {
  const detail: Record<string, string> = {};
  for (const [k, v] of Object.entries(e.event.detail ?? {}).slice(0, 32)) {
    detail[k] = (typeof v === 'string' ? v : JSON.stringify(v) ?? '').slice(0, 512);
  }
  return {
    seq: e.seq,
    timeUnixMs: e.event.timeMs,
    actor: e.event.actor,
    subjectKind: e.event.subjectKind,
    subjectId: e.event.subjectId,
    type: e.event.type,
    fromState: e.event.fromState ?? '',
    toState: e.event.toState ?? '',
    reason: e.event.reason ?? '',
    detail,
  };
}

/** The AdminService handlers bound to one control plane. */
export function createAdminHandlers(plane: Pick<ControlPlane, 'admin' | 'ctx'>): AdminHandlers {
  const admin = plane.admin;
  return {
    async listHosts(req) {
      const state = enumFilter(HOST_STATE_FROM_PROTO, req.state, HostState.UNSPECIFIED, 'state');
      const { items, next } = page(await admin.listHosts(state), req.pageSize, req.pageToken);
      return { hosts: items.map(hostToProto), nextPageToken: next };
    },
    async getHost(req) {
      return { host: hostToProto(await admin.getHost(must(parseHostId(req.hostId, 'host_id')))) };
    },
    async drainHost(req) {
      parseIdempotencyKey(req.idempotencyKey);
      const reason = optionalText(req.reason, 'reason', MAX_REASON);
      return { host: hostToProto(await admin.drainHost(must(parseHostId(req.hostId, 'host_id')), 'operator_drain', reason)) };
    },
    async removeHost(req) {
      parseIdempotencyKey(req.idempotencyKey);
      const reason = optionalText(req.reason, 'reason', MAX_REASON);
      return { host: hostToProto(await admin.removeHost(must(parseHostId(req.hostId, 'host_id')), req.force, reason)) };
    },
    async listGroups(req) {
      const state = enumFilter(GROUP_STATE_FROM_PROTO, req.state, GroupState.UNSPECIFIED, 'state');
      const hostId = req.hostId === '' ? undefined : must(parseHostId(req.hostId, 'host_id'));
      const { items, next } = page(await admin.listGroups({ hostId, state }), req.pageSize, req.pageToken);
      return { groups: items.map(groupToProto), nextPageToken: next };
    },
    async getGroup(req) {
      const groupId = must(parseGroupId(req.groupId, 'group_id'));
      if (req.includeTurns !== true) return { group: groupToProto(await admin.getGroup(groupId)) };
      const detail = await admin.getGroupTurns(groupId);
      return { group: groupToProto(detail.group), turns: groupTurnsToProto(detail) };
    },
    async migrateGroup(req, ctx) {
      const key = parseIdempotencyKey(req.idempotencyKey);
      const groupId = must(parseGroupId(req.groupId, 'group_id'));
      const target = req.targetHostId === '' ? undefined : must(parseHostId(req.targetHostId, 'target_host_id'));
      const out = await withIdempotency(plane.ctx, 'admin_migrate', key, { groupId, target: target ?? '' }, () => admin.migrateGroup(groupId, target, ctx.signal));
      return { group: groupToProto(out.group), checkpointId: out.checkpointId, targetHostId: out.targetHostId, durationMs: out.durationMs };
    },
    async destroyGroup(req) {
      const key = parseIdempotencyKey(req.idempotencyKey);
      const groupId = must(parseGroupId(req.groupId, 'group_id'));
      const group = await withIdempotency(plane.ctx, 'admin_destroy', key, { groupId }, () => admin.destroyGroup(groupId));
      return { group: groupToProto(group) };
    },
    async listCheckpoints(req) {
      const groupId = req.groupId === '' ? undefined : must(parseGroupId(req.groupId, 'group_id'));
      // Page the index first: each listed checkpoint reads its manifest.
      const all = await admin.listCheckpoints(groupId);
      const { items, next } = page(all, req.pageSize, req.pageToken);
      return { checkpoints: items.map(checkpointToProto), nextPageToken: next };
    },
    async verify(req) {
      if (req.hostIds.length > MAX_PAGE_SIZE) throw new InvalidArgument('too_many_entries', `at most ${MAX_PAGE_SIZE} host_ids`, { details: { field: 'host_ids' } });
      const hostIds = req.hostIds.map((h, i) => must(parseHostId(h, `host_ids[${i}]`)));
      if (!Number.isSafeInteger(req.probeTimeoutMs) || req.probeTimeoutMs < 0 || req.probeTimeoutMs > 60_000) {
        throw new InvalidArgument('out_of_range', 'probe_timeout_ms must be 0..60000', { details: { field: 'probe_timeout_ms' } });
      }
      return admin.verify(hostIds, req.probeTimeoutMs);
    },
    listEvents(req, ctx) {
      if (req.subjectKind !== '' && !EVENT_KIND.test(req.subjectKind)) throw invalid('subject_kind', 'subject_kind must be a lowercase word of at most 32 characters');
      optionalText(req.subjectId, 'subject_id', 256);
      if (!Number.isSafeInteger(req.fromSeq) || req.fromSeq < 0) throw invalid('from_seq', 'from_seq must be a non-negative integer');
      if (req.limit > 100_000) throw new InvalidArgument('out_of_range', 'limit must be 0..100000', { details: { field: 'limit' } });
      const events = admin.events({
        fromSeq: req.fromSeq,
        follow: req.follow,
        subjectKind: req.subjectKind === '' ? undefined : req.subjectKind,
        subjectId: req.subjectId === '' ? undefined : req.subjectId,
        limit: req.limit,
        signal: ctx.signal,
      });
      return (async function* () {
        for await (const e of events) yield { event: eventToProto(e) };
      })();
    },
  };
}
