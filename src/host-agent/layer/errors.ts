// Typed failures of moving a writable layer (R-G3, R-G5) that are not tar-rule refusals (those are
// LayerRuleError from core/layer-rules.ts). `reason` is stable and machine-readable.

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
  /** GNU tar failed to write the validated stream (disk full, permissions). */
  | 'extract_failed';

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
