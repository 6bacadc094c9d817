// Chunk garbage collection versus checkpoints (R-G7 without breaking R-R2). Chunks are shared by
// digest, and an agent's put of a chunk that already exists stores nothing: a checkpoint in progress
// may rely on a chunk that no manifest references yet. A sweep that deleted such a chunk would leave
// the new checkpoint's manifest pointing at nothing, found only at restore time, when the group is
// then LOST. So the two exclude each other, restic-style, through compare-and-set keys in one KV
// bucket (one stream: its writes are totally ordered):
// - a checkpoint holds a shared lock `ckpt.<id>.<replica>` from before its command is sent until its manifest
//   is indexed or the command failed; taking it = write the key, THEN look for `sweep`;
// - a sweep holds the exclusive lock `sweep`; taking it = create the key, THEN look for `ckpt.>`.
// Whichever writes second sees the other and backs off, so they never both proceed. Locks end at
// their deadline, so a crashed holder blocks nobody for long: a checkpoint's deadline is its agent
// command's (the agent writes no manifest after it), a sweep stops deleting before its own.
import { Unavailable } from '../core/index.ts';
import { CasConflictError } from '../store/errors.ts';
import type { ControlPlaneDeps } from './state.ts';

const SWEEP_KEY = 'sweep';
/** One shared lock per checkpoint AND holder: two replicas repeating one checkpoint never release each other's. */
const sharedKey = (checkpointId: string, holder: string): string => `ckpt.${checkpointId}.${holder.replaceAll('.', '=')}`;
/** Clocks of the control-plane replicas and hosts may disagree by this much. */
export const CLOCK_SKEW_MS = 5_000;

export class ChunkGcLocks {
  constructor(private readonly ctx: Pick<ControlPlaneDeps, 'gcLocks' | 'replicaId' | 'now'>) {}

  /**
   * Announce a checkpoint whose agent command ends by `deadlineMs`. Throws Unavailable
   * `gc_in_progress` while a sweep runs (the caller retries; sweeps are short).
   */
  async beginCheckpoint(checkpointId: string, deadlineMs: number): Promise<void> {
    const repo = this.ctx.gcLocks;
    await repo.mutate(sharedKey(checkpointId, this.ctx.replicaId), () => ({ holder: this.ctx.replicaId, deadlineMs: deadlineMs + CLOCK_SKEW_MS }));
    const sweep = await repo.get(SWEEP_KEY);
    if (sweep !== undefined && sweep.value.deadlineMs > this.ctx.now()) {
      await this.endCheckpoint(checkpointId);
      throw new Unavailable('gc_in_progress', 'checkpoint garbage collection is running; retry shortly', { details: { checkpointId } });
    }
  }

  /** The checkpoint is indexed, or failed: its chunks are referenced by a manifest or free to sweep. */
  async endCheckpoint(checkpointId: string): Promise<void> {
    const repo = this.ctx.gcLocks;
    const key = sharedKey(checkpointId, this.ctx.replicaId);
    const cur = await repo.get(key);
    if (cur === undefined) return;
    await repo.delete(key, cur.revision).catch((err: unknown) => {
      if (!(err instanceof CasConflictError)) throw err;
    });
  }

  /**
   * Run `sweep` holding the exclusive lock for at most `budgetMs`, or return undefined without
   * running it when a checkpoint is in progress (or another sweep runs). `sweep` must call
   * `inTime()` before every deletion and stop when it says false.
   */
  async trySweep<T>(budgetMs: number, sweep: (inTime: () => boolean) => Promise<T>): Promise<T | undefined> {
    const repo = this.ctx.gcLocks;
    const deadlineMs = this.ctx.now() + budgetMs;
    const record = { holder: this.ctx.replicaId, deadlineMs };
    let revision: number;
    const existing = await repo.get(SWEEP_KEY);
    try {
      if (existing === undefined) revision = await repo.create(SWEEP_KEY, record);
      else if (existing.value.deadlineMs <= this.ctx.now()) revision = await repo.update(SWEEP_KEY, record, existing.revision);
      else return undefined;
    } catch (err) {
      if (err instanceof CasConflictError) return undefined;
      throw err;
    }
    try {
      // The locks of checkpoints in progress (bounded by concurrent checkpoints, not fleet size), read
      // from the store itself under the sweep lock: the protocol needs the store's order, not a model's.
      // eslint-disable-next-line no-restricted-syntax
      const { entries } = await repo.list({ filter: 'ckpt.>' });
      if (entries.some((e) => e.value.deadlineMs > this.ctx.now())) return undefined;
      // Stop a little before the deadline: a checkpoint may start the moment the lock expires.
      return await sweep(() => this.ctx.now() < deadlineMs - CLOCK_SKEW_MS);
    } finally {
      await repo.delete(SWEEP_KEY, revision).catch((err: unknown) => {
        if (!(err instanceof CasConflictError)) throw err;
      });
    }
  }
}
