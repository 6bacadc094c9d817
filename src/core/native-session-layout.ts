// Where each native CLI keeps a session's history inside its container (R-G3, R-G5). A checkpoint
// names the member's native session files in its manifest, and a restore proves they arrived with
// the saved locator before the group is placed (cold-start recovery check). The host agent finds
// the files in the member's writable layer at checkpoint time with these rules; the control plane
// cannot know them (home directory and working directory are the CLI's business).
//
// `enforced` layouts are verified against the pinned CLI itself; for them, a member with a saved
// locator whose session file is not in its layer is NOT recoverable: the session is gone, and a
// "restore" would only start a fresh session under the old locator (the incident behind R-S2). The
// checkpoint is refused (`session_files_missing`) and a group that must move is LOST with that
// reason. Unverified layouts are used when they find something (the restore then proves it) and
// never refuse: guessing wrong there would make every migration of that CLI LOST.
//
// OpenCode and Kilo keep their sessions in one SQLite database (`sqlite`): the layout names that
// file, and the session is named and proven by the CLI's own session table, read read-only by the
// agent (host-agent/sqlite-reader.ts): a row whose id is the locator and that has no parent (a Task
// child session is never a member's locator).
import type { CliKind } from './turn-end-evidence.ts';

/** A session store that is a SQLite database: the row of `table` whose `idColumn` is the locator. */
export interface SqliteSessionStore {
  readonly table: string;
  readonly idColumn: string;
  /** A root session has NULL here. */
  readonly parentColumn: string;
}

export interface NativeSessionLayout {
  /** The sessions directory, relative to the CLI user's home directory. */
  readonly root: string;
  /** Directory levels between `root` and a session file (e.g. one per project, or YYYY/MM/DD). */
  readonly depth: number;
  /** Whether a file name (no directory) is a session file of `locator`. */
  readonly isSessionFile: (fileName: string, locator: string) => boolean;
  /** Verified against the pinned CLI: a missing file makes the checkpoint unusable. */
  readonly enforced: boolean;
  /** Where the layout was verified (or why it is not). */
  readonly source: string;
  /** Set when the session file is a SQLite database holding every session (depth 0, one file name). */
  readonly sqlite?: SqliteSessionStore;
}

/** rollout-YYYY-MM-DDThh-mm-ss-<thread id>.jsonl: the fixed-width time makes the id unambiguous. */
const CODEX_ROLLOUT = /^rollout-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-(.+)\.jsonl$/;

export const NATIVE_SESSION_LAYOUTS: Readonly<Record<CliKind, NativeSessionLayout>> = {
  claude_code: {
    root: '.claude/projects',
    depth: 1,
    isSessionFile: (name, locator) => name === `${locator}.jsonl`,
    enforced: true,
    // <home>/.claude/projects/<cwd with / → ->/<session_id>.jsonl; sub-agent sidechains live one
    // level deeper and are not the root session (R-S4).
    source: 'claude-code 2.1.220, run in a container (test/integration/cli-history/claude-code.test.ts)',
  },
  pi: {
    root: '.pi/agent/sessions',
    depth: 1,
    // The timestamp part has no '_' (ISO time with ':' and '.' replaced by '-'), so the locator is
    // everything after the FIRST '_': a locator that ends another one never matches its file.
    isSessionFile: (name, locator) => name.endsWith('.jsonl') && /^[^_]+_/.test(name) && name.slice(name.indexOf('_') + 1, -'.jsonl'.length) === locator,
    enforced: true,
    // <home>/.pi/agent/sessions/<encoded cwd>/<timestamp>_<session id>.jsonl
    source: '@mariozechner/pi-coding-agent 0.73.1, run in a container (test/integration/cli-history/pi.test.ts)',
  },
  codex: {
    root: '.codex/sessions',
    depth: 3,
    isSessionFile: (name, locator) => CODEX_ROLLOUT.exec(name)?.[1] === locator,
    enforced: true,
    // <home>/.codex/sessions/YYYY/MM/DD/rollout-<timestamp>-<thread id>.jsonl (the binary also keeps
    // sqlite state next to it; the whole layer moves, the rollout file is what proves the thread).
    source: 'codex 0.171.0, run in a container (test/integration/cli-history/codex.test.ts)',
  },
  opencode: {
    root: '.local/share/opencode',
    depth: 0,
    // Every session in one database; the row proves the locator (the session row is often only in
    // opencode.db-wal until SQLite checkpoints it, which the reader applies as SQLite would).
    isSessionFile: (name) => name === 'opencode.db',
    enforced: true,
    sqlite: { table: 'session', idColumn: 'id', parentColumn: 'parent_id' },
    source: 'opencode 1.18.33 (`opencode serve` behind the live bridge), run in a container (test/integration/cli-history/opencode.test.ts)',
  },
  kilo: {
    root: '.local/share/kilo',
    depth: 0,
    isSessionFile: (name) => name === 'kilo.db',
    enforced: true,
    sqlite: { table: 'session', idColumn: 'id', parentColumn: 'parent_id' },
    source: 'kilo 7.7.7 (`kilo serve` behind the live bridge), run in a container (test/integration/cli-history/kilo.test.ts)',
  },
};

/** Home directories searched in a member's layer: root's, and each user's under /home. */
export const SESSION_HOMES = ['/root', '/home/*'] as const;

const SEGMENT = /^[^/\0]+$/;

/**
 * Whether `path` (absolute, inside the container) is a session file of `locator` for `cli`:
 * `<home>/<root>/<depth directories>/<file>` with `<home>` one of SESSION_HOMES.
 */
export function isNativeSessionPath(cli: CliKind, locator: string, path: string): boolean {
  const layout = NATIVE_SESSION_LAYOUTS[cli];
  if (locator === '' || locator.includes('/') || !path.startsWith('/')) return false;
  const parts = path.slice(1).split('/');
  const homeParts = parts[0] === 'root' ? 1 : parts[0] === 'home' ? 2 : 0;
  if (homeParts === 0 || (homeParts === 2 && !SEGMENT.test(parts[1] ?? ''))) return false;
  const rootParts = layout.root.split('/');
  if (parts.length !== homeParts + rootParts.length + layout.depth + 1) return false;
  if (rootParts.some((p, i) => parts[homeParts + i] !== p)) return false;
  const between = parts.slice(homeParts + rootParts.length, -1);
  if (!between.every((p) => SEGMENT.test(p) && p !== '.' && p !== '..')) return false;
  return layout.isSessionFile(parts[parts.length - 1]!, locator);
}

/**
 * The SQLite session store a path is, for a path some layout names as its database
 * (`<home>/<root>/<file>`), else undefined: how the cold-start check, which knows paths and the
 * locator but not the CLI, knows to prove the session by its row.
 */
export function sqliteStoreOf(path: string): SqliteSessionStore | undefined {
  for (const layout of Object.values(NATIVE_SESSION_LAYOUTS)) {
    if (layout.sqlite === undefined) continue;
    const parts = path.split('/');
    const name = parts[parts.length - 1] ?? '';
    const dir = parts.slice(0, -1).join('/');
    const home = dir.slice(0, dir.length - layout.root.length - 1);
    if (dir.endsWith(`/${layout.root}`) && layout.isSessionFile(name, '') && (home === '/root' || /^\/home\/[^/\0]+$/.test(home))) return layout.sqlite;
  }
  return undefined;
}
