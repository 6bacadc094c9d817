// A rate-limited, de-duplicating work queue of keys (the controller-runtime / client-go workqueue
// shape): watch events and timers add KEYS, never objects; a key waiting in the queue is held once
// however often it is added; a key is processed by one worker at a time, and one added while it is
// being processed runs once more afterwards (so no change is missed); `reconcile(key)` returns when
// to look again (`requeueAfterMs`), and a failing key backs off exponentially. Delayed keys sit in
// one min-heap served by a single timer, so 100,000 parked keys cost no timers and no polling; with
// a due step, keys parked moments apart fall due together (one firing for all, not one each).
export interface ReconcileResult {
  /** Look at this key again after this long (undefined: only when something adds it again). */
  readonly requeueAfterMs?: number | undefined;
}

export type Reconcile = (key: string) => Promise<ReconcileResult | void>;

export interface KeyedQueueOptions {
  /** Keys processed at once. */
  readonly concurrency: number;
  /** First retry delay of a failing key; doubles per consecutive failure up to `maxBackoffMs`. */
  readonly baseBackoffMs?: number;
  readonly maxBackoffMs?: number;
  /** Called with a key's error (the key is retried with backoff). */
  readonly onError?: (key: string, err: unknown) => void;
  /**
   * Parked keys fall due on multiples of this (rounded up), so keys parked moments apart share one
   * timer firing instead of one each: a key may wait up to this much longer than it asked. 1 (the
   * default): every due time is its own.
   */
  readonly dueStepMs?: number;
  readonly now?: () => number;
}

interface Parked {
  readonly key: string;
  readonly dueMs: number;
}

/** Binary min-heap of parked keys by due time; stale entries are skipped when popped. */
class DueHeap {
  readonly #items: Parked[] = [];

  get size(): number {
    return this.#items.length;
  }

  peek(): Parked | undefined {
    return this.#items[0];
  }

  push(p: Parked): void {
    const a = this.#items;
    a.push(p);
    for (let i = a.length - 1; i > 0;) {
      const parent = (i - 1) >> 1;
      if (a[parent]!.dueMs <= a[i]!.dueMs) break;
      [a[parent], a[i]] = [a[i]!, a[parent]!];
      i = parent;
    }
  }

  pop(): Parked | undefined {
    const a = this.#items;
    const top = a[0];
    const last = a.pop();
    if (a.length > 0 && last !== undefined) {
      a[0] = last;
      for (let i = 0; ;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < a.length && a[l]!.dueMs < a[m]!.dueMs) m = l;
        if (r < a.length && a[r]!.dueMs < a[m]!.dueMs) m = r;
        if (m === i) break;
        [a[m], a[i]] = [a[i]!, a[m]!];
        i = m;
      }
    }
    return top;
  }

  clear(): void {
    this.#items.length = 0;
  }
}

export class KeyedQueue {
  /** Keys ready to run, in arrival order (a Set keeps each once). */
  readonly #ready = new Set<string>();
  /** Earliest due time of each parked key (the heap may hold older, later entries: skipped). */
  readonly #parkedDue = new Map<string, number>();
  readonly #heap = new DueHeap();
  readonly #processing = new Set<string>();
  /** Keys added while being processed: they run again when the current run ends. */
  readonly #dirty = new Set<string>();
  readonly #failures = new Map<string, number>();
  readonly #idleWaiters: (() => void)[] = [];
  readonly #now: () => number;
  #timer: NodeJS.Timeout | undefined;
  #timerDueMs = Infinity;
  #running = false;
  #active = 0;
  readonly #dueStepMs: number;

  constructor(private readonly reconcile: Reconcile, private readonly opts: KeyedQueueOptions) {
    if (!Number.isInteger(opts.concurrency) || opts.concurrency < 1) throw new RangeError('concurrency must be a positive integer');
    if (opts.dueStepMs !== undefined && !(Number.isInteger(opts.dueStepMs) && opts.dueStepMs >= 1)) throw new RangeError('dueStepMs must be a positive integer');
    this.#now = opts.now ?? Date.now;
    this.#dueStepMs = opts.dueStepMs ?? 1;
  }

  /** Keys waiting (ready or parked) plus keys being processed. */
  get depth(): number {
    return this.#ready.size + this.#parkedDue.size + this.#processing.size;
  }

  start(): void {
    this.#running = true;
    this.#pump();
    this.#arm();
  }

  /** Stop taking keys and forget every waiting key (e.g. leadership lost); runs in flight finish. */
  stop(): void {
    this.#running = false;
    this.#ready.clear();
    this.#parkedDue.clear();
    this.#heap.clear();
    this.#dirty.clear();
    this.#failures.clear();
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#timerDueMs = Infinity;
  }

  /** Queue `key` now, or after `delayMs` (an earlier due time wins over a later one). */
  add(key: string, delayMs = 0): void {
    if (!this.#running) return;
    if (delayMs <= 0) {
      if (this.#processing.has(key)) {
        this.#dirty.add(key);
        return;
      }
      this.#parkedDue.delete(key);
      this.#ready.add(key);
      this.#pump();
      return;
    }
    if (this.#ready.has(key)) return;
    const due = Math.ceil((this.#now() + delayMs) / this.#dueStepMs) * this.#dueStepMs;
    const current = this.#parkedDue.get(key);
    if (current !== undefined && current <= due) return;
    this.#parkedDue.set(key, due);
    this.#heap.push({ key, dueMs: due });
    this.#arm();
  }

  /** Resolves when nothing is ready or being processed (parked keys may remain). */
  whenIdle(): Promise<void> {
    if (this.#ready.size === 0 && this.#active === 0) return Promise.resolve();
    return new Promise((resolve) => this.#idleWaiters.push(resolve));
  }

  #arm(): void {
    if (!this.#running) return;
    // Drop heap entries that no longer match their key's due time.
    for (let top = this.#heap.peek(); top !== undefined && this.#parkedDue.get(top.key) !== top.dueMs; top = this.#heap.peek()) this.#heap.pop();
    const next = this.#heap.peek();
    if (next === undefined || next.dueMs >= this.#timerDueMs) return;
    if (this.#timer) clearTimeout(this.#timer);
    this.#timerDueMs = next.dueMs;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.#timerDueMs = Infinity;
      this.#release();
    }, Math.max(0, next.dueMs - this.#now()));
    this.#timer.unref?.();
  }

  /** Move every parked key that is due to the ready set. */
  #release(): void {
    const now = this.#now();
    for (let top = this.#heap.peek(); top !== undefined && top.dueMs <= now; top = this.#heap.peek()) {
      this.#heap.pop();
      if (this.#parkedDue.get(top.key) !== top.dueMs) continue;
      this.#parkedDue.delete(top.key);
      if (this.#processing.has(top.key)) this.#dirty.add(top.key);
      else this.#ready.add(top.key);
    }
    this.#arm();
    this.#pump();
  }

  #pump(): void {
    while (this.#running && this.#active < this.opts.concurrency) {
      const key = this.#nextReady();
      if (key === undefined) break;
      this.#active += 1;
      this.#processing.add(key);
      void this.#run(key);
    }
    this.#maybeIdle();
  }

  #nextReady(): string | undefined {
    for (const key of this.#ready) {
      this.#ready.delete(key);
      return key;
    }
    return undefined;
  }

  async #run(key: string): Promise<void> {
    let again: number | undefined;
    try {
      const result = await this.reconcile(key);
      this.#failures.delete(key);
      again = result?.requeueAfterMs;
    } catch (err) {
      const n = (this.#failures.get(key) ?? 0) + 1;
      this.#failures.set(key, n);
      again = Math.min(this.opts.maxBackoffMs ?? 30_000, (this.opts.baseBackoffMs ?? 100) * 2 ** Math.min(n - 1, 20));
      this.opts.onError?.(key, err);
    } finally {
      this.#processing.delete(key);
      this.#active -= 1;
    }
    if (this.#dirty.delete(key)) this.add(key);
    else if (again !== undefined) this.add(key, Math.max(1, again));
    this.#pump();
  }

  #maybeIdle(): void {
    if (this.#ready.size > 0 || this.#active > 0) return;
    for (const w of this.#idleWaiters.splice(0)) w();
  }
}
