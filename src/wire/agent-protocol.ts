// The typed side of the agent protocol shared by the control plane and the host agent: command ids
// (deterministic per step, so a new leader repeating a step gets the agent's first answer, R-R3),
// built in one place; and the agent's refusal/failure reasons as one union, with which of them say
// "this checkpoint's data is bad" (no other host can do better: the group is LOST at once) versus
// "this host could not do it now" (another host may: retry elsewhere).

import { everyMemberOf } from '../core/exhaustive.ts';

/** Deterministic agent command ids, one builder per step. */
export const CommandIds = {
  create: (groupId: string, generation: number) => `create-${groupId}-g${generation}`,
  start: (groupId: string, generation: number, starts: number) => `start-${groupId}-g${generation}-n${starts}`,
  stop: (groupId: string, generation: number, stops: number) => `stop-${groupId}-g${generation}-n${stops}`,
  /** Undo of a start whose record write lost to a move of the group (one per start, never a stop's id). */
  undoStart: (groupId: string, generation: number, starts: number) => `undo-start-${groupId}-g${generation}-n${starts}`,
  checkpoint: (checkpointId: string) => `checkpoint-${checkpointId}`,
  restore: (checkpointId: string, targetHostId: string, generation: number) => `restore-${checkpointId}-${targetHostId}-g${generation}`,
  delete: (groupId: string, generation: number, hostId: string, reason: string) => `delete-${groupId}-g${generation}-${hostId}-${reason}`,
  /** A fresh inventory for one turn's begin (never replayed: its time is part of the id). */
  inventory: (turnId: string, nowMs: number) => `inventory-${turnId}-${nowMs}`,
  /** R-S6 slot reclaim: names the incarnation and the turn, so a cached failure is not replayed to later turns. */
  reclaim: (groupId: string, memberId: string, incarnation: string, turnId: string) => `reclaim-${groupId}-${memberId}-${incarnation}-${turnId}`,
  probe: (nonce: string) => `probe-${nonce}`,
} as const;

/**
 * Every reason an agent's REFUSED or FAILED command result carries (besides `docker_<reason>` for an
 * engine error). One list for both sides: the agent may only answer these, and the control plane
 * decides by them.
 */
export type AgentRefusalReason =
  // fencing and admission (R-H6)
  | 'stale_epoch' | 'unknown_epoch' | 'stale_generation' | 'stale_incarnation' | 'not_registered' | 'host_not_admitted' | 'wrong_host'
  // malformed or impossible commands
  | 'malformed' | 'invalid_argument' | 'deadline_exceeded'
  // group state on the host
  | 'group_not_found' | 'member_not_found' | 'member_mismatch' | 'group_running' | 'state_changed' | 'no_capacity'
  | 'start_failed' | 'stop_failed' | 'unclean_stop'
  // checkpoint capture (R-G3)
  | 'bridge_unproven' | 'session_files_missing' | 'checkpoint_exists' | 'manifest_exists' | 'manifest_write_failed'
  | 'capture_failed' | 'layer_refused'
  // restore (R-G5): the checkpoint's data
  | 'no_checkpoint' | 'checkpoint_mismatch' | 'checkpoint_corrupt' | 'manifest_invalid' | 'image_mismatch'
  | LayerDataReason
  // restore: this host
  | 'restore_target_in_use' | 'restore_failed' | 'transfer_failed' | 'extract_failed' | 'disk_full';

/**
 * Restore refusals that say the checkpoint's DATA is unusable: a hostile or malformed tar entry, a
 * bomb, a digest or size that does not match, a chunk missing from the store. Every host would
 * refuse the same bytes, so the group is LOST at once with the agent's message (never retried on
 * other hosts until the evacuation deadline, and never blamed on hosts).
 */
export type LayerDataReason =
  | 'layer_digest_mismatch' | 'layer_size_mismatch' | 'chunk_missing' | 'chunk_digest_mismatch'
  | 'layer_path_invalid' | 'layer_link_escape' | 'layer_device_node' | 'layer_entry_limit' | 'layer_size_limit'
  | 'layer_name_limit' | 'layer_header_invalid' | 'layer_xattr_refused';

export const LAYER_DATA_REASONS = everyMemberOf<LayerDataReason>()([
  'layer_digest_mismatch', 'layer_size_mismatch', 'chunk_missing', 'chunk_digest_mismatch',
  'layer_path_invalid', 'layer_link_escape', 'layer_device_node', 'layer_entry_limit', 'layer_size_limit',
  'layer_name_limit', 'layer_header_invalid', 'layer_xattr_refused',
]);

export const AGENT_REFUSAL_REASONS = everyMemberOf<AgentRefusalReason>()([
  'stale_epoch', 'unknown_epoch', 'stale_generation', 'stale_incarnation', 'not_registered', 'host_not_admitted', 'wrong_host',
  'malformed', 'invalid_argument', 'deadline_exceeded',
  'group_not_found', 'member_not_found', 'member_mismatch', 'group_running', 'state_changed', 'no_capacity',
  'start_failed', 'stop_failed', 'unclean_stop',
  'bridge_unproven', 'session_files_missing', 'checkpoint_exists', 'manifest_exists', 'manifest_write_failed',
  'capture_failed', 'layer_refused',
  'no_checkpoint', 'checkpoint_mismatch', 'checkpoint_corrupt', 'manifest_invalid', 'image_mismatch',
  ...LAYER_DATA_REASONS,
  'restore_target_in_use', 'restore_failed', 'transfer_failed', 'extract_failed', 'disk_full',
]);

/** What a failed restore says about where the fault is. */
export type RestoreFaultScope = 'checkpoint' | 'host';

/**
 * A restore refused for the checkpoint itself (its data, its manifest, its missing blobs) versus one
 * this host could not do (engine, disk, transfer, a busy target): only the latter is retried on
 * another host. An unknown reason is the host's (retrying elsewhere is the safe default: it never
 * ends a group that another host could restore).
 */
export function restoreFaultScope(reason: string): RestoreFaultScope {
  if ((LAYER_DATA_REASONS as readonly string[]).includes(reason)) return 'checkpoint';
  return reason === 'checkpoint_corrupt' || reason === 'manifest_invalid' || reason === 'checkpoint_mismatch' || reason === 'no_checkpoint' ? 'checkpoint' : 'host';
}
