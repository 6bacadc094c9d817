// OpenCode and Kilo sessions in their SQLite store (R-G3, R-G5): the checkpoint names the store by
// the CLI's own session table and the cold-start check proves the locator's row is there, read
// read-only with the write-ahead log applied. The databases are the real ones the pinned binaries
// left (test/fixtures/sqlite, recorded by test/support/record-history-fixtures.ts together with the
// CLI's own `session list --format json`, the ground truth here). Also: what only the WAL holds is
// read (as SQLite reads it); a torn or foreign WAL frame is not applied; links are never followed;
// a file that is not a database, or a truncated one, proves nothing and never throws.
import { mkdtemp, mkdir, readFile, rm, symlink, truncate, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gunzipSync } from 'node:zlib';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { discoverSessionFiles } from '../../../src/host-agent/session-discovery.ts';
import { proveSessionFiles } from '../../../src/host-agent/session-proof.ts';
import { SqliteSnapshot, findRow, tableColumns } from '../../../src/host-agent/sqlite-reader.ts';

const FIXTURES = new URL('../../fixtures/sqlite/', import.meta.url);
let upper: string;

beforeEach(async () => {
  upper = await mkdtemp(join(tmpdir(), 'sf-sqlite-'));
});
afterEach(async () => {
  await rm(upper, { recursive: true, force: true });
});

const fixture = async (name: string): Promise<Buffer> => gunzipSync(await readFile(new URL(name, FIXTURES)));

/** Put the CLI's recorded store into the layer at `<home>/.local/share/<cli>/<cli>.db`; returns the container path and the listed ids. */
async function layStore(cli: 'opencode' | 'kilo', { home = 'root', wal = true }: { home?: string; wal?: boolean } = {}): Promise<{ path: string; ids: string[] }> {
  const dir = join(upper, home, '.local', 'share', cli);
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, `${cli}.db`), await fixture(`${cli}.db.gz`));
  if (wal) await writeFile(join(dir, `${cli}.db-wal`), await fixture(`${cli}.db-wal.gz`));
  const listed = JSON.parse(await readFile(new URL(`${cli}.sessions.json`, FIXTURES), 'utf8')) as Array<{ id: string }>;
  return { path: `/${home}/.local/share/${cli}/${cli}.db`, ids: listed.map((s) => s.id) };
}

describe.each(['opencode', 'kilo'] as const)('%s session store', (cli) => {
  it('names the store for every session the CLI lists, and the proof finds each one\'s row', async () => {
    const { path, ids } = await layStore(cli);
    expect(ids.length).toBeGreaterThan(0);
    for (const id of ids) {
      expect(await discoverSessionFiles(upper, cli, id)).toEqual([path]);
      expect(await proveSessionFiles(upper, [path], id)).toEqual([]);
    }
  });

  it('proves nothing for a session the store does not hold', async () => {
    const { path } = await layStore(cli);
    expect(await discoverSessionFiles(upper, cli, 'ses_0000000000000000000000000')).toEqual([]);
    expect(await proveSessionFiles(upper, [path], 'ses_0000000000000000000000000')).toEqual([{ path, problem: 'locator_absent' }]);
  });

  it('reads what SQLite would: the write-ahead log applied, never a torn or foreign frame, never a linked log', async () => {
    const { path, ids } = await layStore(cli);
    const file = join(upper, path);
    const listed = (JSON.parse(await readFile(new URL(`${cli}.sessions.json`, FIXTURES), 'utf8')) as Array<{ updated: number }>)[0]!.updated;
    const seen = (): { updated: unknown; messages: number } => {
      const db = SqliteSnapshot.open(file);
      try {
        let messages = 0;
        db.scanTable(db.schema().find((t) => t.name === 'message')!.rootpage, () => (messages++, false));
        return { updated: findRow(file, 'session', 'id', ids[0]!)?.time_updated, messages };
      } finally {
        db.close();
      }
    };
    // As recorded, the second turn (its two messages and the session's last update) is only in the log.
    expect(seen()).toEqual({ updated: listed, messages: 4 });
    const walBytes = await readFile(`${file}-wal`);
    await rm(`${file}-wal`);
    const without = seen();
    expect(without.messages).toBe(2);
    expect(without.updated).not.toBe(listed);
    // A log whose first frame is torn (one page byte changed): its checksum fails, nothing of it applies.
    const torn = Buffer.from(walBytes);
    torn[32 + 24 + 100] = torn[32 + 24 + 100]! ^ 0xff;
    await writeFile(`${file}-wal`, torn);
    expect(seen()).toEqual(without);
    // A log of another database generation (other salts): not applied either.
    const foreign = Buffer.from(walBytes);
    foreign.writeUInt32BE(foreign.readUInt32BE(16) ^ 1, 16);
    await writeFile(`${file}-wal`, foreign);
    expect(seen()).toEqual(without);
    // The log as a link to a good one elsewhere: never followed.
    await rm(`${file}-wal`);
    await writeFile(join(upper, 'elsewhere-wal'), walBytes);
    await symlink(join(upper, 'elsewhere-wal'), `${file}-wal`);
    expect(seen()).toEqual(without);
    await rm(`${file}-wal`);
    await writeFile(`${file}-wal`, walBytes);
    expect(seen()).toEqual({ updated: listed, messages: 4 });
    expect(await proveSessionFiles(upper, [path], ids[0]!)).toEqual([]);
  });

  it('never follows a link to the store, and proves nothing from a non-database or a truncated one', async () => {
    const { path, ids } = await layStore(cli);
    const file = join(upper, path);
    const real = join(upper, 'elsewhere.db');
    await writeFile(real, await readFile(file));
    await rm(file);
    await symlink(real, file);
    expect(await proveSessionFiles(upper, [path], ids[0]!)).toEqual([{ path, problem: 'not_a_regular_file' }]);
    expect(await discoverSessionFiles(upper, cli, ids[0]!)).toEqual([]);
    // A text file named like the store.
    await rm(file);
    await writeFile(file, `{"id":"${ids[0]}"}\n`);
    expect(await proveSessionFiles(upper, [path], ids[0]!)).toEqual([{ path, problem: 'unreadable' }]);
    // A truncated store and log: refused, never thrown.
    await writeFile(file, await fixture(`${cli}.db.gz`));
    await truncate(`${file}-wal`, 32 + 24 + 10);
    await truncate(file, 4096 + 17);
    const truncated = await proveSessionFiles(upper, [path], ids[0]!);
    expect(truncated).toHaveLength(1);
    expect(['unreadable', 'locator_absent']).toContain(truncated[0]!.problem);
  });

  it('finds the store in a user\'s home too, and only at the CLI\'s own place', async () => {
    const { path, ids } = await layStore(cli, { home: 'home/agent' });
    expect(await discoverSessionFiles(upper, cli, ids[0]!)).toEqual([path]);
    await mkdir(join(upper, 'srv'), { recursive: true });
    const other = cli === 'opencode' ? 'kilo' : 'opencode';
    expect(await discoverSessionFiles(upper, other, ids[0]!)).toEqual([]);
  });
});

describe('sqlite reader', () => {
  it('lists the tables of a real store and reads a session row by its columns', async () => {
    const { path, ids } = await layStore('opencode');
    const db = SqliteSnapshot.open(join(upper, path));
    try {
      const names = db.schema().filter((s) => s.type === 'table').map((s) => s.name);
      expect(names).toEqual(expect.arrayContaining(['session', 'message', 'part']));
    } finally {
      db.close();
    }
    const row = findRow(join(upper, path), 'session', 'id', ids[0]!);
    expect(row).toMatchObject({ id: ids[0], parent_id: null, title: 'ack MARK-ONE', version: '1.18.33' });
  });

  it('takes column names from CREATE TABLE, constraints left out', () => {
    expect(tableColumns('CREATE TABLE `session` (\n `id` text PRIMARY KEY,\n `parent_id` text,\n `x` numeric(10, 2),\n CONSTRAINT `fk` FOREIGN KEY (`parent_id`) REFERENCES `session`(`id`)\n)')).toEqual(['id', 'parent_id', 'x']);
  });
});
