// Where the checkpoint time goes (issues "Host agent" and #17): each stage of capture+store and
// fetch+restore measured alone on a 200 MiB directory (150 MiB incompressible + 50 MiB JSONL) with a
// real nats-server (fsync always), no dockerd needed: the walk, tar+parse+OCI rewrite, + FastCDC,
// + chunk hashes, the store on this thread or the publish worker (what the agent does), fetch+verify
// alone, and both restore passes. Complements run.ts, which measures the whole path against docker;
// this one explains it. Prints JSON; medians of N rounds.
//
//   node --import tsx bench/checkpoint/phases.ts [--rounds 3] [--mib 200] [--inflight 16]
import { spawn, spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { jetstreamManager } from '@nats-io/jetstream';
import { ChunkStore } from '../../src/store/chunk-store.ts';
import { captureLayer } from '../../src/host-agent/layer/capture.ts';
import { FastCdcChunker } from '../../src/host-agent/layer/fastcdc.ts';
import { fetchLayer, storeLayer } from '../../src/host-agent/layer/layer-transfer.ts';
import { restoreLayer } from '../../src/host-agent/layer/restore.ts';
import { walkUpperDir } from '../../src/host-agent/layer/walk.ts';
import { fetchChunksInWorker } from '../../src/store/chunk-fetch-worker.ts';
import { startTestNats } from '../../test/support/nats.ts';

const { values } = parseArgs({ options: { rounds: { type: 'string', default: '3' }, mib: { type: 'string', default: '200' }, inflight: { type: 'string', default: '16' } } });
const rounds = Number(values.rounds);
const totalMiB = Number(values.mib);
const inflights = values.inflight.split(',').map(Number);
const MiB = 1024 * 1024;

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? Number.NaN;
async function timed(fn: () => Promise<unknown>): Promise<number> {
  const t0 = process.hrtime.bigint();
  await fn();
  return Number(process.hrtime.bigint() - t0) / 1e9;
}

async function fill(upper: string): Promise<void> {
  const data = join(upper, 'home/agent/work');
  const sessions = join(upper, 'home/agent/.claude/projects/-home-agent-work');
  await mkdir(data, { recursive: true });
  await mkdir(sessions, { recursive: true });
  const randomMiB = Math.round((totalMiB * 3) / 4);
  for (let i = 0; i < randomMiB / 10; i++) await writeFile(join(data, `blob-${i}.bin`), randomBytes(10 * MiB));
  const out = createWriteStream(join(sessions, 'session-0001.jsonl'));
  let written = 0;
  for (let i = 0; written < (totalMiB - randomMiB) * MiB; i++) {
    const l = JSON.stringify({ type: 'assistant', seq: i, text: `step ${i}: ` + 'the quick brown fox jumps over the lazy dog '.repeat(8) }) + '\n';
    written += l.length;
    if (!out.write(l)) await new Promise<void>((r) => out.once('drain', () => r()));
  }
  await new Promise<void>((r) => out.end(() => r()));
}

function sh(cmd: string): number {
  const t0 = process.hrtime.bigint();
  const r = spawnSync('bash', ['-c', `set -o pipefail; ${cmd}`]);
  if (r.status !== 0) throw new Error(`${cmd}: ${r.stderr.toString()}`);
  return Number(process.hrtime.bigint() - t0) / 1e9;
}

async function main(): Promise<void> {
  const loadStart = (await import('node:os')).loadavg();
  const work = await mkdtemp(join(tmpdir(), 'sf-phases-'));
  const nats = await startTestNats();
  const samples: Record<string, number[]> = {};
  const add = (k: string, v: number) => (samples[k] ??= []).push(v);
  try {
    const upper = join(work, 'upper');
    await fill(upper);
    const nc = await nats.connect('phases');
    const jsm = await jetstreamManager(nc);
    sh(`tar -C ${upper} -cf - . >/dev/null`);
    for (let r = 0; r < rounds; r++) {
      add('tar_c_devnull', sh(`tar --format=posix --xattrs --numeric-owner --sort=name -C ${upper} -cf - . >/dev/null`));
      add('tar_c_openssl', sh(`tar --xattrs --numeric-owner -C ${upper} -cf - . | openssl dgst -sha256 >/dev/null`));
      add('walk_only', await timed(() => walkUpperDir(upper, 1_000_000)));
      // capture stream only: walk + tar + parse + OCI rewrite
      add('capture_only', await timed(async () => {
        for await (const _ of captureLayer(upper)) void _;
      }));
      // + FastCDC
      add('capture_cdc', await timed(async () => {
        const ch = new FastCdcChunker();
        for await (const p of captureLayer(upper)) ch.push(p);
        ch.finish();
      }));
      // + chunk hashes, all on the main thread
      add('capture_cdc_hash_main', await timed(async () => {
        const ch = new FastCdcChunker();
        for await (const p of captureLayer(upper)) for (const x of ch.push(p)) createHash('sha256').update(x).digest();
        ch.finish();
      }));
      for (const n of inflights) {
        for (const viaWorker of [false, true]) {
          const tag = `${n}_${viaWorker ? 'worker' : 'main'}`;
          const store = await ChunkStore.open(nc, { chunkStream: `PH_C_${r}_${tag}`, manifestStream: `PH_M_${r}_${tag}` });
          const connection = { servers: nats.server.url };
          let layer!: Awaited<ReturnType<typeof storeLayer>>;
          add(`store_${tag}`, await timed(async () => (layer = await storeLayer(upper, store, { maxInFlight: n, ...(viaWorker ? { publishWorker: connection } : {}) }))));
          add(`fetch_verify_only_${tag}`, await timed(async () => {
            if (viaWorker) for await (const _ of fetchChunksInWorker(layer.layer.chunks, { ...connection, stream: store.chunkStream, maxInFlight: n })) void _;
            else for await (const _ of store.read(layer.layer.chunks, n)) void _;
          }));
          const t2 = join(work, `t-fetch-${r}-${tag}`);
          add(`fetch_restore_${tag}`, await timed(() => fetchLayer(layer.layer, store, t2, { maxInFlight: n, ...(viaWorker ? { fetchWorker: connection } : {}) })));
          if (n === inflights[0] && viaWorker) {
            const chunks: Buffer[] = [];
            for await (const c of store.read(layer.layer.chunks, n)) chunks.push(c);
            const t1 = join(work, `t-mem-${r}`);
            add('restore_from_memory', await timed(() => restoreLayer(chunks, { ...layer.layer, digestOf: 'chunk-list' }, t1)));
            const file = join(work, 'layer.tar');
            await writeFile(file, Buffer.concat(chunks));
            const t3 = join(work, `t-tar-${r}`);
            await mkdir(t3);
            add('tar_x_alone', sh(`tar -x --xattrs --xattrs-include='*' --same-owner --same-permissions --numeric-owner -C ${t3} -f ${file}`));
            for (const t of [t1, t3, file]) await rm(t, { recursive: true, force: true });
          }
          await rm(t2, { recursive: true, force: true });
          await jsm.streams.delete(store.chunkStream);
          await jsm.streams.delete(store.manifestStream);
        }
      }
    }
    const med = Object.fromEntries(Object.entries(samples).map(([k, v]) => [k, Number(median(v).toFixed(3))]));
    console.log(JSON.stringify({ mib: totalMiB, rounds, median_s: med, load_average_start: loadStart, load_average_end: (await import('node:os')).loadavg() }, null, 2));
  } finally {
    await nats.cleanup();
    await rm(work, { recursive: true, force: true });
  }
  void spawn;
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
