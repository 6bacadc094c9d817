// Kubernetes Node watch (R-H5, R-I6): a Node deleted, cordoned, tainted by a cluster autoscaler or
// Karpenter, or carrying a spot-termination notice means the host of the same name (the host agent
// DaemonSet uses the Node name as host id) is going away, so it is drained: its groups are stopped
// cleanly, checkpointed and moved before the machine goes (core/node-signals.ts has the rules).
// The list+watch, relist and reconnect are @kubernetes/client-node's informer; this file only maps
// Node objects to drains. Drains are compare-and-set transitions in the control plane, so replicas
// watching the same Nodes cannot double-apply; a drain that did not happen (no such host yet, NATS
// down) is retried by a periodic re-check while the Node still says it is going away.
import { CoreV1Api, KubeConfig, makeInformer, type Informer, type V1Node } from '@kubernetes/client-node';
import type { RemovalSource } from '../core/host.ts';
import { isHostId } from '../core/ids.ts';
import { nodeDepartureSource, type NodeView } from '../core/node-signals.ts';
import type { Logger } from '../observability/logger.ts';

/** Drain the host named `hostId` for `source`; resolves false (or throws) when it was not drained. */
export type DrainHost = (hostId: string, source: RemovalSource) => Promise<boolean>;

export interface NodeWatcherOptions {
  readonly kubeConfig: KubeConfig;
  readonly drain: DrainHost;
  readonly logger: Logger;
  /** Only the leader acts (others keep their cache warm for a fast takeover); default: always. */
  readonly isLeader?: () => boolean;
  /** How often Nodes already seen departing are re-checked (a drain that failed is retried). */
  readonly recheckMs?: number;
}

/** The rule input of a Node object (absent fields read as "not set"). */
export function nodeView(node: V1Node): NodeView {
  return {
    name: node.metadata?.name ?? '',
    unschedulable: node.spec?.unschedulable === true,
    taints: (node.spec?.taints ?? []).map((t) => ({ key: t.key, value: t.value, effect: t.effect })),
  };
}

/** Kube config for a mode: in-cluster service account, or a kubeconfig file. */
export function loadKubeConfig(source: 'in-cluster' | { readonly kubeconfig: string }): KubeConfig {
  const kc = new KubeConfig();
  if (source === 'in-cluster') kc.loadFromCluster();
  else kc.loadFromFile(source.kubeconfig);
  return kc;
}

export class NodeWatcher {
  readonly #opts: NodeWatcherOptions;
  readonly #informer: Informer<V1Node>;
  /** Hosts drained for a source already (host|source): each departure is acted on once. */
  readonly #done = new Set<string>();
  /** Departures seen but not applied (not leader, or the drain failed): retried by the re-check. */
  readonly #pending = new Map<string, RemovalSource>();
  #timer: NodeJS.Timeout | undefined;
  #stopped = false;

  constructor(opts: NodeWatcherOptions) {
    this.#opts = opts;
    const api = opts.kubeConfig.makeApiClient(CoreV1Api);
    this.#informer = makeInformer(opts.kubeConfig, '/api/v1/nodes', () => api.listNode());
    this.#informer.on('add', (n) => this.#seen(nodeView(n)));
    this.#informer.on('update', (n) => this.#seen(nodeView(n)));
    this.#informer.on('delete', (n) => this.#departed(n.metadata?.name ?? '', 'node_deleted'));
    this.#informer.on('error', (err: unknown) => {
      opts.logger.warn({ err }, 'Kubernetes Node watch failed; restarting it');
      // The informer stops on error; restart it after a pause (it relists, so nothing is missed).
      setTimeout(() => {
        if (!this.#stopped) void this.#informer.start().catch((e: unknown) => opts.logger.warn({ err: e }, 'Node watch restart failed'));
      }, 2_000).unref();
    });
  }

  async start(): Promise<void> {
    await this.#informer.start();
    this.#timer = setInterval(() => this.#retryPending(), this.#opts.recheckMs ?? 5_000);
    this.#timer.unref();
    this.#opts.logger.info('watching Kubernetes Nodes for host departures (R-H5)');
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer !== undefined) clearInterval(this.#timer);
    await this.#informer.stop();
  }

  #seen(node: NodeView): void {
    const source = nodeDepartureSource(node);
    if (source !== undefined) this.#departed(node.name, source);
    // Uncordoned before its host was drained: nothing to retry.
    else this.#pending.delete(node.name);
  }

  #departed(hostId: string, source: RemovalSource): void {
    // Node names are host ids by the same rule (ids.ts); anything else names no host of ours.
    if (!isHostId(hostId)) {
      this.#opts.logger.debug({ source }, 'Node departing: its name is not a valid host id; ignored');
      return;
    }
    if (this.#done.has(`${hostId}|${source}`)) return;
    this.#pending.set(hostId, source);
    void this.#apply(hostId, source);
  }

  #retryPending(): void {
    for (const [hostId, source] of this.#pending) void this.#apply(hostId, source);
  }

  async #apply(hostId: string, source: RemovalSource): Promise<void> {
    if (this.#opts.isLeader !== undefined && !this.#opts.isLeader()) return;
    try {
      if (await this.#opts.drain(hostId, source)) {
        this.#done.add(`${hostId}|${source}`);
        if (this.#pending.get(hostId) === source) this.#pending.delete(hostId);
        this.#opts.logger.info({ hostId, source }, 'Node departing: host drained');
      } else {
        // Not a fleet host (yet), or already leaving: kept pending, so a host of this name that
        // registers later is still drained while its Node says it is going away.
        this.#opts.logger.debug({ hostId, source }, 'Node departing: no drainable host of that name');
      }
    } catch (err) {
      this.#opts.logger.warn({ hostId, source, err }, 'Node departing: drain failed; retrying');
    }
  }
}
