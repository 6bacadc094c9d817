// Validated, bounded identifiers (R-R4). Every id that crosses a boundary (gRPC, NATS, manifest)
// goes through one of these parsers, so stores, subjects and paths only ever see short strings from
// a safe charset. Ids are branded so an unvalidated string cannot be passed where an id is expected.
import { InvalidArgument } from './errors.ts';
import { err, ok, type Result } from './result.ts';

declare const brand: unique symbol;
/** A string proven to satisfy the rule of its kind. */
export type Branded<T extends string> = string & { readonly [brand]: T };

export type HostId = Branded<'HostId'>;
export type GroupId = Branded<'GroupId'>;
export type MemberId = Branded<'MemberId'>;
export type ConversationId = Branded<'ConversationId'>;
export type CheckpointId = Branded<'CheckpointId'>;
export type TurnId = Branded<'TurnId'>;
/** A native CLI session id (Claude session_id, Codex thread id, OpenCode session id, ...). */
export type Locator = Branded<'Locator'>;
/** `sha256:` + 64 lowercase hex. */
export type Digest = Branded<'Digest'>;
/** A git commit SHA: 40 (SHA-1) or 64 (SHA-256) lowercase hex. */
export type GitSha = Branded<'GitSha'>;

interface IdRule {
  readonly maxLength: number;
  readonly pattern: RegExp;
  readonly describe: string;
}

// Names start with an alphanumeric so they are never `.`/`..` and never look like a flag.
const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;
/** DNS-1123 subdomain (Kubernetes IsDNS1123Subdomain; its length bound is checked before the pattern). */
const HOST_NAME = /^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*$/;

/** The rules per id kind; exported so adapters (NATS subjects, proto docs) can cite the limits. */
export const ID_RULES = {
  // The one host-id rule (R-H1): a Kubernetes node name, i.e. a DNS-1123 subdomain exactly as the
  // API server validates it (lowercase labels of [a-z0-9-] that start and end alphanumeric, joined
  // by dots, <= 253 in all), because the chart uses the node name as host id. Lowercase only, and
  // refused rather than folded: DNS names are case-insensitive but NATS subjects, KV keys and
  // per-host credentials are not, so `Node-1` and `node-1` would be two hosts (two epochs, two
  // credential sets) for one machine; refusing makes the mistake visible at start-up. No "_" (not a
  // node name) and no "~" or "=" — agent-subjects.ts and the KV keys map "." to those, which keeps
  // both mappings one-to-one.
  hostId: { maxLength: 253, pattern: HOST_NAME, describe: 'a Kubernetes node name (DNS-1123 subdomain): lowercase letters, digits, "-", "." between labels; each label starts and ends alphanumeric' },
  groupId: { maxLength: 128, pattern: NAME, describe: 'letters, digits, ".", "_", "-"; starts alphanumeric' },
  memberId: { maxLength: 64, pattern: NAME, describe: 'letters, digits, ".", "_", "-"; starts alphanumeric' },
  conversationId: { maxLength: 128, pattern: /^[A-Za-z0-9][A-Za-z0-9._:-]*$/, describe: 'letters, digits, ".", "_", ":", "-"' },
  checkpointId: { maxLength: 128, pattern: NAME, describe: 'letters, digits, ".", "_", "-"; starts alphanumeric' },
  turnId: { maxLength: 128, pattern: /^[A-Za-z0-9][A-Za-z0-9._:-]*$/, describe: 'letters, digits, ".", "_", ":", "-"' },
  // Native session ids are UUIDs or prefixed tokens (e.g. `ses_...`); no "/" so a locator can never
  // become a path segment that escapes its directory.
  locator: { maxLength: 256, pattern: /^[A-Za-z0-9][A-Za-z0-9._:@+-]*$/, describe: 'letters, digits, ".", "_", ":", "@", "+", "-"' },
  digest: { maxLength: 71, pattern: /^sha256:[0-9a-f]{64}$/, describe: 'sha256:<64 lowercase hex>' },
  gitSha: { maxLength: 64, pattern: /^(?:[0-9a-f]{40}|[0-9a-f]{64})$/, describe: '40 or 64 lowercase hex' },
} as const satisfies Record<string, IdRule>;

export type IdKind = keyof typeof ID_RULES;

function parseWith<T>(kind: IdKind, field: string, raw: unknown): Result<T, InvalidArgument> {
  const rule: IdRule = ID_RULES[kind];
  if (typeof raw !== 'string') {
    return err(new InvalidArgument('not_a_string', `${field} must be a string`, { details: { field, kind } }));
  }
  if (raw.length === 0) {
    return err(new InvalidArgument('empty_value', `${field} must not be empty`, { details: { field, kind } }));
  }
  if (raw.length > rule.maxLength) {
    return err(new InvalidArgument('value_too_long', `${field} exceeds ${rule.maxLength} characters`, {
      details: { field, kind, maxLength: rule.maxLength, length: raw.length },
    }));
  }
  if (!rule.pattern.test(raw)) {
    // The raw value is not echoed: it may be hostile or huge-ish; the rule is enough to fix it.
    return err(new InvalidArgument('invalid_characters', `${field} must match: ${rule.describe}`, { details: { field, kind } }));
  }
  return ok(raw as T);
}

/** Parse a host id (R-H1, R-R4): a Kubernetes node name, see ID_RULES.hostId. `field` names the input in the error. */
export const parseHostId = (raw: unknown, field = 'hostId') => parseWith<HostId>('hostId', field, raw);
/** True when `raw` satisfies the host-id rule (for callers that refuse with their own reason). */
export const isHostId = (raw: unknown): raw is HostId => parseHostId(raw).ok;
export const parseGroupId = (raw: unknown, field = 'groupId') => parseWith<GroupId>('groupId', field, raw);
export const parseMemberId = (raw: unknown, field = 'memberId') => parseWith<MemberId>('memberId', field, raw);
export const parseConversationId = (raw: unknown, field = 'conversationId') =>
  parseWith<ConversationId>('conversationId', field, raw);
export const parseCheckpointId = (raw: unknown, field = 'checkpointId') => parseWith<CheckpointId>('checkpointId', field, raw);
export const parseTurnId = (raw: unknown, field = 'turnId') => parseWith<TurnId>('turnId', field, raw);
export const parseLocator = (raw: unknown, field = 'locator') => parseWith<Locator>('locator', field, raw);
export const parseDigest = (raw: unknown, field = 'digest') => parseWith<Digest>('digest', field, raw);
export const parseGitSha = (raw: unknown, field = 'sha') => parseWith<GitSha>('gitSha', field, raw);

/**
 * Parse an optional locator: absent (undefined or "") means "not given" (R-S3 then uses the saved
 * one); anything else must be a valid locator.
 */
export function parseOptionalLocator(raw: unknown, field = 'locator'): Result<Locator | undefined, InvalidArgument> {
  if (raw === undefined || raw === null || raw === '') return ok(undefined);
  return parseLocator(raw, field);
}
