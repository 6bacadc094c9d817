// Leader election on a Kubernetes Lease (coordination.k8s.io/v1) when in-cluster (R-I6), the
// algorithm of client-go's leaderelection: the holder renews `renewTime`; a candidate takes the
// Lease over only after it has seen the same record unchanged for `leaseDurationSeconds` by ITS
// OWN clock (never comparing another machine's timestamps), or when the holder released it. Every
// write carries the resourceVersion it read, so two candidates can never both win: the API server
// answers the second with 409 Conflict. Any failure means "not leader" at once; reconcile writes
// are compare-and-set in NATS anyway, so a deposed leader that has not noticed cannot clobber the
// new one's (R-R3). Same contract as the NATS KV elector (control-plane/leader.ts `Elector`).
import { ApiException, CoordinationV1Api, type KubeConfig, type V1Lease, V1MicroTime } from '@kubernetes/client-node';
import type { Logger } from '../observability/logger.ts';

export interface LeaseElectorOptions {
  readonly kubeConfig: KubeConfig;
  readonly namespace: string;
  readonly name: string;
  /** This replica's identity; unique per process, so a restarted pod never inherits leadership. */
  readonly identity: string;
  /** How long a silent holder keeps the Lease (client-go's default is 15 s). */
  readonly leaseDurationSeconds: number;
  readonly logger: Logger;
  readonly now?: () => number;
}

/**
 * Milliseconds of a Lease time field. The client's deserializer yields a Date, or the RFC 3339
 * string when its model classes are loaded twice (ESM and CJS copies, as under some test runners).
 */
function timeMs(t: Date | string | undefined): number | undefined {
  if (t === undefined) return undefined;
  const ms = (t instanceof Date ? t : new Date(t)).getTime();
  return Number.isFinite(ms) ? ms : undefined;
}

/** A record "version" as observed: any change of holder, renewal or object restarts the clock. */
function fingerprint(lease: V1Lease): string {
  return `${lease.metadata?.resourceVersion ?? ''}|${lease.spec?.holderIdentity ?? ''}|${timeMs(lease.spec?.renewTime) ?? ''}`;
}

export class LeaseElector {
  readonly #opts: LeaseElectorOptions;
  readonly #api: CoordinationV1Api;
  readonly #now: () => number;
  #leading = false;
  #term = 0;
  #observed: { fingerprint: string; atMs: number } | undefined;

  constructor(opts: LeaseElectorOptions) {
    this.#opts = opts;
    this.#api = opts.kubeConfig.makeApiClient(CoordinationV1Api);
    this.#now = opts.now ?? Date.now;
  }

  get isLeader(): boolean {
    return this.#leading;
  }

  get term(): number {
    return this.#term;
  }

  async tick(): Promise<boolean> {
    const { name, namespace, identity } = this.#opts;
    try {
      const lease = await this.#read();
      const now = this.#now();
      if (lease === undefined) {
        await this.#api.createNamespacedLease({ namespace, body: { metadata: { name, namespace }, spec: this.#spec(now, now, 0) } });
        return this.#won(1);
      }
      const fp = fingerprint(lease);
      if (this.#observed?.fingerprint !== fp) this.#observed = { fingerprint: fp, atMs: now };
      const spec = lease.spec ?? {};
      const holder = spec.holderIdentity ?? '';
      const transitions = spec.leaseTransitions ?? 0;
      if (holder === identity) {
        // Renew (or, after our own restart under the same identity, resume).
        const acquired = timeMs(spec.acquireTime) ?? now;
        await this.#api.replaceNamespacedLease({ name, namespace, body: { ...lease, spec: this.#spec(acquired, now, transitions) } });
        return this.#won(transitions + 1);
      }
      const expired = holder === '' || now - this.#observed.atMs >= (spec.leaseDurationSeconds ?? this.#opts.leaseDurationSeconds) * 1000;
      if (!expired) return this.#lost(`held by ${holder}`);
      await this.#api.replaceNamespacedLease({ name, namespace, body: { ...lease, spec: this.#spec(now, now, transitions + 1) } });
      return this.#won(transitions + 2);
    } catch (err) {
      return this.#lost(err instanceof ApiException && err.code === 409 ? 'another replica wrote the Lease first' : String((err as Error)?.message ?? err));
    }
  }

  /** Release the Lease (holder cleared, client-go's ReleaseOnCancel) so a candidate takes it at once. */
  async resign(): Promise<void> {
    if (!this.#leading) return;
    this.#leading = false;
    const { name, namespace, identity } = this.#opts;
    try {
      const lease = await this.#read();
      if (lease?.spec?.holderIdentity !== identity) return;
      await this.#api.replaceNamespacedLease({ name, namespace, body: { ...lease, spec: { ...lease.spec, holderIdentity: '', leaseDurationSeconds: 1 } } });
    } catch (err) {
      this.#opts.logger.warn({ err }, 'releasing the leader Lease failed; it expires on its own');
    }
  }

  async #read(): Promise<V1Lease | undefined> {
    try {
      return await this.#api.readNamespacedLease({ name: this.#opts.name, namespace: this.#opts.namespace });
    } catch (err) {
      if (err instanceof ApiException && err.code === 404) return undefined;
      throw err;
    }
  }

  #spec(acquiredMs: number, renewedMs: number, transitions: number): NonNullable<V1Lease['spec']> {
    return {
      holderIdentity: this.#opts.identity,
      leaseDurationSeconds: this.#opts.leaseDurationSeconds,
      acquireTime: new V1MicroTime(acquiredMs),
      renewTime: new V1MicroTime(renewedMs),
      leaseTransitions: transitions,
    };
  }

  #won(term: number): boolean {
    if (!this.#leading) this.#opts.logger.info({ identity: this.#opts.identity, lease: `${this.#opts.namespace}/${this.#opts.name}`, term }, 'became leader (Kubernetes Lease)');
    this.#leading = true;
    this.#term = term;
    return true;
  }

  #lost(why: string): boolean {
    if (this.#leading) this.#opts.logger.warn({ identity: this.#opts.identity, why }, 'lost leadership (Kubernetes Lease)');
    this.#leading = false;
    return false;
  }
}
