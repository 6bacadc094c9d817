// Idempotency by command id (R-H6): the control plane retries a command with the same id after a
// lost reply, and must get the first result back rather than a second execution. A repeat that
// arrives while the first is still running joins it. Bounded: oldest finished results are evicted.

export class CommandResultCache<T> {
  private readonly done = new Map<string, T>();
  private readonly running = new Map<string, Promise<T>>();

  constructor(private readonly capacity = 1024) {}

  /**
   * Run `work` once per id; repeats get the stored or in-flight result. `repeat` tells which.
   * `keep(result)` false: the result is not stored (an answer about the moment that did nothing, so
   * running the command again is safe and a later repeat must be judged afresh).
   */
  async run(id: string, work: () => Promise<T>, keep: (result: T) => boolean = () => true): Promise<{ result: T; repeat: boolean }> {
    const finished = this.done.get(id);
    if (finished !== undefined) return { result: finished, repeat: true };
    const inflight = this.running.get(id);
    if (inflight !== undefined) return { result: await inflight, repeat: true };
    const p = work();
    this.running.set(id, p);
    try {
      const result = await p;
      if (!keep(result)) return { result, repeat: false };
      this.done.set(id, result);
      while (this.done.size > this.capacity) this.done.delete(this.done.keys().next().value as string);
      return { result, repeat: false };
    } finally {
      this.running.delete(id);
    }
  }

  get size(): number {
    return this.done.size;
  }
}

/** Serializes work per key (one group's commands never interleave: create vs delete, stop vs checkpoint). */
export class KeyedLock {
  private readonly tails = new Map<string, Promise<unknown>>();

  async with<T>(key: string, work: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key) ?? Promise.resolve();
    const run = prev.then(work, work);
    const tail = run.catch(() => undefined);
    this.tails.set(key, tail);
    try {
      return await run;
    } finally {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    }
  }
}
