// Typed failures of moving a writable layer (R-G3, R-G5) that are not tar-rule refusals (those are
// LayerRuleError from core/layer-rules.ts). `reason` is stable and machine-readable.
// restoreFailureOf() is the one place that turns any restore failure into the reason and message of
// the agent's command result: a refusal of the layer's data (wire/agent-protocol.ts LayerDataReason:
// no host can restore it, the control plane ends the group at once) or a failure of this host
// (store unreachable, disk full, engine down: another host may succeed).
import { LayerRuleError, type LayerRefusalReason } from '../../core/layer-rules.ts';
import { DockerRuntimeError, type DockerErrorReason } from '../../docker/errors.ts';
import { ChunkStoreError } from '../../store/chunk-store.ts';
import type { AgentRefusalReason, LayerDataReason } from '../../wire/agent-protocol.ts';

export type LayerTransferReason =
  /** GNU tar failed to read the upper dir (missing dir, file vanished, I/O error). */
  | 'capture_failed'
  /** The upper dir uses overlay features a layer tar cannot carry (metacopy, redirect_dir). */
  | 'unsupported_overlay_feature'
  /** The bytes received do not hash to the layer digest of the manifest. */
  | 'layer_digest_mismatch'
  /** More or fewer bytes than the manifest's layer size. */
  | 'layer_size_mismatch'
  /** Restore refuses to merge into a non-empty upper dir. */
  | 'target_not_empty'
  /** GNU tar failed to write the validated stream (permissions, I/O error). */
  | 'extract_failed'
  /** GNU tar (or a write of ours) found the disk or quota full. */
  | 'disk_full'
  /** The layer worker thread died (out of memory, crash) or could not start. */
  | 'worker_failed';

export class LayerTransferError extends Error {
  override readonly name = 'LayerTransferError';
  constructor(
    readonly reason: LayerTransferReason,
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

/** The data reason of each tar-entry rule (the rule itself goes into the message). */
const DATA_REASON_OF_RULE: Readonly<Record<LayerRefusalReason, LayerDataReason>> = {
  too_many_entries: 'layer_entry_limit',
  layer_too_large: 'layer_size_limit',
  name_too_long: 'layer_name_limit',
  names_too_large: 'layer_name_limit',
  path_traversal: 'layer_path_invalid',
  absolute_path: 'layer_path_invalid',
  invalid_name: 'layer_path_invalid',
  duplicate_entry: 'layer_path_invalid',
  parent_not_directory: 'layer_path_invalid',
  link_escape: 'layer_link_escape',
  device_node: 'layer_device_node',
  forbidden_xattr: 'layer_xattr_refused',
  malformed_tar: 'layer_header_invalid',
  pax_header_too_large: 'layer_header_invalid',
  too_many_xattrs: 'layer_header_invalid',
  unsupported_entry_type: 'layer_header_invalid',
  invalid_whiteout: 'layer_header_invalid',
};

export function layerDataReasonOf(rule: LayerRefusalReason): LayerDataReason {
  return DATA_REASON_OF_RULE[rule];
}

/** A restore failure as the command result carries it. */
export type RestoreFailure =
  | { readonly layerRefusal: true; readonly reason: LayerDataReason; readonly message: string }
  | { readonly layerRefusal: false; readonly reason: AgentRefusalReason | `docker_${DockerErrorReason}`; readonly message: string };

/**
 * Classify a restore failure. Host-level reasons (the same checkpoint may restore on another
 * host): `transfer_failed` (chunk store unreachable or timing out), `disk_full`, `extract_failed`
 * (GNU tar failed otherwise), `restore_target_in_use` (the new container's upper dir is not empty),
 * `docker_<reason>` (engine: docker_engine_unavailable, docker_timeout, ...), `restore_failed`
 * (anything else, e.g. the layer worker died).
 */
export function restoreFailureOf(err: unknown): RestoreFailure {
  const message = err instanceof Error ? err.message : String(err);
  if (err instanceof LayerRuleError) {
    const at = err.entryPath !== undefined && err.entryPath !== '' ? ` (entry ${JSON.stringify(err.entryPath.slice(0, 256))})` : '';
    return { layerRefusal: true, reason: layerDataReasonOf(err.reason), message: `${err.reason}: ${message}${at}` };
  }
  if (err instanceof LayerTransferError) {
    switch (err.reason) {
      case 'layer_digest_mismatch':
      case 'layer_size_mismatch':
        return { layerRefusal: true, reason: err.reason, message };
      case 'target_not_empty':
        return { layerRefusal: false, reason: 'restore_target_in_use', message };
      case 'disk_full':
      case 'extract_failed':
        return { layerRefusal: false, reason: err.reason, message };
      default:
        return { layerRefusal: false, reason: 'restore_failed', message: `${err.reason}: ${message}` };
    }
  }
  if (err instanceof ChunkStoreError) {
    if (err.reason === 'chunk_missing' || err.reason === 'chunk_digest_mismatch') return { layerRefusal: true, reason: err.reason, message };
    if (err.reason === 'transfer_failed') return { layerRefusal: false, reason: 'transfer_failed', message };
    return { layerRefusal: false, reason: 'restore_failed', message };
  }
  if (err instanceof DockerRuntimeError) return { layerRefusal: false, reason: `docker_${err.reason}`, message };
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  if (code === 'ENOSPC' || code === 'EDQUOT') return { layerRefusal: false, reason: 'disk_full', message };
  return { layerRefusal: false, reason: 'restore_failed', message };
}

/** A layer error as plain data, to cross from a worker thread (structured clone drops classes). */
export interface SerializedLayerError {
  readonly kind: 'rule' | 'transfer' | 'store' | 'other';
  readonly reason: string;
  readonly message: string;
  readonly entryPath?: string;
  readonly code?: string;
}

export function serializeLayerError(err: unknown): SerializedLayerError {
  const message = err instanceof Error ? err.message : String(err);
  if (err instanceof LayerRuleError) return { kind: 'rule', reason: err.reason, message, ...(err.entryPath !== undefined ? { entryPath: err.entryPath } : {}) };
  if (err instanceof LayerTransferError) return { kind: 'transfer', reason: err.reason, message };
  if (err instanceof ChunkStoreError) return { kind: 'store', reason: err.reason, message };
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  return { kind: 'other', reason: '', message, ...(typeof code === 'string' ? { code } : {}) };
}

export function deserializeLayerError(e: SerializedLayerError): Error {
  switch (e.kind) {
    case 'rule':
      return new LayerRuleError(e.reason as LayerRuleError['reason'], e.message, e.entryPath);
    case 'transfer':
      return new LayerTransferError(e.reason as LayerTransferReason, e.message);
    case 'store':
      return new ChunkStoreError(e.reason as ChunkStoreError['reason'], e.message);
    default:
      return Object.assign(new Error(e.message), e.code !== undefined ? { code: e.code } : {});
  }
}
