// Checkpoint index and verification (R-G3, R-G4, R-G5). The agent streams layers into the chunk
// store and writes the manifest last; the control plane then indexes it (checkpoints bucket) and,
// before any restore, re-reads every chunk to prove each blob is present and its digests verify —
// a corrupted blob must never be restored from (R-R2). Also maps a stored manifest to the protobuf
// form the agent's RestoreCommand carries.
import { createHash } from 'node:crypto';
import { chunkListDigest, layerDigestKind, type CheckpointManifest as CoreManifest } from '../core/checkpoint-manifest.ts';
import type { CheckpointMemberSummary, CheckpointSummary } from '../core/index.ts';
import type { CheckpointManifest as ProtoManifest } from '../gen/sandboxfleet/v1/agent.ts';
import { ChunkStoreError, type ChunkStore } from '../store/chunk-store.ts';
import { translateReadError } from '../store/errors.ts';
import { toWireManifest } from '../wire/checkpoint-manifest.ts';
import type { CheckpointRecord } from './records.ts';

/**
 * The manifest `hostId` stored, or undefined when there is none (a checkpoint without one does not
 * exist). Read under the host the control plane commanded: no other host can write there (R-R5).
 */
export async function readManifest(chunks: ChunkStore, hostId: string, groupId: string, checkpointId: string): Promise<CoreManifest | undefined> {
  try {
    return await chunks.getManifest(hostId, groupId, checkpointId);
  } catch (err) {
    if (err instanceof ChunkStoreError && err.reason === 'manifest_missing') return undefined;
    // A manifest that does not parse is as good as none, and must never be used.
    if (err instanceof Error && err.name === 'ManifestError') return undefined;
    throw translateReadError(err, `manifest ${hostId}/${groupId}/${checkpointId}`);
  }
}

/** Build the index record of a manifest the agent wrote. */
export function recordFromManifest(manifest: CoreManifest, activityVersion: number): CheckpointRecord {
  const bridge = Number.parseInt(manifest.bridgeVersion, 10);
  return {
    checkpointId: manifest.checkpointId,
    groupId: manifest.groupId,
    placementGeneration: manifest.placementGeneration,
    activityVersion,
    sourceHostId: manifest.source.hostId,
    sourceEpoch: manifest.source.epoch,
    createdAtMs: manifest.createdAtMs,
    baseImageDigest: manifest.baseImageDigest,
    bridgeVersion: Number.isSafeInteger(bridge) && bridge >= 0 ? bridge : 0,
    members: manifest.members.map((m) => ({ memberId: m.memberId, layerDigest: m.layer.digest, sizeBytes: m.layer.size })),
    totalBytes: manifest.members.reduce((n, m) => n + m.layer.size, 0),
  };
}

/**
 * R-G4's "every blob is present and its digest verifies": read every chunk (each is checked against
 * its own digest by the store) and check the manifest's layer digest: of the whole layer's bytes
 * (schema version 1) or of its chunk list (version 2: core/checkpoint-manifest.ts layerDigestKind),
 * and the layer's size. Members are judged one by one so a LOST reason can name the corrupt one in
 * the event.
 */
export async function verifyCheckpoint(chunks: ChunkStore, record: CheckpointRecord): Promise<{ summary: CheckpointSummary; manifest?: CoreManifest }> {
  const manifest = await readManifest(chunks, record.sourceHostId, record.groupId, record.checkpointId);
  const base = {
    checkpointId: record.checkpointId,
    groupId: record.groupId,
    placementGeneration: record.placementGeneration,
    createdAtMs: record.createdAtMs,
    activityVersion: record.activityVersion,
    baseImageDigest: record.baseImageDigest,
    bridgeVersion: record.bridgeVersion,
  };
  if (manifest === undefined) {
    return { summary: { ...base, members: record.members.map((m) => ({ memberId: m.memberId, blobPresent: false, digestVerified: false })) } };
  }
  const members: CheckpointMemberSummary[] = [];
  for (const m of manifest.members) {
    const indexed = record.members.find((r) => r.memberId === m.memberId);
    let blobPresent = true;
    let digestVerified = indexed !== undefined && indexed.layerDigest === m.layer.digest;
    const ofTar = layerDigestKind(manifest.schemaVersion) === 'tar';
    if (!ofTar && chunkListDigest(m.layer.chunks) !== m.layer.digest) digestVerified = false;
    const hash = ofTar ? createHash('sha256') : undefined;
    let size = 0;
    try {
      for await (const chunk of chunks.read(m.layer.chunks)) {
        hash?.update(chunk);
        size += chunk.length;
      }
      if (size !== m.layer.size || (hash !== undefined && `sha256:${hash.digest('hex')}` !== m.layer.digest)) digestVerified = false;
    } catch (err) {
      if (!(err instanceof ChunkStoreError)) throw translateReadError(err, `chunks of ${record.groupId}/${record.checkpointId}`);
      blobPresent = err.reason !== 'chunk_missing';
      digestVerified = false;
    }
    members.push({ memberId: m.memberId, blobPresent, digestVerified });
  }
  return { summary: { ...base, members }, manifest };
}

/**
 * The protobuf manifest a RestoreCommand carries, from the stored (verified) manifest. The
 * clean-stop evidence is rebuilt from what core keeps: the stored manifest only exists for a
 * clean stop (the agent refuses to checkpoint anything else), which is what the agent re-checks.
 */
export function manifestToProto(m: CoreManifest, record: CheckpointRecord): ProtoManifest {
  const wire = toWireManifest(m, {
    baseImageRef: '',
    activityVersion: record.activityVersion,
    lastCompletedTurnId: '',
    cleanStop: {
      clean: true,
      noTurnInFlight: true,
      graceMs: 0,
      stoppedAtUnixMs: m.cleanStop.stoppedAtMs,
      members: m.cleanStop.members.map((s) => ({
        memberId: s.memberId,
        exitCode: s.exitCode,
        exitedByItself: true,
        signal: 'SIGTERM',
        withinGrace: true,
        containerPresent: true,
        writableLayerPresent: true,
        stopDurationMs: 0,
        sigtermAtUnixMs: 0,
        exitedAtUnixMs: 0,
        killed: false,
        turnInFlight: false,
      })),
    },
    sourceContainerIds: new Map(),
    entryCounts: new Map(),
  });
  return { ...wire, bridgeVersion: record.bridgeVersion };
}
