// Finds a member's native session files in its writable layer (the overlay upper dir) at checkpoint
// time, by the CLI's layout (core/native-session-layout.ts). Only what the CLI wrote since the
// container was created is in the upper dir, which is exactly where a session's history lives.
// Never follows a symlink (the layer is the sandbox's, not ours) and reads a bounded number of
// directory entries: a layer full of files must not stall a checkpoint. A CLI that keeps its sessions
// in SQLite (OpenCode, Kilo) is named by its own session table: the database counts only when it
// holds the locator's root session row (read read-only, sqlite-reader.ts).
import { lstat, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { NATIVE_SESSION_LAYOUTS, isNativeSessionPath, type SqliteSessionStore } from '../core/native-session-layout.ts';
import type { CliKind } from '../core/turn-end-evidence.ts';
import { SqliteReadError, findRow } from './sqlite-reader.ts';

/** Bound on directory entries read per member (homes, projects, dated directories together). */
export const MAX_DISCOVERY_ENTRIES = 50_000;
/** Bound on user home directories looked at under /home. */
const MAX_HOMES = 64;

async function isRealDir(path: string): Promise<boolean> {
  try {
    return (await lstat(path)).isDirectory();
  } catch {
    return false;
  }
}

/** Absolute container paths of the session files of `locator`, sorted; [] when there are none. */
export async function discoverSessionFiles(upperDir: string, cli: CliKind, locator: string): Promise<string[]> {
  const layout = NATIVE_SESSION_LAYOUTS[cli];
  let budget = MAX_DISCOVERY_ENTRIES;
  const list = async (dir: string): Promise<string[]> => {
    if (budget <= 0) return [];
    const names = await readdir(dir).catch(() => [] as string[]);
    const kept = names.slice(0, budget);
    budget -= kept.length;
    return kept;
  };

  const homes = ['/root'];
  if (await isRealDir(join(upperDir, 'home'))) {
    for (const name of (await list(join(upperDir, 'home'))).slice(0, MAX_HOMES)) homes.push(`/home/${name}`);
  }
  const found: string[] = [];
  for (const home of homes) {
    // Every directory on the way must be a real directory in the layer (no symlink hops).
    let dirs = [`${home}/${layout.root}`];
    const parts = dirs[0]!.slice(1).split('/');
    let ok = true;
    for (let i = 1; i <= parts.length && ok; i++) ok = await isRealDir(join(upperDir, ...parts.slice(0, i)));
    if (!ok) continue;
    for (let level = 0; level < layout.depth; level++) {
      const next: string[] = [];
      for (const dir of dirs) {
        for (const name of await list(join(upperDir, dir))) {
          if (await isRealDir(join(upperDir, dir, name))) next.push(`${dir}/${name}`);
        }
      }
      dirs = next;
    }
    for (const dir of dirs) {
      for (const name of await list(join(upperDir, dir))) {
        const path = `${dir}/${name}`;
        if (!isNativeSessionPath(cli, locator, path)) continue;
        const st = await lstat(join(upperDir, path)).catch(() => undefined);
        if (!st?.isFile()) continue;
        if (layout.sqlite !== undefined && sqliteSessionProblem(join(upperDir, path), layout.sqlite, locator) !== undefined) continue;
        found.push(path);
      }
    }
  }
  return found.sort();
}

/**
 * Why the SQLite session store at `file` does not prove `locator` (undefined: it does): the row of
 * the locator must be there and be a root session (no parent). An unreadable database proves nothing.
 */
export function sqliteSessionProblem(file: string, store: SqliteSessionStore, locator: string): 'locator_absent' | 'not_a_root_session' | 'unreadable' | undefined {
  try {
    const row = findRow(file, store.table, store.idColumn, locator);
    if (row === undefined) return 'locator_absent';
    return row[store.parentColumn] === null || row[store.parentColumn] === undefined ? undefined : 'not_a_root_session';
  } catch (err) {
    if (err instanceof SqliteReadError || (err as NodeJS.ErrnoException).code !== undefined) return 'unreadable';
    throw err;
  }
}
