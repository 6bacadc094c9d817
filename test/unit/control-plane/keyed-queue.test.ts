// KeyedQueue, model-based over fake time (vitest's fake timers stand in for the clock: a seam, not
// a part): any run of adds (now or delayed), reconciles that ask to look again or fail, and time
// passing. Checked: a key never runs twice at once; every add is followed by a run of that key at
// most one due step (plus busy workers) later than asked; with a due step, keys parked moments
// apart fall due in one timer firing, and without one each keeps its own due time.
import fc from 'fast-check';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { KeyedQueue } from '../../../src/control-plane/keyed-queue.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

type Op =
  | { kind: 'add'; key: string; delayMs: number }
  | { kind: 'advance'; ms: number };

const KEYS = ['a', 'b', 'c', 'd'];
const op: fc.Arbitrary<Op> = fc.oneof(
  fc.record({ kind: fc.constant('add' as const), key: fc.constantFrom(...KEYS), delayMs: fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 2_000 })) }),
  fc.record({ kind: fc.constant('advance' as const), ms: fc.integer({ min: 0, max: 700 }) }),
);
/** How late a due key may start because workers are busy (each run takes 5 ms). */
const BUSY_MS = 5 * KEYS.length;
/** What each run of a key answers: look again after this long, fail, or nothing. */
const answer = fc.oneof(fc.constant<number | 'fail' | undefined>(undefined), fc.integer({ min: 1, max: 1_500 }), fc.constant<'fail'>('fail'));

beforeEach(() => {
  vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'Date'], now: 1_000_000 });
});
afterEach(() => {
  vi.useRealTimers();
});

describe('KeyedQueue', () => {
  it('runs a key once at a time, and after every add runs it, at most one due step (and busy workers) later than asked', async () => {
    await fc.assert(fc.asyncProperty(fc.array(op, { maxLength: 40 }), fc.array(answer, { minLength: 1, maxLength: 8 }), fc.constantFrom(1, 50, 250), fc.integer({ min: 1, max: 3 }), async (ops, answers, step, concurrency) => {
      vi.setSystemTime(1_000_000);
      const running = new Set<string>();
      const starts: { key: string; at: number }[] = [];
      let n = 0;
      const queue = new KeyedQueue(async (key) => {
        expect(running.has(key)).toBe(false);
        running.add(key);
        starts.push({ key, at: Date.now() });
        // Work takes a while, so adds land while a key is being processed.
        await new Promise((r) => setTimeout(r, 5));
        running.delete(key);
        const a = answers[n++ % answers.length];
        if (a === 'fail') throw new Error('reconcile failed');
        return a === undefined ? {} : { requeueAfterMs: a };
      }, { concurrency, dueStepMs: step, baseBackoffMs: 10, maxBackoffMs: 100 });
      queue.start();
      const asked: { key: string; at: number; dueMs: number }[] = [];
      for (const o of ops) {
        if (o.kind === 'add') {
          asked.push({ key: o.key, at: Date.now(), dueMs: Date.now() + o.delayMs });
          queue.add(o.key, o.delayMs);
        } else {
          await vi.advanceTimersByTimeAsync(o.ms);
        }
      }
      await vi.advanceTimersByTimeAsync(2_000 + step + 5);
      queue.stop();
      for (const a of asked) {
        // A run that starts at or after the add answers it (one already under way runs once more).
        const answered = starts.find((s) => s.key === a.key && s.at >= a.at && s.at <= Math.ceil(a.dueMs / step) * step + BUSY_MS);
        expect(answered, `add of ${a.key} at ${a.at} due ${a.dueMs} (step ${step})`).toBeDefined();
      }
    }), { numRuns: PROPERTY_RUNS });
  });

  it('lets keys parked moments apart fall due in one timer firing on a due step', async () => {
    const runs: { key: string; at: number }[] = [];
    const setTimeoutSpy = vi.spyOn(globalThis, 'setTimeout');
    const queue = new KeyedQueue(async (key) => void runs.push({ key, at: Date.now() }), { concurrency: 4, dueStepMs: 250 });
    queue.start();
    // 100 keys parked over 200 ms, each 1 s ahead, all within one step (starting just past a multiple of 250).
    vi.setSystemTime(1_000_001);
    for (let i = 0; i < 100; i++) {
      queue.add(`k${i}`, 1_000);
      await vi.advanceTimersByTimeAsync(2);
    }
    const armed = setTimeoutSpy.mock.calls.length;
    await vi.advanceTimersByTimeAsync(1_300);
    expect(runs).toHaveLength(100);
    expect(new Set(runs.map((r) => r.at))).toEqual(new Set([1_001_250]));
    expect(armed).toBeLessThanOrEqual(2);
    queue.stop();
    setTimeoutSpy.mockRestore();
  });

  it('without a due step, keeps each key\'s own due time', async () => {
    const runs: { key: string; at: number }[] = [];
    const queue = new KeyedQueue(async (key) => void runs.push({ key, at: Date.now() }), { concurrency: 4 });
    queue.start();
    const t0 = Date.now();
    queue.add('a', 1_000);
    await vi.advanceTimersByTimeAsync(7);
    queue.add('b', 1_000);
    await vi.advanceTimersByTimeAsync(1_100);
    expect(runs).toEqual([{ key: 'a', at: t0 + 1_000 }, { key: 'b', at: t0 + 1_007 }]);
    queue.stop();
  });

  it('refuses a due step that is not a positive integer', () => {
    expect(() => new KeyedQueue(async () => undefined, { concurrency: 1, dueStepMs: 0 })).toThrow(RangeError);
    expect(() => new KeyedQueue(async () => undefined, { concurrency: 1, dueStepMs: 2.5 })).toThrow(RangeError);
  });
});
