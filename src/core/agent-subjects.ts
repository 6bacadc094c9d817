// NATS subjects between the control plane and host agents (R-I2). Both sides import these names
// from here so they cannot drift; per-host NATS credentials (R-R5) allow a host exactly the
// subjects returned by hostPermissions(hostId). Payloads are protobuf messages from proto/.
import { parseHostId } from './ids.ts';

/**
 * A host id as one subject token. Host ids are Kubernetes node names (ids.ts) and may contain dots,
 * which NATS reads as token separators, so '.' becomes '~' — a character no host id contains, so
 * the mapping is one-to-one and the token holds only [a-z0-9~-]: never empty, never a wildcard or
 * whitespace. Validation first: nothing that is not a host id can reach a subject.
 */
export function hostIdToken(hostId: string): string {
  const parsed = parseHostId(hostId);
  if (!parsed.ok) throw parsed.error;
  return parsed.value.replaceAll('.', '~');
}

/** The host id a subject token names, or undefined when the token is not the token of a host id. */
export function hostIdFromToken(token: string): string | undefined {
  const id = token.replaceAll('~', '.');
  return parseHostId(id).ok && id.replaceAll('.', '~') === token ? id : undefined;
}

const token = hostIdToken;

export const AgentSubjects = {
  /** Request/reply: Registration → RegistrationAck (new epoch, lease term, owned groups). */
  register: 'sf.agent.register',
  /** Agent publishes Heartbeat with inventory at a fixed interval (R-H3). */
  heartbeat: (hostId: string) => `sf.host.${token(hostId)}.heartbeat`,
  /** Wildcard the control plane subscribes to for every host's heartbeat. */
  allHeartbeats: 'sf.host.*.heartbeat',
  /** Request/reply: control plane sends AgentCommand, agent answers AgentCommandResult (R-H6 fenced). */
  commands: (hostId: string) => `sf.host.${token(hostId)}.cmd`,
  /** Agent publishes ReclaimNotice (spot/preemption, Docker data dir lost; R-H5). */
  notices: (hostId: string) => `sf.host.${token(hostId)}.notice`,
  allNotices: 'sf.host.*.notice',
  /** Reverse probe callbacks (R-H7): the agent calls back the control plane on this subject. */
  probeCallback: (hostId: string) => `sf.probe.${token(hostId)}`,
  /**
   * A running exec's frames (R-I9): the agent publishes ExecAgentFrame on `.out`, the control plane
   * publishes ExecControlFrame on `.in`. `execId` is the control plane's, [a-z0-9-]{8,64}.
   */
  execOut: (hostId: string, execId: string) => `sf.exec.${token(hostId)}.${execToken(execId)}.out`,
  execIn: (hostId: string, execId: string) => `sf.exec.${token(hostId)}.${execToken(execId)}.in`,
} as const;

/** An exec id as one subject token: validated, never a wildcard or an empty token. */
export function execToken(execId: string): string {
  if (!/^[a-z0-9-]{8,64}$/.test(execId)) throw new RangeError(`not an exec id: ${JSON.stringify(execId.slice(0, 80))}`);
  return execId;
}

/** Host id parsed from a per-host subject such as `sf.host.<id>.heartbeat`, or undefined. */
export function hostIdFromSubject(subject: string): string | undefined {
  const parts = subject.split('.');
  if (parts.length !== 4 || parts[0] !== 'sf' || parts[1] !== 'host') return undefined;
  return hostIdFromToken(parts[2] ?? '');
}

/** Streams of checkpoint data (store/chunk-store.ts), named here because host credentials name them. */
export const CHECKPOINT_STREAMS = {
  chunks: 'SF_CHUNKS',
  manifests: 'SF_CHECKPOINTS',
  /** One message per chunk on `sf.chunk.<sha256 hex>`: content-addressed, shared by all hosts. */
  chunkSubjectPrefix: 'sf.chunk.',
  /**
   * One write-once manifest per `sf.manifest.<host>.<groupId>.<checkpointId>`, under the host that
   * wrote it: a host's credentials may write only under its own token, so no host can plant a
   * manifest (a checkpoint) in another host's name.
   */
  manifestSubjectPrefix: 'sf.manifest.',
} as const;

/** The manifest subject of a checkpoint written by `hostId` (ids are validated by the caller). */
export function manifestSubject(hostId: string, groupId: string, checkpointId: string): string {
  return `${CHECKPOINT_STREAMS.manifestSubjectPrefix}${token(hostId)}.${groupId}.${checkpointId}`;
}

/**
 * The inbox prefix of a host's connections: request replies come back on `<prefix>.<nuid>`, and a
 * host may subscribe only under its own prefix, so it cannot read replies meant for anyone else.
 */
export function hostInboxPrefix(hostId: string): string {
  return `_INBOX_${token(hostId)}`;
}

/** What one host's NATS credentials allow (R-I2, R-R5): least privilege, nothing of another host. */
export interface HostPermissions {
  readonly publish: readonly string[];
  readonly subscribe: readonly string[];
  /** Replies to requests it received (commands from the control plane), and only those. */
  readonly allowResponses: true;
}

/**
 * The publish/subscribe allow-lists of one host's NATS credentials (R-I2, R-R5). A host may:
 * register; publish its own heartbeats, notices and probe callbacks; add content-addressed chunks
 * and write-once manifests under its own name, and read any of them back (direct get, the leader's message get, stream info of those two streams only);
 * receive its own commands and answer them. It may not touch KV state, other streams, consumers,
 * stream administration, another host's subjects, or anyone else's inbox. What stays shared:
 * chunks, which are content-addressed (every reader verifies every digest), so a host can add
 * chunks but never change what a digest means.
 */
export function hostPermissions(hostId: string): HostPermissions {
  const id = token(hostId);
  const { chunks, manifests, chunkSubjectPrefix, manifestSubjectPrefix } = CHECKPOINT_STREAMS;
  // Reads: a direct get (any replica), and the stream leader's get for when a replica that has not
  // caught up answers "none" (its none proves nothing; the leader's does).
  const readStream = (stream: string): string[] => [`$JS.API.STREAM.INFO.${stream}`, `$JS.API.DIRECT.GET.${stream}`, `$JS.API.DIRECT.GET.${stream}.>`, `$JS.API.STREAM.MSG.GET.${stream}`];
  return {
    publish: [
      AgentSubjects.register,
      `sf.host.${id}.heartbeat`,
      `sf.host.${id}.notice`,
      `sf.probe.${id}`,
      `sf.exec.${id}.*.out`,
      `${chunkSubjectPrefix}*`,
      `${manifestSubjectPrefix}${id}.*.*`,
      // JetStream account info: the client checks JetStream is enabled before anything else.
      '$JS.API.INFO',
      ...readStream(chunks),
      ...readStream(manifests),
    ],
    subscribe: [`sf.host.${id}.cmd`, `sf.exec.${id}.*.in`, `${hostInboxPrefix(hostId)}.>`],
    allowResponses: true,
  };
}
