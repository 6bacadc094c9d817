// The small helper process that starts short tar runs for the agent (small-process.ts): what it
// returns, where it stops, and that capture still works when it is gone (it is a speed-up only).
import { mkdtemp, mkdir, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULT_LAYER_LIMITS, LayerValidator } from '../../../src/core/layer-rules.ts';
import { OverlayToOci, TAR_HEADER_ALLOWANCE, headerOnly, runTar, smallTarRun, smallTarRunsUsedCount, tarOutputBound } from '../../../src/host-agent/layer/capture.ts';
import { TarParser } from '../../../src/host-agent/layer/tar-format.ts';
import { runSmall, smallProcessHelper } from '../../../src/host-agent/layer/small-process.ts';
import { AgentMetrics } from '../../../src/host-agent/metrics.ts';
import { FleetMetrics } from '../../../src/observability/metrics.ts';

const NO_INPUT = Buffer.alloc(0);

describe('small helper process', () => {
  it('runs a command with its input and returns its output and exit code', async () => {
    const r = await runSmall({ file: 'sh', args: ['-c', 'cat; echo " and more"; exit 3'], input: Buffer.from('hello'), maxOutputBytes: 1024 });
    expect(r).toMatchObject({ code: 3, truncated: false });
    expect(r!.stdout.toString()).toBe('hello and more\n');
  });

  it('stops a command at maxOutputBytes and says so', async () => {
    const r = await runSmall({ file: 'yes', args: [], input: NO_INPUT, maxOutputBytes: 10 });
    // Its exit is whatever a killed writer gives (SIGKILL, or EPIPE first): truncated says it was stopped.
    expect(r?.truncated).toBe(true);
    expect(r!.stdout.toString()).toBe('y\ny\ny\ny\ny\n');
  });

  it('answers a command that cannot start with its error, not by failing, and tar is then run directly', async () => {
    const r = await runSmall({ file: '/nonexistent/tar', args: [], input: NO_INPUT, maxOutputBytes: 10 });
    expect(r).toMatchObject({ code: null, truncated: false, spawnFailed: true });
    expect(r!.stderr).toMatch(/ENOENT/);
    expect(await smallTarRun(tmpdir(), [Buffer.from('.')], 1024, DEFAULT_LAYER_LIMITS, '/nonexistent/tar')).toBeUndefined();
  });

  it('starts a new helper after the old one died', async () => {
    await runSmall({ file: 'true', args: [], input: NO_INPUT, maxOutputBytes: 1 });
    const before = smallProcessHelper.pid;
    expect(before).toBeDefined();
    smallProcessHelper.kill();
    await new Promise((r) => setTimeout(r, 200));
    const r = await runSmall({ file: 'echo', args: ['back'], input: NO_INPUT, maxOutputBytes: 100 });
    expect(r?.stdout.toString()).toBe('back\n');
    expect(smallProcessHelper.pid).not.toBe(before);
  });
});

describe('tar runs through the helper', () => {
  let dir: string;
  const name = Buffer.from('./data/big.bin');
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'sf-small-tar-'));
    await mkdir(join(dir, 'data'));
    await writeFile(join(dir, 'data/big.bin'), Buffer.alloc(3 * 1024 * 1024, 7));
    // A name longer than ustar's 100 bytes: its header needs a PAX record.
    await writeFile(join(dir, 'data', 'n'.repeat(200)), 'x');
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  /**
   * A tar stream as the capture emits it (OCI form, every header re-encoded in one fixed form: tar's
   * own bytes differ from run to run, e.g. a PAX atime).
   */
  async function emitted(stdout: AsyncIterable<Buffer>): Promise<Buffer> {
    const oci = new OverlayToOci(new LayerValidator(DEFAULT_LAYER_LIMITS));
    const parser = new TarParser(oci, DEFAULT_LAYER_LIMITS.maxPaxHeaderBytes);
    for await (const p of stdout) parser.push(p);
    return Buffer.concat(oci.out);
  }

  /** The direct run's output, whole, as emitted. */
  async function direct(names: Buffer[]): Promise<Buffer> {
    const tar = runTar(dir, names);
    const out = await emitted(tar.stdout);
    await tar.done;
    return out;
  }

  it('gives the same bytes as tar run directly, when they fit', async () => {
    const names = [Buffer.from('./data'), Buffer.from(`./data/${'n'.repeat(200)}`)];
    const run = await smallTarRun(dir, names, tarOutputBound([0, 1]), DEFAULT_LAYER_LIMITS);
    expect(run).toBeDefined();
    const out = await emitted(run!.stdout);
    await run!.done;
    expect(out.length).toBeGreaterThan(1024);
    expect(out.equals(await direct(names))).toBe(true);
  });

  it('keeps a prefix only when it holds every header asked for; otherwise the caller runs tar itself', async () => {
    const answered = smallProcessHelper.answered;
    // The 3 MiB file's header is in the first 8 KiB; its data is not needed.
    const prefix = await smallTarRun(dir, [name], TAR_HEADER_ALLOWANCE, DEFAULT_LAYER_LIMITS, 'tar', 1);
    expect(prefix).toBeDefined();
    // A PAX header and the ustar header need more than 600 bytes: not kept.
    expect(await smallTarRun(dir, [Buffer.from(`./data/${'n'.repeat(200)}`)], 600, DEFAULT_LAYER_LIMITS, 'tar', 1)).toBeUndefined();
    // The whole output asked for, but it does not fit: not kept.
    expect(await smallTarRun(dir, [name], TAR_HEADER_ALLOWANCE, DEFAULT_LAYER_LIMITS)).toBeUndefined();
    expect(smallProcessHelper.answered).toBe(answered + 3);
  });

  it('a shared run cut short is used exactly when its last header is complete, and gives the bytes a direct run gives', async () => {
    // A directory, a small file, a symlink whose 3,000-byte target needs a PAX record, then a large
    // file whose header comes last (what an incremental capture's shared run looks like).
    await mkdir(join(dir, 'd'));
    await writeFile(join(dir, 'd/a'), Buffer.alloc(700, 1));
    await symlink('t'.repeat(3000), join(dir, 'd/s'));
    const names = ['./d', './d/a', './d/s', './data/big.bin'].map((n) => Buffer.from(n));
    // tar's PAX records carry atimes, and the first read of a new file moves its atime (relatime):
    // read once first, so every run below writes the same bytes (a PAX record one digit longer can
    // move the next header by a whole 512-byte block, and the cut points with it).
    const warm = runTar(dir, names);
    for await (const p of warm.stdout) void p;
    await warm.done;
    const tar = runTar(dir, names);
    const raw: Buffer[] = [];
    for await (const p of tar.stdout) raw.push(p);
    await tar.done;
    const all = Buffer.concat(raw);
    const headers = (b: Buffer): number => {
      let n = 0;
      new TarParser({ entry: () => void (n += 1), data: () => undefined, entryEnd: () => undefined }, DEFAULT_LAYER_LIMITS.maxPaxHeaderBytes).push(b);
      return n;
    };
    // The first byte count at which tar's output holds the 4th header in full.
    let lo = 0;
    let hi = all.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (headers(all.subarray(0, mid)) >= 4) hi = mid;
      else lo = mid + 1;
    }
    const expected = await emitted((async function* () { yield all.subarray(0, lo); })());
    expect(await smallTarRun(dir, names, lo - 1, DEFAULT_LAYER_LIMITS, 'tar', 4)).toBeUndefined();
    const used = smallTarRunsUsedCount();
    for (const limit of [lo, lo + 1, lo + 511, lo + 64 * 1024]) {
      const run = await smallTarRun(dir, names, limit, DEFAULT_LAYER_LIMITS, 'tar', 4);
      expect(run, `limit ${limit}`).toBeDefined();
      const got = await emitted(run!.stdout);
      expect(got.subarray(0, expected.length).equals(expected), `limit ${limit}`).toBe(true);
    }
    expect(smallTarRunsUsedCount()).toBe(used + 4);
  });

  it('a tar failure is a capture failure, as when run directly', async () => {
    const run = await smallTarRun(dir, [Buffer.from('./data/missing')], tarOutputBound([0]), DEFAULT_LAYER_LIMITS);
    await expect(run!.done).rejects.toMatchObject({ reason: 'capture_failed' });
  });

  it('headerOnly gives the header a direct run gives, with the helper and without it', async () => {
    const viaHelper = await headerOnly(dir, name, DEFAULT_LAYER_LIMITS);
    expect(viaHelper.entry).toMatchObject({ name: 'data/big.bin', type: 'file', size: 3 * 1024 * 1024 });
    expect((await direct([name])).subarray(0, viaHelper.bytes.length).equals(viaHelper.bytes)).toBe(true);
    // The helper killed while its request is out: the header still comes, from a direct run.
    const answered = smallProcessHelper.answered;
    const unavailable = smallProcessHelper.unavailable;
    // An agent's metrics export the count from the helper's own (read at each scrape).
    const metrics = new AgentMetrics(new FleetMetrics());
    const exported = async (): Promise<number> => (await metrics.smallProcessUnavailable.get()).values[0]?.value ?? 0;
    const before = await exported();
    // Stopped first, so it cannot answer before the kill (it is quick).
    process.kill(smallProcessHelper.pid!, 'SIGSTOP');
    const pending = headerOnly(dir, name, DEFAULT_LAYER_LIMITS);
    await new Promise((r) => setImmediate(r));
    smallProcessHelper.kill();
    const without = await pending;
    expect(without.bytes.equals(viaHelper.bytes)).toBe(true);
    expect(smallProcessHelper.answered).toBe(answered);
    expect(smallProcessHelper.unavailable).toBe(unavailable + 1);
    expect((await exported()) - before).toBe(1);
  });
});
