// Leader election on NATS KV (the leadership bucket, server-side TTL): create-if-absent takes the
// lease, renewal is a compare-and-set on the revision we hold, and any CAS failure means we lost it.
// Only the leader runs reconcile loops; every state write is CAS anyway, so a deposed leader that
// has not noticed yet cannot clobber what the new one wrote (R-R3).
import { CasConflictError } from '../store/errors.ts';
import type { KvRepository } from '../store/kv-repository.ts';
import type { Logger } from '../observability/logger.ts';
import type { LeadershipRecord } from './records.ts';

const KEY = 'control-plane';

/**
 * Who runs the reconcile loops: NATS KV (below, the default) or a Kubernetes Lease in-cluster
 * (src/kube/lease-elector.ts, R-I6). `tick` is called every reconcile interval.
 */
export interface Elector {
  readonly isLeader: boolean;
  readonly term: number;
  /** Take or keep leadership; whether this replica leads after the attempt. Never throws. */
  tick(): Promise<boolean>;
  /** Give leadership up (graceful shutdown) so another replica takes over at once. */
  resign(): Promise<void>;
}

export class LeaderElector implements Elector {
  #revision: number | undefined;
  #term = 0;

  constructor(
    private readonly repo: KvRepository<LeadershipRecord>,
    private readonly holder: string,
    private readonly now: () => number,
    private readonly logger: Logger,
  ) {}

  get isLeader(): boolean {
    return this.#revision !== undefined;
  }

  get term(): number {
    return this.#term;
  }

  /** Try to take or keep the lease. Returns whether this replica leads after the attempt. */
  async tick(): Promise<boolean> {
    try {
      if (this.#revision !== undefined) {
        this.#revision = await this.repo.update(KEY, { holder: this.holder, term: this.#term, renewedAtMs: this.now() }, this.#revision);
        return true;
      }
      const current = await this.repo.get(KEY);
      if (current !== undefined) return false;
      const term = this.#term + 1;
      this.#revision = await this.repo.create(KEY, { holder: this.holder, term, renewedAtMs: this.now() });
      this.#term = term;
      this.logger.info({ holder: this.holder, term }, 'became leader');
      return true;
    } catch (err) {
      if (this.#revision !== undefined) this.logger.warn({ err: err instanceof CasConflictError ? err.message : err }, 'lost leadership');
      this.#revision = undefined;
      return false;
    }
  }

  /** Give the lease up (graceful shutdown) so another replica takes over at once. */
  async resign(): Promise<void> {
    const rev = this.#revision;
    this.#revision = undefined;
    if (rev === undefined) return;
    try {
      await this.repo.delete(KEY, rev);
    } catch (err) {
      this.logger.warn({ err }, 'resign failed; the lease expires by TTL');
    }
  }
}
