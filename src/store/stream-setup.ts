// Create-or-verify for JetStream streams (the storage under KV buckets, the event log, and the
// checkpoint chunk and manifest streams). Client helpers like Kvm.create silently bind to an
// existing stream whatever its settings; we instead declare every setting explicitly and check the
// live stream against it, so a bucket created by an older build (or by hand) with, say, memory
// storage or R1 in production is caught at startup instead of losing data later, and a limit a
// newer build tightens (e.g. write-once checkpoint streams) is applied to existing streams.
// Idempotent and safe to race: two control plane replicas may run it at the same time.
import { JetStreamApiError, type JetStreamManager, type StreamConfig, type StreamInfo } from '@nats-io/jetstream';
import type { Logger } from '../observability/logger.ts';
import { StoreConfigMismatchError, translateReadError } from './errors.ts';

/** Stream metadata key recording a KV shard's place in its layout ("index/count"). */
export const SHARD_METADATA_KEY = 'sandboxfleet.shard';

export type DesiredStream = Partial<StreamConfig> & Pick<StreamConfig, 'name' | 'subjects' | 'storage' | 'retention' | 'num_replicas'>;

/** Settings that cannot be changed in place: a mismatch is an operator problem, not ours to fix. */
const IMMUTABLE = ['storage', 'retention'] as const;
/** Settings we reconcile with a stream update when they drift (e.g. a new build raises a limit). */
const MUTABLE = [
  'num_replicas',
  'max_msgs_per_subject',
  'max_msg_size',
  'max_bytes',
  'max_msgs',
  'max_age',
  'discard',
  // Write-once checkpoint data (chunk-store.ts): a stream made before it refused nothing per subject.
  'discard_new_per_subject',
  'duplicate_window',
  'allow_rollup_hdrs',
  'allow_direct',
  'deny_delete',
  'deny_purge',
  'description',
] as const;

/** JetStream "stream name already in use with a different configuration". */
const STREAM_NAME_EXISTS = 10058;
const STREAM_NOT_FOUND = 10059;

async function infoOrUndefined(jsm: JetStreamManager, name: string): Promise<StreamInfo | undefined> {
  try {
    return await jsm.streams.info(name);
  } catch (err) {
    if (err instanceof JetStreamApiError && err.code === STREAM_NOT_FOUND) return undefined;
    throw translateReadError(err, `stream ${name}`);
  }
}

function sameValue(a: unknown, b: unknown): boolean {
  // The server omits false/empty fields in its answers.
  const norm = (v: unknown): unknown => (v === undefined || v === false || v === '' ? undefined : v);
  return norm(a) === norm(b);
}

/** Differences between the live config and the desired one, as `field: live → desired`. */
export function diffStreamConfig(live: StreamConfig, desired: DesiredStream): { immutable: string[]; mutable: string[] } {
  const immutable: string[] = [];
  const mutable: string[] = [];
  const liveSubjects = [...(live.subjects ?? [])].sort().join(',');
  const wantSubjects = [...desired.subjects].sort().join(',');
  if (liveSubjects !== wantSubjects) immutable.push(`subjects: ${liveSubjects} → ${wantSubjects}`);
  for (const f of IMMUTABLE) if (!sameValue(live[f], desired[f])) immutable.push(`${f}: ${String(live[f])} → ${String(desired[f])}`);
  // A shard's place in its layout ("index/count") never changes: another count moves keys between
  // shards, so data written under the old layout would silently vanish from reads.
  const liveShard = live.metadata?.[SHARD_METADATA_KEY];
  const wantShard = desired.metadata?.[SHARD_METADATA_KEY];
  if (liveShard !== wantShard) immutable.push(`shard layout: ${liveShard ?? 'unsharded'} → ${wantShard ?? 'unsharded'}`);
  for (const f of MUTABLE) {
    if (!(f in desired)) continue;
    if (!sameValue(live[f], desired[f])) mutable.push(`${f}: ${String(live[f])} → ${String(desired[f])}`);
  }
  return { immutable, mutable };
}

/**
 * Make sure `desired.name` exists with the desired settings: create it, or verify it and update
 * drifted mutable settings. Throws StoreConfigMismatchError for immutable drift.
 */
export async function ensureStream(jsm: JetStreamManager, desired: DesiredStream, logger?: Logger): Promise<StreamInfo> {
  let info = await infoOrUndefined(jsm, desired.name);
  if (!info) {
    try {
      info = await jsm.streams.add(desired);
      logger?.info({ stream: desired.name, replicas: desired.num_replicas }, 'created stream');
      return info;
    } catch (err) {
      // Lost a creation race against another replica: fall through to verification.
      if (!(err instanceof JetStreamApiError && err.code === STREAM_NAME_EXISTS)) throw translateReadError(err, `stream ${desired.name}`);
      info = await infoOrUndefined(jsm, desired.name);
      if (!info) throw new StoreConfigMismatchError(`stream ${desired.name} reported as existing but cannot be read`, { cause: err });
    }
  }
  const { immutable, mutable } = diffStreamConfig(info.config, desired);
  if (immutable.length > 0) {
    throw new StoreConfigMismatchError(`stream ${desired.name} exists with incompatible settings: ${immutable.join('; ')}`);
  }
  if (mutable.length > 0) {
    logger?.warn({ stream: desired.name, changes: mutable }, 'stream settings drifted; updating');
    try {
      info = await jsm.streams.update(desired.name, { ...info.config, ...desired });
    } catch (err) {
      throw new StoreConfigMismatchError(`stream ${desired.name} settings differ (${mutable.join('; ')}) and the update failed: ${(err as Error).message}`, {
        cause: err,
      });
    }
  }
  return info;
}
