// KV key encodings of the control plane's records, in one place so no caller builds a key by hand,
// and the injectable clock type every service takes.
import { createHash } from 'node:crypto';

/** KV keys: ids are validated before they get here; dots (legal in host ids) become `=`. */
export const Keys = {
  host: (hostId: string) => hostId.replaceAll('.', '='),
  group: (groupId: string) => groupId.replaceAll('.', '='),
  /** `<group>.<checkpoint>` so a group's checkpoints list with one filter. */
  checkpoint: (groupId: string, checkpointId: string) => `${groupId.replaceAll('.', '=')}.${checkpointId.replaceAll('.', '=')}`,
  checkpointsOf: (groupId: string) => `${groupId.replaceAll('.', '=')}.*`,
  /** Conversation ids may contain `:`; base64url keeps the key in the KV charset and one-to-one. */
  conversation: (conversationId: string) => Buffer.from(conversationId, 'utf8').toString('base64url'),
  /** Idempotency keys are caller-chosen strings: hashed, scoped by operation. */
  idempotency: (operation: string, key: string) => `${operation}.${createHash('sha256').update(key).digest('hex')}`,
} as const;

export type Clock = () => number;
