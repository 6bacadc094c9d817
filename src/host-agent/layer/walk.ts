// The walk of an overlay upper dir that decides what a capture reads (issue #17): every entry with
// its lstat (nanosecond times, inode, links), in the order GNU tar's `--sort=name` archives a tree
// (depth first, a directory before its contents, names in byte order), so the list handed to tar
// (`--no-recursion --files-from`) yields the archive a recursive `tar --sort=name` would.
// Like tar: sockets are skipped (tar ignores them), and a directory on another file system is listed
// but not entered (`--one-file-system`). Names are kept as raw bytes (a latin1 string is a lossless
// carrier for them): tar gets exactly the names on disk.
// Async, with bounded parallel lstat calls: a walk of a large tree must not hold the agent's event
// loop (heartbeats) for its whole duration, nor flood the libuv pool.
import { lstat, readdir } from 'node:fs/promises';
import { LayerRuleError } from '../../core/layer-rules.ts';

/** What a capture compares between two walks (times in ns: two writes in one second differ). */
export interface EntryStat {
  readonly dev: bigint;
  readonly ino: bigint;
  /** st_mode: file type and permission bits. */
  readonly mode: number;
  readonly nlink: number;
  readonly uid: number;
  readonly gid: number;
  readonly size: number;
  readonly mtimeNs: bigint;
  readonly ctimeNs: bigint;
}

export interface WalkEntry {
  /** Relative name as raw bytes in a latin1 string: `.` for the root, else `a/b/c`. */
  readonly key: string;
  readonly stat: EntryStat;
}

export const S_IFMT = 0o170000;
export const S_IFDIR = 0o040000;
export const S_IFREG = 0o100000;
export const S_IFLNK = 0o120000;
export const S_IFCHR = 0o020000;
const S_IFSOCK = 0o140000;

/** lstat calls in flight at once (the libuv pool has 4 threads; more only queues). */
const STAT_PARALLEL = 16;

async function statOf(path: Buffer): Promise<EntryStat> {
  const st = await lstat(path, { bigint: true });
  return {
    dev: st.dev,
    ino: st.ino,
    mode: Number(st.mode),
    nlink: Number(st.nlink),
    uid: Number(st.uid),
    gid: Number(st.gid),
    size: Number(st.size),
    mtimeNs: st.mtimeNs,
    ctimeNs: st.ctimeNs,
  };
}

/** The tar list form of a key: `./a/b` (`.` for the root), raw bytes. */
export function tarName(key: string): Buffer {
  return Buffer.from(key === '.' ? '.' : `./${key}`, 'latin1');
}

/** The key as text (UTF-8 decoded), for messages and the layer's entry names. */
export function keyText(key: string): string {
  return Buffer.from(key, 'latin1').toString('utf8');
}

/**
 * Walk `root` in GNU tar `--sort=name` order. Stops with LayerRuleError `too_many_entries` once more
 * than `maxEntries` entries were seen (the layer could not be captured anyway; memory stays bounded).
 */
export async function walkUpperDir(root: string, maxEntries: number): Promise<WalkEntry[]> {
  const rootBuf = Buffer.from(root);
  const rootStat = await statOf(rootBuf);
  if ((rootStat.mode & S_IFMT) !== S_IFDIR) throw new Error(`${root} is not a directory`);
  const out: WalkEntry[] = [{ key: '.', stat: rootStat }];
  const visit = async (dirKey: string): Promise<void> => {
    const dirPath = dirKey === '.' ? rootBuf : Buffer.concat([rootBuf, Buffer.from('/'), Buffer.from(dirKey, 'latin1')]);
    const names = (await readdir(dirPath, { encoding: 'buffer' })).sort(Buffer.compare);
    const children: (WalkEntry | null)[] = new Array<WalkEntry | null>(names.length).fill(null);
    for (let i = 0; i < names.length; i += STAT_PARALLEL) {
      await Promise.all(
        names.slice(i, i + STAT_PARALLEL).map(async (name, j) => {
          const key = dirKey === '.' ? name.toString('latin1') : `${dirKey}/${name.toString('latin1')}`;
          const stat = await statOf(Buffer.concat([dirPath, Buffer.from('/'), name]));
          children[i + j] = { key, stat };
        }),
      );
    }
    for (const child of children) {
      if (child === null || (child.stat.mode & S_IFMT) === S_IFSOCK) continue;
      out.push(child);
      if (out.length > maxEntries) throw new LayerRuleError('too_many_entries', `more than ${maxEntries} entries`, keyText(child.key));
      if ((child.stat.mode & S_IFMT) === S_IFDIR && child.stat.dev === rootStat.dev) await visit(child.key);
    }
  };
  await visit('.');
  return out;
}
