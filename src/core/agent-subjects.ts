// NATS subjects between the control plane and host agents (R-I2). Both sides import these names
// from here so they cannot drift; per-host NATS credentials (R-R5) allow a host exactly the
// subjects returned by hostPermissions(hostId). Payloads are protobuf messages from proto/.
import { parseHostId } from './ids.ts';

/**
 * A host id as one subject token. Host ids may contain dots (Kubernetes node names do), which
 * NATS reads as token separators, so '.' becomes '~' — a character host ids cannot contain, so
 * the mapping is one-to-one. Validation first: no wildcard or space can reach a subject.
 */
function token(hostId: string): string {
  const parsed = parseHostId(hostId);
  if (!parsed.ok) throw parsed.error;
  return parsed.value.replaceAll('.', '~');
}

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
} as const;

/** Host id parsed from a per-host subject such as `sf.host.<id>.heartbeat`, or undefined. */
export function hostIdFromSubject(subject: string): string | undefined {
  const parts = subject.split('.');
  if (parts.length !== 4 || parts[0] !== 'sf' || parts[1] !== 'host') return undefined;
  const id = (parts[2] ?? '').replaceAll('~', '.');
  try {
    return token(id) === parts[2] ? id : undefined;
  } catch {
    return undefined;
  }
}

/** The publish/subscribe allow-lists of one host's NATS credentials (R-I2, R-R5). */
export function hostPermissions(hostId: string): { publish: string[]; subscribe: string[] } {
  const id = token(hostId);
  return {
    publish: [AgentSubjects.register, `sf.host.${id}.heartbeat`, `sf.host.${id}.notice`, `sf.probe.${id}`, '$JS.API.>', '_INBOX.>'],
    subscribe: [`sf.host.${id}.cmd`, '_INBOX.>'],
  };
}
