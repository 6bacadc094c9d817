// What the two-pass restore costs (issue #11 item 3): fetchLayer of one --mib MiB layer (3/4
// incompressible files, 1/4 JSONL text, like bench/checkpoint) from a real nats-server into a fresh
// dir, chunks fetched on the fetch worker thread as the agent does, medians of --rounds:
//   - no_cache:   validation pass fetches, extraction pass fetches again
//   - cache_cold: validation pass fetches and fills an empty per-host chunk cache, extraction reads it
//   - cache_warm: everything from the cache (a group returning to a host it left)
// Run it on another checkout (e.g. the commit before this one) for the one-pass baseline: options it
// does not know are ignored there and every variant is the plain one-pass restore.
//
//   node --import tsx bench/restore-bounds/speed.ts [--mib 200] [--rounds 5]
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { chunkListDigest, type LayerRef } from '../../src/core/checkpoint-manifest.ts';
import { DEFAULT_CHUNKER_OPTIONS, FastCdcChunker } from '../../src/host-agent/layer/fastcdc.ts';
import { fetchLayer } from '../../src/host-agent/layer/layer-transfer.ts';
import { END_OF_ARCHIVE, dataPadding, encodeHeader, type TarHeader } from '../../src/host-agent/layer/tar-format.ts';
import { ChunkStore } from '../../src/store/chunk-store.ts';
import { startTestNats } from '../../test/support/nats.ts';

const { values } = parseArgs({ options: { mib: { type: 'string', default: '200' }, rounds: { type: 'string', default: '5' } } });
const MiB = 1024 * 1024;
const total = Number(values.mib);
const rounds = Number(values.rounds);

const h = (name: string, type: TarHeader['type'], size = 0): TarHeader => ({ name, type, mode: 0o644, uid: 0, gid: 0, size, mtime: 1_700_000_000, devMajor: 0, devMinor: 0, xattrs: new Map() });

function* layerTar(): Generator<Buffer> {
  yield encodeHeader(h('.', 'directory'));
  yield encodeHeader(h('data', 'directory'));
  const randomMiB = Math.round((total * 3) / 4);
  for (let i = 0; i * 10 < randomMiB; i++) {
    const size = Math.min(10, randomMiB - i * 10) * MiB;
    yield encodeHeader(h(`data/blob-${i}.bin`, 'file', size));
    yield randomBytes(size);
    yield dataPadding(size);
  }
  const lines: string[] = [];
  let bytes = 0;
  for (let i = 0; bytes < (total - randomMiB) * MiB; i++) {
    const l = `${JSON.stringify({ type: 'assistant', seq: i, text: `step ${i}: ${'the quick brown fox jumps over the lazy dog '.repeat(8)}` })}\n`;
    lines.push(l);
    bytes += l.length;
  }
  const jsonl = Buffer.from(lines.join(''));
  yield encodeHeader(h('data/session.jsonl', 'file', jsonl.length));
  yield jsonl;
  yield dataPadding(jsonl.length);
  yield END_OF_ARCHIVE;
}

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? Number.NaN;

async function main(): Promise<void> {
  const nats = await startTestNats();
  const scratch = await mkdtemp(join(tmpdir(), 'sf-restore-speed-'));
  try {
    const nc = await nats.connect('bench');
    const store = await ChunkStore.open(nc);
    const chunker = new FastCdcChunker(DEFAULT_CHUNKER_OPTIONS);
    const writer = store.writer(16);
    const chunks = [];
    let size = 0;
    for (const part of layerTar()) {
      size += part.length;
      for (const c of chunker.push(part)) chunks.push(await writer.put(c));
    }
    const last = chunker.finish();
    if (last !== null) chunks.push(await writer.put(last));
    await writer.flush();
    // A version-2 layer (its digest covers the chunk list).
    const layer: LayerRef = { digest: chunkListDigest(chunks), size, chunks };
    const fetchWorker = { servers: nats.server.url };
    // Loaded lazily: the one-pass baseline checkout has no chunk cache.
    const cacheModule = await import('../../src/host-agent/layer/chunk-cache.ts').catch(() => undefined);
    const run = async (name: string, cacheDir: string | undefined): Promise<number> => {
      const cache = cacheDir !== undefined && cacheModule ? await cacheModule.ChunkCache.open({ dir: cacheDir, maxBytes: 4 * size }) : undefined;
      const target = join(scratch, `${name}-${Math.random().toString(36).slice(2)}`);
      const t0 = performance.now();
      await fetchLayer(layer, store, target, { fetchWorker, ...(cache ? { cache } : {}) });
      const s = (performance.now() - t0) / 1000;
      await rm(target, { recursive: true, force: true });
      return s;
    };
    await run('warmup', undefined);
    const out: Record<string, number[]> = { no_cache: [], cache_cold: [], cache_warm: [] };
    for (let r = 0; r < rounds; r++) {
      out.no_cache!.push(await run('none', undefined));
      const dir = join(scratch, `cache-${r}`);
      out.cache_cold!.push(await run('cold', dir));
      out.cache_warm!.push(await run('warm', dir));
    }
    console.log(JSON.stringify({ layer_mib: +(size / MiB).toFixed(1), chunks: chunks.length, rounds, two_pass: cacheModule !== undefined, median_seconds: Object.fromEntries(Object.entries(out).map(([k, v]) => [k, +median(v).toFixed(3)])), all_seconds: out, load_average_1m: loadavg()[0] }));
  } finally {
    await nats.cleanup();
    await rm(scratch, { recursive: true, force: true });
  }
}

await main();
