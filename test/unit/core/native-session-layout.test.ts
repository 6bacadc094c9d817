// Native session file rules (R-G3, R-G5): for every CLI, the path its layout produces for a locator
// is recognised, and nothing else is: not another locator (no prefix/suffix confusion), not a file
// at another depth (Claude sub-agent sidechains live one level deeper, R-S4), not outside a home.
// OpenCode and Kilo keep every session in one SQLite database: the layout names that file (for any
// locator; the session's row proves it, host-agent/session-proof.ts) and sqliteStoreOf finds it.
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { NATIVE_SESSION_LAYOUTS, isNativeSessionPath, sqliteStoreOf } from '../../../src/core/native-session-layout.ts';
import { CLI_KINDS, type CliKind } from '../../../src/core/turn-end-evidence.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

const segment = fc.stringMatching(/^[A-Za-z0-9_.-]{1,24}$/).filter((s) => s !== '.' && s !== '..');
const locator = fc.stringMatching(/^[A-Za-z0-9-]{1,40}$/);
const home = fc.oneof(fc.constant('/root'), segment.map((u) => `/home/${u}`));

/** The file name each CLI writes for a session (what its layout must accept). */
function fileName(cli: CliKind, loc: string, stamp: string): string {
  switch (cli) {
    case 'claude_code': return `${loc}.jsonl`;
    case 'pi': return `2026-11-30T10-00-00-000Z${stamp}_${loc}.jsonl`;
    case 'codex': return `rollout-2026-11-30T10-00-00${stamp}-${loc}.jsonl`;
    case 'opencode': return 'opencode.db';
    case 'kilo': return 'kilo.db';
  }
}

/** CLIs whose session file is named by the locator (not a SQLite store of every session). */
const FILE_CLIS = CLI_KINDS.filter((k) => NATIVE_SESSION_LAYOUTS[k].sqlite === undefined);

const sessionPath = fc.record({ cli: fc.constantFrom(...FILE_CLIS), loc: locator, home, dirs: fc.array(segment, { minLength: 3, maxLength: 3 }), stamp: fc.constant('') })
  .map(({ cli, loc, home: h, dirs, stamp }) => {
    const layout = NATIVE_SESSION_LAYOUTS[cli];
    return { cli, loc, path: [h, layout.root, ...dirs.slice(0, layout.depth), fileName(cli, loc, stamp)].join('/') };
  });

describe('native session layouts', () => {
  it('recognise the file each CLI writes for its locator', () => {
    fc.assert(fc.property(sessionPath, ({ cli, loc, path }) => isNativeSessionPath(cli, loc, path)), { numRuns: PROPERTY_RUNS });
  });

  it('never take another locator’s file, even one that extends or is extended by it', () => {
    fc.assert(fc.property(sessionPath, locator, ({ cli, loc, path }, other) => {
      fc.pre(other !== loc);
      return !isNativeSessionPath(cli, other, path) && !isNativeSessionPath(cli, `${loc}${other}`, path) && !isNativeSessionPath(cli, `x${loc}`, path);
    }), { numRuns: PROPERTY_RUNS });
  });

  it('refuse files one level deeper or shallower, outside a home, or of another CLI', () => {
    fc.assert(fc.property(sessionPath, segment, ({ cli, loc, path }, extra) => {
      const parts = path.split('/');
      const name = parts.pop()!;
      const deeper = [...parts, extra, name].join('/');
      const shallower = [...parts.slice(0, -1), name].join('/');
      const elsewhere = path.replace(/^\/(root|home\/[^/]+)\//, '/srv/');
      const others = CLI_KINDS.filter((k) => NATIVE_SESSION_LAYOUTS[k].root !== NATIVE_SESSION_LAYOUTS[cli].root);
      return !isNativeSessionPath(cli, loc, deeper)
        && (NATIVE_SESSION_LAYOUTS[cli].depth === 0 || !isNativeSessionPath(cli, loc, shallower))
        && !isNativeSessionPath(cli, loc, elsewhere)
        && others.every((k) => !isNativeSessionPath(k, loc, path));
    }), { numRuns: PROPERTY_RUNS });
  });

  it('match the Claude Code layout measured with the real CLI, and not its sub-agent sidechains', () => {
    const sid = '0f6c2a4e-1b7d-4c55-9f0e-3d2b1a0c9e87';
    expect(isNativeSessionPath('claude_code', sid, `/root/.claude/projects/-root/${sid}.jsonl`)).toBe(true);
    expect(isNativeSessionPath('claude_code', sid, `/home/agent/.claude/projects/-home-agent-work/${sid}.jsonl`)).toBe(true);
    expect(isNativeSessionPath('claude_code', sid, `/root/.claude/projects/-root/${sid}/subagents/${sid}.jsonl`)).toBe(false);
    expect(isNativeSessionPath('claude_code', sid, `/root/.claude/projects/../${sid}.jsonl`)).toBe(false);
    expect(isNativeSessionPath('claude_code', 'a/b', '/root/.claude/projects/-root/a/b.jsonl')).toBe(false);
  });

  it('enforce only layouts verified against the pinned CLI (all five)', () => {
    expect(Object.entries(NATIVE_SESSION_LAYOUTS).filter(([, l]) => l.enforced).map(([k]) => k).sort()).toEqual(['claude_code', 'codex', 'kilo', 'opencode', 'pi']);
  });

  it('name the SQLite session store of OpenCode and Kilo, in a home only, and nothing else as a store', () => {
    for (const [cli, file] of [['opencode', '/root/.local/share/opencode/opencode.db'], ['kilo', '/home/agent/.local/share/kilo/kilo.db']] as const) {
      expect(isNativeSessionPath(cli, 'ses_dcd5903eaffeDzqkdN8kEnrr9g', file)).toBe(true);
      expect(sqliteStoreOf(file)).toEqual({ table: 'session', idColumn: 'id', parentColumn: 'parent_id' });
      expect(isNativeSessionPath(cli, 'ses_x', `${file}-wal`)).toBe(false);
      expect(sqliteStoreOf(file.replace(/^\/(root|home\/agent)/, '/srv'))).toBeUndefined();
      expect(sqliteStoreOf(`${file}-wal`)).toBeUndefined();
    }
    expect(isNativeSessionPath('opencode', 'ses_x', '/root/.local/share/kilo/kilo.db')).toBe(false);
    fc.assert(fc.property(sessionPath, ({ path }) => sqliteStoreOf(path) === undefined), { numRuns: PROPERTY_RUNS });
  });
});
