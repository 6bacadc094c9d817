// The checkpoint manifest in its two forms (R-G3): the strict JSON record core validates and the
// chunk store keeps (src/core/checkpoint-manifest.ts — what makes a checkpoint exist), and the
// protobuf CheckpointManifest the agent reports and the control plane sends back in a restore.
// The mapping is lossless for every field core keeps, so a restore can compare the manifest it
// was sent against the stored one byte for byte (after validation).
import {
  CHECKPOINT_MANIFEST_SCHEMA_VERSION,
  ManifestError,
  validateCheckpointManifest,
  type CheckpointManifest as CoreManifest,
  type ChunkRef,
} from '../core/checkpoint-manifest.ts';
import type { CheckpointManifest, CleanStopEvidence, LayerChunk } from '../gen/sandboxfleet/v1/agent.ts';
import { cliKindFromName, cliKindName } from './cli-kind.ts';

export const OCI_LAYER_MEDIA_TYPE = 'application/vnd.oci.image.layer.v1.tar';

/** Facts the wire form carries that core's record does not. */
export interface WireExtras {
  readonly baseImageRef: string;
  readonly activityVersion: number;
  readonly lastCompletedTurnId: string;
  /** The clean-stop evidence as the control plane sent it (kept verbatim for the audit trail). */
  readonly cleanStop: CleanStopEvidence;
  readonly sourceContainerIds: ReadonlyMap<string, string>;
  /** Tar entries per member, when known (0 = not recorded). */
  readonly entryCounts: ReadonlyMap<string, number>;
}

function chunksWithOffsets(chunks: readonly ChunkRef[]): LayerChunk[] {
  let offset = 0;
  return chunks.map((c) => {
    const chunk = { digest: c.digest, sizeBytes: c.size, offset };
    offset += c.size;
    return chunk;
  });
}

export function toWireManifest(m: CoreManifest, extras: WireExtras): CheckpointManifest {
  return {
    schemaVersion: m.schemaVersion,
    checkpointId: m.checkpointId,
    groupId: m.groupId,
    placementGeneration: m.placementGeneration,
    sourceHostId: m.source.hostId,
    sourceHostEpoch: m.source.epoch,
    createdAtUnixMs: m.createdAtMs,
    cleanStop: extras.cleanStop,
    members: m.members.map((mm) => ({
      memberId: mm.memberId,
      kind: cliKindFromName(mm.cliKind),
      savedLocator: mm.savedLocator ?? '',
      nativeSessionPaths: [...mm.nativeSessionPaths],
      layer: {
        digest: mm.layer.digest,
        sizeBytes: mm.layer.size,
        chunks: chunksWithOffsets(mm.layer.chunks),
        mediaType: OCI_LAYER_MEDIA_TYPE,
        entryCount: extras.entryCounts.get(mm.memberId) ?? 0,
      },
      sourceContainerId: extras.sourceContainerIds.get(mm.memberId) ?? '',
    })),
    baseImageDigest: m.baseImageDigest,
    baseImageRef: extras.baseImageRef,
    bridgeVersion: Number(m.bridgeVersion),
    activityVersion: extras.activityVersion,
    lastCompletedTurnId: extras.lastCompletedTurnId,
  };
}

/** The clean-stop part core keeps: only exits within the grace qualify (validated by core). */
export function coreCleanStop(cs: CleanStopEvidence, stateRevision: number): CoreManifest['cleanStop'] {
  return {
    stoppedAtMs: cs.stoppedAtUnixMs,
    lastTurnCompletedAtMs: null,
    stateRevision,
    members: cs.members.map((e) => ({ memberId: e.memberId, exitCode: e.exitCode ?? Number.NaN, exitedWithinGrace: (e.withinGrace && e.exitedByItself) as true })),
  };
}

/** Wire → core, strictly validated (ManifestError with a reason on anything malformed, R-R4). */
export function fromWireManifest(w: CheckpointManifest): CoreManifest {
  if (w.cleanStop === undefined) throw new ManifestError('manifest_invalid', 'manifest.cleanStop: missing');
  for (const mm of w.members) {
    let offset = 0;
    for (const c of mm.layer?.chunks ?? []) {
      if (c.offset !== offset) throw new ManifestError('manifest_invalid', `member ${mm.memberId}: chunk offsets are not contiguous`);
      offset += c.sizeBytes;
    }
  }
  const value = {
    schemaVersion: w.schemaVersion,
    checkpointId: w.checkpointId,
    groupId: w.groupId,
    placementGeneration: w.placementGeneration,
    source: { hostId: w.sourceHostId, epoch: w.sourceHostEpoch },
    createdAtMs: w.createdAtUnixMs,
    cleanStop: coreCleanStop(w.cleanStop, w.activityVersion),
    members: w.members.map((mm) => ({
      memberId: mm.memberId,
      cliKind: cliKindName(mm.kind) ?? '',
      savedLocator: mm.savedLocator === '' ? null : mm.savedLocator,
      nativeSessionPaths: mm.nativeSessionPaths,
      layer: { digest: mm.layer?.digest ?? '', size: mm.layer?.sizeBytes ?? 0, chunks: (mm.layer?.chunks ?? []).map((c) => ({ digest: c.digest, size: c.sizeBytes })) },
    })),
    baseImageDigest: w.baseImageDigest,
    bridgeVersion: String(w.bridgeVersion),
  };
  return validateCheckpointManifest(value);
}

export { CHECKPOINT_MANIFEST_SCHEMA_VERSION };
