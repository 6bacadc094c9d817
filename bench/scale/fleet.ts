// The simulated fleet of bench/scale, shared by its processes: host and group ids, which host holds
// which group (group i on host i mod hosts), the records planted directly into the store, the
// inventory a host's heartbeat reports, and the control-plane configuration (the shipped defaults,
// plus the attestation policy that admits the simulated hosts).
//
// Records are what a fleet that has lived looks like, not minimal ones: every group is STOPPED after
// a clean stop with one member that has completed turns, its last BeginTurn/CompleteTurn answers and
// older key digests (turn idempotency state kept in the record), the evidence of its clean stop,
// and a latest checkpoint with its index record — except on the victim hosts. The victim hosts'
// groups were stopped UNCLEANLY (their member killed) and have no checkpoint, so when such a host is
// declared DEAD each becomes LOST `unclean_stop`: an observable decision per group that needs no
// containers. Unclean, not clean without a checkpoint: idle-stop takes a checkpoint of every clean
// stop that lacks one, and the simulated hosts never answer, so 300 such groups were retried against
// them all through the steady window (with backoff) — work a steady fleet does not have.
import type { CheckpointRecord, GroupRecord } from '../../src/control-plane/records.ts';
import type { Product } from './product.ts';

/** Agent build SHA the simulated hosts attest (admitted by the policy below). */
export const BENCH_AGENT_SHA = 'b0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9';
/** Sandbox image digest the simulated hosts attest (admitted by the policy below). */
export const BENCH_IMAGE_DIGEST = `sha256:${'5ca1e'.repeat(12)}abcd`;

export const hostId = (h: number): string => `sim-${String(h).padStart(4, '0')}`;
export const groupId = (i: number): string => `g${String(i).padStart(6, '0')}`;
export const hostOfGroup = (i: number, hosts: number): number => i % hosts;
/** The hosts whose heartbeats stop, one after another (each declared DEAD): the last three. */
export const victimHosts = (hosts: number): number[] => [hosts - 3, hosts - 2, hosts - 1].filter((h) => h >= 0);
const isVictim = (h: number, hosts: number): boolean => h >= hosts - 3;

/** A stable 32-hex digest for planted idempotency fields (the schema wants hex digests). */
function hex(seed: string, n = 32): string {
  let h1 = 0x811c9dc5;
  let out = '';
  for (let round = 0; out.length < n; round++) {
    for (let i = 0; i < seed.length; i++) h1 = Math.imul(h1 ^ seed.charCodeAt(i) ^ round, 0x01000193) >>> 0;
    out += h1.toString(16).padStart(8, '0');
  }
  return out.slice(0, n);
}

export const checkpointIdOf = (i: number): string => `ck-${groupId(i)}-g1-a3`;

/** The planted group record of group `i` (STOPPED clean on its host). */
export function groupRecord(i: number, hosts: number, nowMs: number): GroupRecord {
  const id = groupId(i);
  const h = hostOfGroup(i, hosts);
  const withCheckpoint = !isVictim(h, hosts);
  const turnId = `turn-${hex(`${id}-t3`, 24)}`;
  const container = hex(`${id}-c`, 64);
  const answer = (kind: string) => ({ ok: true as const, value: { turnId, contextState: 'LIVE', hostId: hostId(h), containerId: container, kind, locator: `sess-${hex(id, 16)}` } });
  const member = {
    session: { memberId: 'm1', cli: 'claude_code', phase: 'RETAINED', savedLocator: `sess-${hex(id, 16)}`, completedTurns: 3, lastTurn: { turnId, outcome: 'completed' } },
    containerId: container,
    lastContextState: 'LIVE',
    calls: {
      begin: { key: hex(`${id}-kb`), request: hex(`${id}-rb`), outcome: answer('begin') },
      complete: { key: hex(`${id}-kc`), request: hex(`${id}-rc`), outcome: answer('complete') },
      older: Array.from({ length: 4 }, (_, k) => hex(`${id}-o${k}`)),
    },
  } as unknown as GroupRecord['members'][number];
  return {
    groupId: id,
    conversationId: `conv-${id}`,
    lifecycle: {
      state: 'STOPPED', hostId: hostId(h), generation: 1, activityVersion: 3, lastActivityAtMs: nowMs - 60_000,
      stop: withCheckpoint ? { clean: true } : { clean: false, findings: [{ memberId: 'm1', reason: 'killed' }] },
    } as GroupRecord['lifecycle'],
    members: [member],
    ...(withCheckpoint ? { latestCheckpointId: checkpointIdOf(i) } : {}),
    starts: 1,
    stops: 1,
    ...(withCheckpoint ? { lastCleanStop: { stoppedAtMs: nowMs - 30_000, graceMs: 10_000, members: [{ memberId: 'm1', exitCode: 0, sigtermAtMs: nowMs - 30_200, exitedAtMs: nowMs - 30_000, stopDurationMs: 200 }] } } : {}),
    lastTurnCompletedAtMs: nowMs - 60_000,
    createdAtMs: nowMs - 3_600_000,
    updatedAtMs: nowMs - 30_000,
  };
}

/** The checkpoint index record of group `i`, or undefined for the victim hosts' groups. */
export function checkpointRecord(i: number, hosts: number, nowMs: number): CheckpointRecord | undefined {
  const h = hostOfGroup(i, hosts);
  if (isVictim(h, hosts)) return undefined;
  return {
    checkpointId: checkpointIdOf(i),
    groupId: groupId(i),
    placementGeneration: 1,
    activityVersion: 3,
    sourceHostId: hostId(h),
    sourceEpoch: 1,
    // Fresh: no refresh is due during the run (refreshes would send commands to simulated hosts).
    createdAtMs: nowMs - 20_000,
    baseImageDigest: BENCH_IMAGE_DIGEST,
    bridgeVersion: 4,
    members: [{ memberId: 'm1', layerDigest: `sha256:${hex(`${groupId(i)}-layer`, 64)}`, sizeBytes: 12_582_912 }],
    totalBytes: 12_582_912,
  };
}

/**
 * What a real agent reports for host `h` (src/host-agent/host-health.ts: every member container of
 * the engine, stopped ones included): one exited container with its layer per group it holds.
 */
export function inventoryOf(p: Product, h: number, hosts: number, groups: number, nowMs: number): ReturnType<typeof p.proto.Inventory.fromPartial> {
  const containers = [];
  for (let i = h; i < groups; i += hosts) {
    const id = groupId(i);
    containers.push({
      containerId: hex(`${id}-c`, 64), name: `sf-${id}-m1`, groupId: id, memberId: 'm1', placementGeneration: 1,
      state: p.proto.ContainerState.EXITED, exitCode: 0, writableLayerPresent: true, imageDigest: BENCH_IMAGE_DIGEST,
      startedAtUnixMs: nowMs - 3_000_000, finishedAtUnixMs: nowMs - 30_000, oomKilled: false,
    });
  }
  return p.proto.Inventory.fromPartial({ containers, takenAtUnixMs: nowMs });
}

export interface LivenessSettings {
  readonly heartbeatIntervalMs: number;
  readonly heartbeatTtlMs: number;
  readonly deadGraceMs: number;
}

/** The shipped liveness defaults (src/config/control-plane.ts), read from the product's schema. */
export function shippedLiveness(p: Product): LivenessSettings {
  const d = p.config.ControlPlaneConfigSchema.parse({});
  return { heartbeatIntervalMs: d.heartbeatIntervalMs, heartbeatTtlMs: d.heartbeatTtlMs, deadGraceMs: d.deadGraceMs };
}

/** Shipped defaults, the attestation policy that admits the simulated hosts, `liveness`, and any `overrides`. */
export function controlPlaneConfig(p: Product, liveness: LivenessSettings, overrides: Record<string, unknown> = {}): ReturnType<typeof p.config.ControlPlaneConfigSchema.parse> {
  return p.config.ControlPlaneConfigSchema.parse({ allowedAgentShas: [BENCH_AGENT_SHA], allowedImageDigests: [BENCH_IMAGE_DIGEST], ...liveness, ...overrides });
}
