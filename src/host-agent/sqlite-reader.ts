// A read-only reader of SQLite database files, enough to list one table's rows (R-G3, R-G5): OpenCode
// and Kilo keep their sessions in SQLite (`~/.local/share/opencode/opencode.db`), and the checkpoint
// names a session, and the cold-start check proves it, by the CLI's own session table. Why our own
// reader rather than a SQLite library: the database lies in a layer that came from a sandbox (or from
// another host), and must be read without ever writing next to it (a SQLite connection, even
// read-only, creates `-shm` files and may recover the WAL into the database), without native code in
// the agent, and within bounds. Only what a lookup needs is implemented: the file header, the
// write-ahead log (committed frames with valid checksums, the newest copy of each page wins, exactly
// what a reader sees), table b-trees with overflow pages, and records. Anything else (an unknown
// page type, a cycle, a text encoding other than UTF-8) is refused as `sqlite_unreadable`.
import { closeSync, constants, fstatSync, lstatSync, openSync, readSync } from 'node:fs';

export class SqliteReadError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'SqliteReadError';
  }
}

/** Bounds: a database or log larger than this is not read (a session store is far smaller). */
export const MAX_SQLITE_BYTES = 2 * 1024 * 1024 * 1024;
/** Pages one lookup may visit (a hostile b-tree cannot make it run long). */
export const MAX_PAGE_VISITS = 2_000_000;

const HEADER = Buffer.from('SQLite format 3\0', 'latin1');
const WAL_MAGIC_LE = 0x377f0682;
const WAL_MAGIC_BE = 0x377f0683;

export type SqlValue = null | number | bigint | string | Buffer;

/** Whether a file starts like a SQLite database (the first 16 bytes). */
export function isSqliteHeader(first16: Buffer): boolean {
  return first16.length >= 16 && first16.subarray(0, 16).equals(HEADER);
}

/** One database as a reader sees it: the file, overlaid with the committed pages of its WAL. */
export class SqliteSnapshot {
  readonly pageSize: number;
  readonly usable: number;
  readonly pageCount: number;
  readonly #fd: number;
  readonly #walFd: number | undefined;
  readonly #walPages: Map<number, number>;
  #visits = 0;

  private constructor(fd: number, walFd: number | undefined, pageSize: number, reserved: number, pageCount: number, walPages: Map<number, number>) {
    this.#fd = fd;
    this.#walFd = walFd;
    this.pageSize = pageSize;
    this.usable = pageSize - reserved;
    this.pageCount = pageCount;
    this.#walPages = walPages;
  }

  /**
   * Open `dbPath` (and `<dbPath>-wal` when it is a regular file) for reading. The caller has checked
   * that neither is reached through a symlink; neither is ever written.
   */
  static open(dbPath: string): SqliteSnapshot {
    // O_NOFOLLOW: the last component is never a link (the caller checked every directory on the way).
    const fd = openSync(dbPath, constants.O_RDONLY | constants.O_NOFOLLOW);
    let walFd: number | undefined;
    try {
      const size = fstatSync(fd).size;
      if (size > MAX_SQLITE_BYTES) throw new SqliteReadError(`${size} bytes (at most ${MAX_SQLITE_BYTES})`);
      const header = Buffer.alloc(100);
      const got = readSync(fd, header, 0, 100, 0);
      if (got < 100 || !isSqliteHeader(header)) throw new SqliteReadError('not a SQLite database (header)');
      let pageSize = header.readUInt16BE(16);
      if (pageSize === 1) pageSize = 65536;
      if (pageSize < 512 || pageSize > 65536 || (pageSize & (pageSize - 1)) !== 0) throw new SqliteReadError(`page size ${pageSize}`);
      const reserved = header[20]!;
      if (header.readUInt32BE(56) > 1) throw new SqliteReadError(`text encoding ${header.readUInt32BE(56)} (only UTF-8 is read)`);
      const headerPages = header.readUInt32BE(92) === header.readUInt32BE(24) ? header.readUInt32BE(28) : 0;
      let pageCount = headerPages > 0 ? headerPages : Math.floor(size / pageSize);
      let walPages = new Map<number, number>();
      const wal = `${dbPath}-wal`;
      const walStat = (() => {
        try {
          return lstatSync(wal);
        } catch {
          return undefined;
        }
      })();
      if (walStat?.isFile() === true && walStat.size > 32) {
        if (walStat.size > MAX_SQLITE_BYTES) throw new SqliteReadError(`write-ahead log of ${walStat.size} bytes`);
        walFd = openSync(wal, constants.O_RDONLY | constants.O_NOFOLLOW);
        const read = readWal(walFd, walStat.size, pageSize);
        if (read !== undefined) {
          walPages = read.pages;
          pageCount = read.pageCount;
        }
      }
      return new SqliteSnapshot(fd, walFd, pageSize, reserved, pageCount, walPages);
    } catch (err) {
      closeSync(fd);
      if (walFd !== undefined) closeSync(walFd);
      throw err;
    }
  }

  close(): void {
    closeSync(this.#fd);
    if (this.#walFd !== undefined) closeSync(this.#walFd);
  }

  page(n: number): Buffer {
    if (!Number.isInteger(n) || n < 1 || n > this.pageCount) throw new SqliteReadError(`page ${n} outside the database (1..${this.pageCount})`);
    if (++this.#visits > MAX_PAGE_VISITS) throw new SqliteReadError(`more than ${MAX_PAGE_VISITS} page reads`);
    const buf = Buffer.alloc(this.pageSize);
    const fromWal = this.#walPages.get(n);
    const got = fromWal !== undefined ? readSync(this.#walFd!, buf, 0, this.pageSize, fromWal) : readSync(this.#fd, buf, 0, this.pageSize, (n - 1) * this.pageSize);
    if (got !== this.pageSize) throw new SqliteReadError(`page ${n} is truncated`);
    return buf;
  }

  /** Every row of the table b-tree rooted at `root`, in rowid order; `visit` returns true to stop. */
  scanTable(root: number, visit: (values: SqlValue[]) => boolean): void {
    const seen = new Set<number>();
    const walk = (n: number): boolean => {
      if (seen.has(n)) throw new SqliteReadError(`page ${n} reached twice (a cycle)`);
      seen.add(n);
      const page = this.page(n);
      const at = n === 1 ? 100 : 0;
      const type = page[at];
      const cells = page.readUInt16BE(at + 3);
      if (type === 0x0d) {
        for (let i = 0; i < cells; i++) {
          const ptr = page.readUInt16BE(at + 8 + 2 * i);
          if (visit(this.#leafRecord(page, ptr))) return true;
        }
        return false;
      }
      if (type !== 0x05) throw new SqliteReadError(`page ${n}: type ${type} is not a table b-tree page`);
      for (let i = 0; i < cells; i++) {
        const ptr = page.readUInt16BE(at + 12 + 2 * i);
        if (walk(page.readUInt32BE(ptr))) return true;
      }
      return walk(page.readUInt32BE(at + 8));
    };
    walk(root);
  }

  /** The record of a table leaf cell at `ptr`, its payload put together from overflow pages. */
  #leafRecord(page: Buffer, ptr: number): SqlValue[] {
    const [payloadSize, afterSize] = varint(page, ptr);
    const [, p] = varint(page, afterSize); // past the rowid
    const size = Number(payloadSize);
    const u = this.usable;
    const x = u - 35;
    let local = size;
    if (size > x) {
      const m = Math.floor(((u - 12) * 32) / 255) - 23;
      const k = m + ((size - m) % (u - 4));
      local = k <= x ? k : m;
    }
    if (p + local > page.length) throw new SqliteReadError('a cell runs past its page');
    const parts = [page.subarray(p, p + local)];
    let have = local;
    let next = local < size ? page.readUInt32BE(p + local) : 0;
    const seen = new Set<number>();
    while (have < size) {
      if (next === 0 || seen.has(next)) throw new SqliteReadError('a broken overflow chain');
      seen.add(next);
      const o = this.page(next);
      const take = Math.min(u - 4, size - have);
      parts.push(o.subarray(4, 4 + take));
      have += take;
      next = o.readUInt32BE(0);
    }
    return decodeRecord(parts.length === 1 ? parts[0]! : Buffer.concat(parts));
  }

  /** sqlite_schema rows: [type, name, tbl_name, rootpage, sql]. */
  schema(): Array<{ type: string; name: string; rootpage: number; sql: string }> {
    const out: Array<{ type: string; name: string; rootpage: number; sql: string }> = [];
    this.scanTable(1, (v) => {
      out.push({ type: String(v[0] ?? ''), name: String(v[1] ?? ''), rootpage: Number(v[3] ?? 0), sql: typeof v[4] === 'string' ? v[4] : '' });
      return out.length > 10_000;
    });
    return out;
  }
}

/** The committed pages of a WAL: the newest frame of each page up to the last valid commit. */
function readWal(fd: number, size: number, dbPageSize: number): { pages: Map<number, number>; pageCount: number } | undefined {
  const header = Buffer.alloc(32);
  readSync(fd, header, 0, 32, 0);
  const magic = header.readUInt32BE(0);
  if (magic !== WAL_MAGIC_LE && magic !== WAL_MAGIC_BE) return undefined;
  const bigEndian = magic === WAL_MAGIC_BE;
  const pageSize = header.readUInt32BE(8) === 1 ? 65536 : header.readUInt32BE(8);
  if (pageSize !== dbPageSize) return undefined;
  let [s0, s1] = checksum(header.subarray(0, 24), bigEndian, 0, 0);
  if (s0 !== header.readUInt32BE(24) || s1 !== header.readUInt32BE(28)) return undefined;
  const salt1 = header.readUInt32BE(16);
  const salt2 = header.readUInt32BE(20);
  const frameSize = 24 + pageSize;
  const pending = new Map<number, number>();
  const committed = new Map<number, number>();
  let pageCount = 0;
  const frame = Buffer.alloc(frameSize);
  for (let off = 32; off + frameSize <= size; off += frameSize) {
    if (readSync(fd, frame, 0, frameSize, off) !== frameSize) break;
    if (frame.readUInt32BE(8) !== salt1 || frame.readUInt32BE(12) !== salt2) break;
    [s0, s1] = checksum(frame.subarray(0, 8), bigEndian, s0, s1);
    [s0, s1] = checksum(frame.subarray(24), bigEndian, s0, s1);
    if (s0 !== frame.readUInt32BE(16) || s1 !== frame.readUInt32BE(20)) break;
    pending.set(frame.readUInt32BE(0), off + 24);
    const commitSize = frame.readUInt32BE(4);
    if (commitSize > 0) {
      for (const [n, at] of pending) committed.set(n, at);
      pending.clear();
      pageCount = commitSize;
    }
  }
  if (pageCount === 0) return undefined;
  return { pages: committed, pageCount };
}

/** SQLite's WAL checksum over 32-bit words, continuing from (s0, s1). */
function checksum(data: Buffer, bigEndian: boolean, s0: number, s1: number): [number, number] {
  for (let i = 0; i + 8 <= data.length; i += 8) {
    const a = bigEndian ? data.readUInt32BE(i) : data.readUInt32LE(i);
    const b = bigEndian ? data.readUInt32BE(i + 4) : data.readUInt32LE(i + 4);
    s0 = (s0 + a + s1) >>> 0;
    s1 = (s1 + b + s0) >>> 0;
  }
  return [s0, s1];
}

/** A SQLite varint at `p`: [value, next offset]. */
function varint(buf: Buffer, p: number): [bigint, number] {
  let v = 0n;
  for (let i = 0; i < 9; i++) {
    if (p + i >= buf.length) throw new SqliteReadError('a varint runs past its buffer');
    const b = buf[p + i]!;
    if (i === 8) return [(v << 8n) | BigInt(b), p + 9];
    v = (v << 7n) | BigInt(b & 0x7f);
    if ((b & 0x80) === 0) return [v, p + i + 1];
  }
  return [v, p + 9];
}

function decodeRecord(rec: Buffer): SqlValue[] {
  const [headerSize, first] = varint(rec, 0);
  const end = Number(headerSize);
  if (end > rec.length) throw new SqliteReadError('a record header runs past its payload');
  const types: bigint[] = [];
  for (let p = first; p < end;) {
    const [t, next] = varint(rec, p);
    types.push(t);
    p = next;
  }
  const values: SqlValue[] = [];
  let at = end;
  const take = (n: number): Buffer => {
    if (at + n > rec.length) throw new SqliteReadError('a record value runs past its payload');
    const b = rec.subarray(at, at + n);
    at += n;
    return b;
  };
  for (const t of types) {
    const n = Number(t);
    if (n === 0) values.push(null);
    else if (n >= 1 && n <= 6) {
      const len = [0, 1, 2, 3, 4, 6, 8][n]!;
      const b = take(len);
      let v = BigInt.asIntN(len * 8, BigInt(`0x${b.toString('hex')}`));
      if (len === 0) v = 0n;
      values.push(v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v);
    } else if (n === 7) values.push(take(8).readDoubleBE(0));
    else if (n === 8) values.push(0);
    else if (n === 9) values.push(1);
    else if (n >= 12 && n % 2 === 0) values.push(Buffer.from(take((n - 12) / 2)));
    else if (n >= 13) values.push(take((n - 13) / 2).toString('utf8'));
    else throw new SqliteReadError(`serial type ${n}`);
  }
  return values;
}

/** Column names of a `CREATE TABLE` statement, in order (constraints left out). */
export function tableColumns(sql: string): string[] {
  const open = sql.indexOf('(');
  const close = sql.lastIndexOf(')');
  if (open === -1 || close <= open) return [];
  const body = sql.slice(open + 1, close);
  const parts: string[] = [];
  let depth = 0;
  let cur = '';
  for (const ch of body) {
    if (ch === '(') depth++;
    if (ch === ')') depth--;
    if (ch === ',' && depth === 0) {
      parts.push(cur);
      cur = '';
    } else cur += ch;
  }
  parts.push(cur);
  return parts
    .map((p) => p.trim())
    .filter((p) => p !== '' && !/^(constraint|primary|foreign|unique|check)\b/i.test(p))
    .map((p) => /^[`"[]?([^`"\]\s]+)/.exec(p)?.[1] ?? '');
}

/**
 * Look up one row of `table` by the text value of `column` (a scan: session tables are small).
 * Returns the row as column → value, or undefined. Throws SqliteReadError on an unreadable file.
 */
export function findRow(dbPath: string, table: string, column: string, value: string): Record<string, SqlValue> | undefined {
  const db = SqliteSnapshot.open(dbPath);
  try {
    const entry = db.schema().find((s) => s.type === 'table' && s.name === table);
    if (entry === undefined) return undefined;
    const columns = tableColumns(entry.sql);
    const index = columns.indexOf(column);
    if (index === -1) throw new SqliteReadError(`table ${table} has no column ${column}`);
    let found: Record<string, SqlValue> | undefined;
    db.scanTable(entry.rootpage, (v) => {
      if (v[index] !== value) return false;
      found = Object.fromEntries(columns.map((c, i) => [c, v[i] ?? null]));
      return true;
    });
    return found;
  } finally {
    db.close();
  }
}
