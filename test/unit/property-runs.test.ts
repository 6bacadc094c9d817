// Every fast-check property under test/ takes its run count from the one knob
// (test/support/property-runs.ts, issue 19), so the run counts ARCHITECTURE.md states are the ones
// CI runs: each fc.assert passes `numRuns: PROPERTY_RUNS` (or MODEL_RUNS for a real-stack model),
// no file reads FC_NUM_RUNS or MODEL_RUNS itself, no property has a run count of its own, and the
// "## Testing" section quotes the defaults (property runs, model runs and seeds, leader-kill schedules).
import { readFileSync, readdirSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';
import { MODEL_RUNS, PROPERTY_RUNS } from '../support/property-runs.ts';

const root = join(import.meta.dirname, '..', '..');
const KNOB = join('test', 'support', 'property-runs.ts');
const SELF = relative(root, import.meta.filename);

function tsFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const path = join(dir, e.name);
    if (e.isDirectory()) return tsFiles(path);
    return e.name.endsWith('.ts') ? [path] : [];
  });
}

const count = (text: string, re: RegExp): number => text.match(re)?.length ?? 0;

describe('property run counts (one knob)', () => {
  const files = tsFiles(join(root, 'test')).map((path) => ({ file: relative(root, path), text: readFileSync(path, 'utf8') })).filter((f) => f.file !== SELF);

  it('the defaults are what ARCHITECTURE.md states: 1,000 per unit property', () => {
    if (process.env.FC_NUM_RUNS === undefined) expect(PROPERTY_RUNS).toBe(1_000);
    expect(MODEL_RUNS).toBeGreaterThan(0);
  });

  it('every fc.assert under test/ passes the knob as its run count', () => {
    const properties = files.filter((f) => f.text.includes('fc.assert('));
    // The files this issue named must be among them (a rename must not make the check vacuous).
    expect(properties.map((f) => f.file)).toEqual(expect.arrayContaining([
      'test/unit/runner-sdk/properties.test.ts', 'test/unit/control-plane/lease-policy.test.ts', 'test/unit/docker/stream-and-errors.test.ts',
      'test/unit/api/mapping.test.ts', 'test/unit/api/errors.test.ts', 'test/unit/api/peer-identity.test.ts',
      'test/integration/api/runner-api.model.test.ts', 'test/seam/runner-server.seam-backend.test.ts',
    ]));
    const wrong = properties
      .map((f) => ({ file: f.file, asserts: count(f.text, /fc\.assert\(/g), knobbed: count(f.text, /numRuns: (PROPERTY_RUNS|MODEL_RUNS)\b/g) }))
      .filter((f) => f.asserts !== f.knobbed);
    expect(wrong, 'files whose fc.assert calls do not all pass numRuns: PROPERTY_RUNS / MODEL_RUNS').toEqual([]);
  });

  it('ARCHITECTURE.md "## Testing" states the counts CI runs', () => {
    const arch = readFileSync(join(root, 'ARCHITECTURE.md'), 'utf8');
    const from = arch.indexOf('\n## Testing');
    const to = arch.indexOf('\n## ', from + 1);
    const testing = arch.slice(from, to === -1 ? undefined : to).replace(/\s+/g, ' ');
    const source = (file: string): string => files.find((f) => f.file === file)!.text;
    if (!('FC_NUM_RUNS' in process.env)) expect(testing).toContain(`${PROPERTY_RUNS.toLocaleString('en-US')} runs per property`);
    const fixedSeeds = /const FIXED_SEEDS = \[([^\]]*)\]/.exec(source('test/integration/api/runner-api.model.test.ts'))![1]!.split(',').filter((x) => x.trim() !== '').length;
    if (!('MODEL_RUNS' in process.env)) expect(testing).toContain(`CI: ${MODEL_RUNS} runs per seed, ${MODEL_RUNS * (fixedSeeds + 1)} runs`);
    const schedules = /SF_LEADER_KILL_SCHEDULES \?\? (\d+)/.exec(source('test/integration/control-plane/leader-kill.test.ts'))![1];
    expect(testing).toContain(`${schedules} schedules in CI`);
  });

  it('no test has a run count or reads the run-count variables of its own', () => {
    const own = files
      .filter((f) => f.file !== KNOB)
      .filter((f) => /numRuns\s*:\s*\d|process\.env\.(FC_NUM_RUNS|MODEL_RUNS)\b|env\[['"](FC_NUM_RUNS|MODEL_RUNS)['"]\]|fc\.configureGlobal/.test(f.text))
      .map((f) => f.file);
    expect(own).toEqual([]);
  });
});
