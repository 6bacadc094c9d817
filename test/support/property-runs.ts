// The one knob for how many cases the property and model tests run (issue 19). Every fast-check
// property under test/ takes its run count from here (test/unit/property-runs.test.ts checks that),
// so the numbers CI runs are the ones ARCHITECTURE.md "## Testing" states, and one variable raises
// or lowers all of them (scripts/soak raises them).
//   FC_NUM_RUNS  runs of every unit/seam property (default 1,000);
//   MODEL_RUNS   runs per seed of a model test over the real stack (default 40; see MODEL_RUNS below);
//   FC_SEED      replay one seed of a real-stack model test instead of its seed list.
import { randomInt } from 'node:crypto';

function positiveInt(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const n = Number(raw);
  // A typo must not silently turn a property into 0 or NaN runs (fast-check would then run 100).
  if (!Number.isSafeInteger(n) || n < 1) throw new Error(`${name} must be a positive integer, got ${JSON.stringify(raw)}`);
  return n;
}

/** Runs of every pure property (unit tests and the in-memory seam tests). */
export const PROPERTY_RUNS = positiveInt('FC_NUM_RUNS', 1_000);

/**
 * Runs per seed of a model test over the real stack (real nats-server, control plane, agent and
 * dockerd; each run is a fresh conversation of 10..25 commands). The default is what fits the CI
 * budget stated in ARCHITECTURE.md "## Testing" for test/integration/api/runner-api.model.test.ts.
 */
export const MODEL_RUNS = positiveInt('MODEL_RUNS', 40);

export interface ModelSeed {
  readonly seed: number;
  /** `fixed`: from the test's seed list; `random`: new this run (always printed); `FC_SEED`: a replay. */
  readonly origin: 'fixed' | 'random' | 'FC_SEED';
}

/**
 * The seeds a real-stack model test runs: its fixed list plus one fresh random seed, or only the
 * seed in FC_SEED (to replay a printed one). The caller prints every seed before running it.
 */
export function modelSeeds(fixed: readonly number[]): ModelSeed[] {
  const replay = process.env.FC_SEED;
  if (replay !== undefined && replay !== '') {
    const seed = Number(replay);
    if (!Number.isSafeInteger(seed)) throw new Error(`FC_SEED must be an integer, got ${JSON.stringify(replay)}`);
    return [{ seed, origin: 'FC_SEED' }];
  }
  return [...fixed.map((seed) => ({ seed, origin: 'fixed' as const })), { seed: randomInt(0, 2 ** 31 - 1), origin: 'random' }];
}
