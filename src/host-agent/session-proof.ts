// Cold-start recovery check (R-G5): after a restore, every native session file the manifest names
// must exist in the restored writable layer as a regular file and contain the recorded locator.
// Checked on the upper dir directly (before the container ever starts), never following a symlink:
// the layer came from elsewhere, and a link must not make the agent read a host file. A SQLite
// session store (OpenCode, Kilo: core/native-session-layout.ts) is proven by the CLI's own session
// table instead of by the locator's bytes: the row of the locator, a root session, read read-only
// with the write-ahead log applied (session-discovery.ts, sqlite-reader.ts).
import { createReadStream } from 'node:fs';
import { lstat } from 'node:fs/promises';
import { join } from 'node:path';
import { sqliteStoreOf } from '../core/native-session-layout.ts';
import { sqliteSessionProblem } from './session-discovery.ts';

/** Bound on the bytes scanned per session file (native histories are JSONL; this is generous). */
export const MAX_SCAN_BYTES = 512 * 1024 * 1024;

export interface SessionFileProblem {
  readonly path: string;
  readonly problem: 'missing' | 'not_a_regular_file' | 'locator_absent' | 'through_symlink' | 'not_a_root_session' | 'unreadable';
}

async function kindOf(path: string): Promise<'file' | 'dir' | 'symlink' | 'other' | 'missing'> {
  try {
    const st = await lstat(path);
    if (st.isSymbolicLink()) return 'symlink';
    if (st.isFile()) return 'file';
    if (st.isDirectory()) return 'dir';
    return 'other';
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT' || (err as NodeJS.ErrnoException).code === 'ENOTDIR') return 'missing';
    throw err;
  }
}

/** Whether `needle` occurs in the file, streaming with an overlap so a match across chunks counts. */
async function fileContains(path: string, needle: Buffer): Promise<boolean> {
  let tail = Buffer.alloc(0);
  let scanned = 0;
  for await (const chunk of createReadStream(path, { highWaterMark: 1024 * 1024 }) as AsyncIterable<Buffer>) {
    const window = Buffer.concat([tail, chunk]);
    if (window.includes(needle)) return true;
    tail = window.subarray(Math.max(0, window.length - needle.length + 1));
    scanned += chunk.length;
    if (scanned > MAX_SCAN_BYTES) return false;
  }
  return false;
}

/** Problems with one member's session files; empty means the member's native session is proven. */
export async function proveSessionFiles(upperDir: string, paths: readonly string[], locator: string | null): Promise<SessionFileProblem[]> {
  const problems: SessionFileProblem[] = [];
  const needle = locator === null ? undefined : Buffer.from(locator, 'utf8');
  for (const path of paths) {
    // Manifest paths are validated absolute, without '..' (core/checkpoint-manifest.ts).
    const parts = path.split('/').filter((p) => p !== '' && p !== '.');
    let here = upperDir;
    let problem: SessionFileProblem['problem'] | undefined;
    for (const [i, part] of parts.entries()) {
      here = join(here, part);
      const kind = await kindOf(here);
      const last = i === parts.length - 1;
      if (kind === 'missing') problem = 'missing';
      else if (kind === 'symlink') problem = last ? 'not_a_regular_file' : 'through_symlink';
      else if (!last && kind !== 'dir') problem = 'missing';
      else if (last && kind !== 'file') problem = 'not_a_regular_file';
      if (problem !== undefined) break;
    }
    if (problem === undefined && parts.length === 0) problem = 'not_a_regular_file';
    const store = sqliteStoreOf(path);
    if (problem === undefined && store !== undefined) {
      // The session store holds every session: only the locator's own row proves this one. A store
      // with no saved locator (no turn completed yet) has nothing to prove.
      if (locator !== null) problem = sqliteSessionProblem(here, store, locator);
    } else if (problem === undefined && needle !== undefined && !(await fileContains(here, needle))) problem = 'locator_absent';
    if (problem !== undefined) problems.push({ path, problem });
  }
  return problems;
}
