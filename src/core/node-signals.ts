// Kubernetes Node signals that a host is going away (R-H5, R-I6). The host agent runs as a
// DaemonSet and uses the Node's name as its host id, so a Node's state speaks for the host. Pure:
// the watcher (src/kubernetes/node-watcher.ts) feeds it what it sees and drains the host with the
// source returned. A departure is one-way here: uncordoning a Node does not undo a drain (an
// operator re-admits the host by restarting its agent, which registers with a new epoch).
import type { RemovalSource } from './host.ts';

export interface NodeTaint {
  readonly key: string;
  readonly value?: string | undefined;
  readonly effect?: string | undefined;
}

/** What the rules read from a Node object. */
export interface NodeView {
  readonly name: string;
  /** `spec.unschedulable`: the Node was cordoned (`kubectl cordon`/`drain`). */
  readonly unschedulable: boolean;
  readonly taints: readonly NodeTaint[];
}

/** Taints set when the machine is about to be reclaimed by its provider (spot/preemptible). */
const PREEMPTION_TAINTS: ReadonlySet<string> = new Set([
  'aws-node-termination-handler/spot-itn',
  'cloud.google.com/impending-node-termination',
]);

/** Taints set by cluster autoscalers and node lifecycle tools before they remove a Node. */
function isDisruptionTaint(t: NodeTaint): boolean {
  switch (t.key) {
    case 'ToBeDeletedByClusterAutoscaler': // cluster-autoscaler scale-down
    case 'karpenter.sh/disrupted': // Karpenter v1
    case 'node.kubernetes.io/out-of-service': // non-graceful node shutdown
    case 'aws-node-termination-handler/asg-lifecycle-termination':
      return true;
    case 'karpenter.sh/disruption': // Karpenter before v1
      return t.value === 'disrupting';
    default:
      return false;
  }
}

/**
 * Why the host behind this Node is going away, or undefined when it is not. `undefined` for the
 * Node itself means it was deleted. The most specific signal wins: a preemption notice over an
 * autoscaler taint over a plain cordon.
 */
export function nodeDepartureSource(node: NodeView | undefined): RemovalSource | undefined {
  if (node === undefined) return 'node_deleted';
  if (node.taints.some((t) => PREEMPTION_TAINTS.has(t.key))) return 'spot_preemption';
  if (node.taints.some(isDisruptionTaint)) return 'disruption_taint';
  if (node.unschedulable) return 'node_cordoned';
  return undefined;
}
