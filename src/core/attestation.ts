// Host attestation policy (R-H1, R-H2): a host becomes READY only on an exact policy match. The
// live-bridge version is never taken from the agent's word: it must be proven by the image helper's
// `--version` output AND the image label, both present, both equal, and exactly 4.
import { everyMemberOf } from './exhaustive.ts';

/** What a host agent reports at registration (R-H1). Strings are as reported; this module judges them. */
export interface AttestationReport {
  readonly agentSha: string;
  readonly apiSha: string;
  readonly dockerVersion: string;
  readonly storageDriver: string;
  readonly imageRef: string;
  readonly imageDigest: string;
  /** What the agent claims (informational; never trusted alone). */
  readonly claimedBridgeVersion?: string | undefined;
  /** Output of the image's helper `--version`, run in a throwaway container. Undefined if it failed. */
  readonly helperVersionOutput?: string | undefined;
  /** The image label value (`http-agent-live-bridge`). Undefined if the label is missing. */
  readonly imageLabelVersion?: string | undefined;
}

export interface AttestationPolicy {
  readonly allowedAgentShas: ReadonlySet<string>;
  /** The control plane's own API/proto SHA: agents must be built against exactly this. */
  readonly apiSha: string;
  readonly allowedImageDigests: ReadonlySet<string>;
  /** Writable-layer capture relies on overlay upper dirs (overlay2; docs/measured-facts.md). */
  readonly allowedStorageDrivers: ReadonlySet<string>;
}

/** The only live-bridge version a host may run (R-H2, R-S7). */
export const REQUIRED_BRIDGE_VERSION = 4;
/** The name in the helper output and the image label: `http-agent-live-bridge=4`. */
export const BRIDGE_NAME = 'http-agent-live-bridge';

export type AttestationReason =
  | 'agent_sha_unknown'
  | 'api_sha_mismatch'
  | 'image_digest_not_allowed'
  | 'storage_driver_unsupported'
  /** The proven bridge version is not exactly REQUIRED_BRIDGE_VERSION (e.g. 3). */
  | 'bridge_version'
  /** Helper output or label missing, unparsable, or they disagree (or disagree with the claim). */
  | 'bridge_unproven';

/** Every AttestationReason, for metrics pre-created at 0. */
export const ATTESTATION_REASONS = everyMemberOf<AttestationReason>()([
  'agent_sha_unknown',
  'api_sha_mismatch',
  'image_digest_not_allowed',
  'storage_driver_unsupported',
  'bridge_version',
  'bridge_unproven',
]);

export type AttestationVerdict =
  | { readonly verdict: 'ready'; readonly bridgeVersion: number }
  | { readonly verdict: 'refused'; readonly reasons: readonly AttestationReason[]; readonly bridgeVersion?: number };

/**
 * Parse a bridge version from `http-agent-live-bridge=4` or a bare `4` (surrounding whitespace
 * allowed). Anything else, including `4.0` or `04x`, is not a version.
 */
export function parseBridgeVersion(text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  const trimmed = text.trim();
  const bare = trimmed.startsWith(`${BRIDGE_NAME}=`) ? trimmed.slice(BRIDGE_NAME.length + 1) : trimmed;
  if (!/^[0-9]{1,6}$/.test(bare)) return undefined;
  return Number(bare);
}

/** Evaluate a registration against policy. Every refusal reason found is returned (not just the first). */
export function evaluateAttestation(report: AttestationReport, policy: AttestationPolicy): AttestationVerdict {
  const reasons: AttestationReason[] = [];
  if (!policy.allowedAgentShas.has(report.agentSha)) reasons.push('agent_sha_unknown');
  if (report.apiSha !== policy.apiSha) reasons.push('api_sha_mismatch');
  if (!policy.allowedImageDigests.has(report.imageDigest)) reasons.push('image_digest_not_allowed');
  if (!policy.allowedStorageDrivers.has(report.storageDriver)) reasons.push('storage_driver_unsupported');

  const helper = parseBridgeVersion(report.helperVersionOutput);
  const label = parseBridgeVersion(report.imageLabelVersion);
  const claimed = report.claimedBridgeVersion === undefined ? undefined : parseBridgeVersion(report.claimedBridgeVersion);
  const claimContradicts = report.claimedBridgeVersion !== undefined && claimed !== helper;
  let proven: number | undefined;
  if (helper === undefined || label === undefined || helper !== label || claimContradicts) {
    reasons.push('bridge_unproven');
  } else {
    proven = helper;
    if (proven !== REQUIRED_BRIDGE_VERSION) reasons.push('bridge_version');
  }

  if (reasons.length === 0 && proven !== undefined) return { verdict: 'ready', bridgeVersion: proven };
  return proven === undefined ? { verdict: 'refused', reasons } : { verdict: 'refused', reasons, bridgeVersion: proven };
}
