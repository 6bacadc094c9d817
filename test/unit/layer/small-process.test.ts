// The small helper process that starts short tar runs for the agent (small-process.ts): what it
// returns, where it stops, and that capture still works when it is gone (it is a speed-up only).
import { mkdtemp, mkdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULT_LAYER_LIMITS, LayerValidator } from '../../../src/core/layer-rules.ts';
import { OverlayToOci, TAR_HEADER_ALLOWANCE, headerOnly, runTar, smallTarRun, tarOutputBound } from '../../../src/host-agent/layer/capture.ts';
import { TarParser } from '../../../src/host-agent/layer/tar-format.ts';
import { runSmall, smallProcessHelper } from '../../../src/host-agent/layer/small-process.ts';

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

  it('answers a command that cannot start with its error, not by failing', async () => {
    const r = await runSmall({ file: '/nonexistent/tar', args: [], input: NO_INPUT, maxOutputBytes: 10 });
    expect(r).toMatchObject({ code: null, truncated: false });
    expect(r!.stderr).toMatch(/ENOENT/);
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
    const pending = headerOnly(dir, name, DEFAULT_LAYER_LIMITS);
    await new Promise((r) => setImmediate(r));
    smallProcessHelper.kill();
    const without = await pending;
    expect(without.bytes.equals(viaHelper.bytes)).toBe(true);
    expect(smallProcessHelper.answered).toBe(answered);
  });
});
