// Checkpoint benchmark (issues "Host agent" and #17): writable layers of 200 MiB and 1 GiB (3/4
// incompressible 10 MiB files + 1/4 one JSONL session file) in real containers on real dockerds,
// measured in the same run against
//   - the peers: `docker commit` + `docker save` (capture), `docker load` + `docker create` (restore),
//   - the raw limit: GNU tar of the upper dir piped to `openssl dgst -sha256`.
// Ours, as the agent does it: full capture into an empty chunk stream (publish worker thread); the
// restore on another host in the agent's order (validation pass keeping chunks in memory within the
// agent's budget and writing the rest to an empty per-host chunk cache, then `docker create` and,
// meanwhile, extraction into a staging dir in the engine's overlay2 root; timed to the end of the extraction, when the agent answers: the kept chunks' cache
// writes that follow in the background are timed apart), and again with the cache warm
// (a group returning to a host it left); incremental checkpoints after a 1 MiB append to the session
// file and after a 10 MiB change scattered over ten files (in place), each from the previous
// capture's index. Manifests of schema version 2 (the chunk-list digest that lets a checkpoint reuse
// chunks unread); a version-1 full capture (whole-tar digest, what the agent writes for a control
// plane that verifies version 1 only) is measured beside it at the first size. Medians of N rounds; ratios
// are what to read (this machine is shared and noisy: load averages recorded). Every timed
// contender starts after a `sync`, so none pays for the writeback of what ran before it. CPU of this process
// and of nats-server is measured during our captures and restores. The first size's figures are the
// top-level ones (named as before); `sizes` holds both, `slope` how each cost grows per GiB.
// Writes bench/results/checkpoint.json (a --smoke run: 1 round of 8 and 16 MiB, to --out or a temp
// dir; see bench/common.ts).
//
//   node --import tsx bench/checkpoint/run.ts [--rounds 5] [--mib 200,1024] [--smoke] [--out DIR]
import { spawnSync } from 'node:child_process';
import { createReadStream, createWriteStream } from 'node:fs';
import { appendFile, mkdir, open, readFile, rm, writeFile } from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import { cpus } from 'node:os';
import { dirname, join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { parseArgs } from 'node:util';
import type Docker from 'dockerode';
import { jetstreamManager, type JetStreamManager } from '@nats-io/jetstream';
import { ChunkStore } from '../../src/store/chunk-store.ts';
import { captureLayer } from '../../src/host-agent/layer/capture.ts';
import { ChunkCache } from '../../src/host-agent/layer/chunk-cache.ts';
import { startSmallProcessHelper } from '../../src/host-agent/layer/small-process.ts';
import { FastCdcChunker } from '../../src/host-agent/layer/fastcdc.ts';
import { RetainBudget, extractVerifiedLayer, storeLayer, verifyLayer, type StoredLayer } from '../../src/host-agent/layer/layer-transfer.ts';
import { DEFAULT_LAYER_RESTORE_SETTINGS } from '../../src/host-agent/config.ts';
import { startDockerHosts, destroyAll, type DockerHost } from '../../test/support/docker.ts';
import { provisionSandboxImage } from '../../test/support/sandbox-image.ts';
import { startTestNats, type TestNats } from '../../test/support/nats.ts';
import { BENCH_OPTIONS, startBench, writeResult } from '../common.ts';

const { values } = parseArgs({ options: { rounds: { type: 'string' }, mib: { type: 'string' }, ...BENCH_OPTIONS } });
const run = startBench('checkpoint', values);
// As the agent does at its start: incremental captures' tar runs fork this small helper, not this process.
startSmallProcessHelper();
// 5 rounds: with 3, one slow first round (a restore of 2.6 s among 1.0 s ones, seen here) is a third of the samples.
const rounds = Number(values.rounds ?? (run.smoke ? 1 : 5));
const sizesMiB = (values.mib ?? (run.smoke ? '8,16' : '200,1024')).split(',').map(Number);
const MiB = 1024 * 1024;

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? Number.NaN;
async function timed<T>(fn: () => Promise<T>): Promise<[number, T]> {
  const t0 = process.hrtime.bigint();
  const out = await fn();
  return [Number(process.hrtime.bigint() - t0) / 1e9, out];
}

/** CPU seconds (user + system) a process has used, from /proc (clock ticks of 1/100 s). */
async function procCpuS(pid: number): Promise<number> {
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

/** Wall time of `fn` and the CPU seconds this process (all its threads) and `otherPid` used meanwhile. */
async function timedCpu<T>(otherPid: number, fn: () => Promise<T>): Promise<{ s: number; cpuS: number; otherCpuS: number; out: T }> {
  const c0 = process.cpuUsage();
  const o0 = await procCpuS(otherPid);
  const [s, out] = await timed(fn);
  const c = process.cpuUsage(c0);
  return { s, cpuS: (c.user + c.system) / 1e6, otherCpuS: (await procCpuS(otherPid)) - o0, out };
}

async function createSandbox(docker: Docker, imageId: string, name: string): Promise<Docker.Container> {
  return docker.createContainer({ name, Image: imageId, Cmd: ['/bin/sleep', 'infinity'], HostConfig: { NetworkMode: 'none' } });
}

async function upperDirOf(container: Docker.Container): Promise<string> {
  const info = await container.inspect();
  const upper = (info.GraphDriver.Data as Record<string, string> | undefined)?.UpperDir;
  if (!upper) throw new Error('container has no overlay2 upper dir');
  return upper;
}

/** 3/4 incompressible 10 MiB files + 1/4 one JSONL file with a Claude-Code-like layout, written as the container's writable layer. */
async function fillLayer(upper: string, totalMiB: number): Promise<{ jsonl: string; blobs: string[] }> {
  const randomMiB = Math.round((totalMiB * 3) / 4);
  const data = join(upper, 'home/agent/work');
  const sessions = join(upper, 'home/agent/.claude/projects/-home-agent-work');
  await mkdir(data, { recursive: true });
  await mkdir(sessions, { recursive: true });
  const blobs: string[] = [];
  for (let i = 0; i * 10 < randomMiB; i++) {
    blobs.push(join(data, `blob-${i}.bin`));
    await writeFile(blobs[i]!, randomBytes(Math.min(10, randomMiB - i * 10) * MiB));
  }
  const jsonl = join(sessions, 'session-0001.jsonl');
  const out = createWriteStream(jsonl);
  let written = 0;
  for (let i = 0; written < (totalMiB - randomMiB) * MiB; i++) {
    const l = line(i);
    written += Buffer.byteLength(l);
    if (!out.write(l)) await new Promise<void>((r) => out.once('drain', () => r()));
  }
  await new Promise<void>((resolve, reject) => out.end((err?: Error | null) => (err ? reject(err) : resolve())));
  return { jsonl, blobs };
}

function line(i: number): string {
  return `${JSON.stringify({ type: 'assistant', session_id: 'session-0001', seq: i, message: { role: 'assistant', content: [{ type: 'text', text: `step ${i}: ${'the quick brown fox jumps over the lazy dog '.repeat(8)}` }] } })}\n`;
}

/** 1 MiB of new session lines at the end of the JSONL file (what a conversation turn does). */
async function appendTurn(jsonl: string, from: number): Promise<number> {
  const lines: string[] = [];
  let bytes = 0;
  let i = from;
  for (; bytes < MiB; i++) {
    const l = line(i);
    lines.push(l);
    bytes += l.length;
  }
  await appendFile(jsonl, lines.join(''));
  return i;
}

/** 10 MiB changed in place: 1 MiB of new bytes at a random offset of each of ten blobs. */
async function scatterChange(blobs: readonly string[]): Promise<void> {
  for (let i = 0; i < 10; i++) {
    const file = blobs[(i * 7) % blobs.length]!;
    const fh = await open(file, 'r+');
    try {
      const { size } = await fh.stat();
      await fh.write(randomBytes(Math.min(MiB, size)), 0, Math.min(MiB, size), Math.floor(Math.random() * Math.max(1, size - MiB)));
    } finally {
      await fh.close();
    }
  }
}

/**
 * Write back every dirty page before a timed contender starts (`sync`), so that none pays for the
 * writeback of what the one before it wrote (docker save's archive, our cache fill, an extraction):
 * on this machine that writeback made the same restore take 1 s or 1.7 s depending on what ran last.
 */
function settle(): void {
  spawnSync('sync');
}

function rawLimit(upper: string): number {
  const t0 = process.hrtime.bigint();
  const r = spawnSync('bash', ['-c', `set -o pipefail; tar --xattrs --numeric-owner -C '${upper}' -cf - . | openssl dgst -sha256 >/dev/null`]);
  if (r.status !== 0) throw new Error(`raw tar|openssl failed: ${r.stderr.toString()}`);
  return Number(process.hrtime.bigint() - t0) / 1e9;
}

interface SizeResult {
  readonly layerMiB: number;
  readonly figures: Record<string, number>;
  readonly samples: Record<string, number[]>;
  readonly phases: Record<string, number>;
}

async function measureSize(ctx: { a: DockerHost; b: DockerHost; imageId: string; nats: TestNats; jsm: JetStreamManager; scratch: string }, totalMiB: number, withV1: boolean): Promise<SizeResult> {
  const { a, b, imageId, nats, jsm, scratch } = ctx;
  const natsPid = nats.server.pid!;
  const connection = { servers: nats.server.url };
  const nc = await nats.connect(`bench-checkpoint-${totalMiB}`);
  const tag = `${totalMiB}`;
  const source = await createSandbox(a.docker, imageId, `bench-source-${tag}`);
  const upper = await upperDirOf(source);
  const { jsonl, blobs } = await fillLayer(upper, totalMiB);
  // Host B's overlay2 root, as the agent learns it from the first container it sees.
  const probe = await createSandbox(b.docker, imageId, `bench-probe-${tag}`);
  const earlyStaging = { parent: dirname(dirname(await upperDirOf(probe))), prefix: '.sf-restore-bench-' };
  await probe.remove({ force: true });
  rawLimit(upper); // warm the page cache so every contender reads from memory
  // Past the racy margin: the layer was written a moment ago, a real checkpoint comes later.
  await new Promise((r) => setTimeout(r, 2_100));

  // Untimed warm-up, as an agent that has checkpointed and restored before: JIT-compiled code, pooled
  // publish, fetch and layer workers with their connections.
  {
    const store = await ChunkStore.open(nc, { chunkStream: `SF_CHUNKS_BENCH_WARMUP_${tag}`, manifestStream: `SF_CKPT_BENCH_WARMUP_${tag}` });
    const warm = await storeLayer(upper, store, { publishWorker: connection });
    const verified = await verifyLayer(warm.layer, store, { fetchWorker: connection });
    await extractVerifiedLayer(verified, store, join(scratch, `warmup-${tag}`), { fetchWorker: connection });
    await verified.release();
    await rm(join(scratch, `warmup-${tag}`), { recursive: true, force: true });
    await jsm.streams.delete(store.chunkStream);
    await jsm.streams.delete(store.manifestStream);
  }
  const s: Record<string, number[]> = {};
  const add = (k: string, v: number): void => void (s[k] ??= []).push(v);
  let last: { store: ChunkStore; stored: StoredLayer } | undefined;
  for (let r = 0; r < rounds; r++) {
    settle();
    add('raw', rawLimit(upper));
    // Ours: into an empty chunk stream each round (nothing to deduplicate against). Streams of one
    // subject prefix cannot overlap: the previous round's pair goes first.
    if (last) {
      await jsm.streams.delete(last.store.chunkStream);
      await jsm.streams.delete(last.store.manifestStream);
    }
    if (withV1) {
      const v1store = await ChunkStore.open(nc, { chunkStream: `SF_CHUNKS_BENCH_V1_${tag}_${r}`, manifestStream: `SF_CKPT_BENCH_V1_${tag}_${r}` });
      const [t] = await timed(() => storeLayer(upper, v1store, { publishWorker: connection, schemaVersion: 1 }));
      add('ours_v1', t);
      await jsm.streams.delete(v1store.chunkStream);
      await jsm.streams.delete(v1store.manifestStream);
    }
    const store = await ChunkStore.open(nc, { chunkStream: `SF_CHUNKS_BENCH_${tag}_${r}`, manifestStream: `SF_CKPT_BENCH_${tag}_${r}` });
    settle();
    const captured = await timedCpu(natsPid, () => storeLayer(upper, store, { publishWorker: connection }));
    add('ours', captured.s);
    add('capture_cpu', captured.cpuS);
    add('capture_nats_cpu', captured.otherCpuS);
    add('first_stored_bytes', captured.out.stats.storedBytes);
    add('chunks', captured.out.layer.chunks.length);

    // Peer: docker commit + docker save (to a file on the same disk).
    const archive = join(scratch, `commit-${tag}-${r}.tar`);
    settle();
    const [tCommitSave, committed] = await timed(async () => {
      const c = (await source.commit({ repo: 'bench-commit', tag: `${tag}-${r}` })) as { Id: string };
      await pipeline(await a.docker.getImage(c.Id).get(), createWriteStream(archive));
      return c.Id;
    });
    add('commitSave', tCommitSave);

    // Ours restore on host B, in the agent's order: validate (keeping chunks in memory, the rest
    // into the host's chunk cache, empty here), then create the container while extracting.
    const cacheDir = join(scratch, `cache-${tag}-${r}`);
    const cache = await ChunkCache.open({ dir: cacheDir, maxBytes: 2 * captured.out.layer.size + 64 * MiB });
    // Timed until the layer is in place (when the agent answers); the kept chunks' cache writes
    // that follow (release()) run in the background and are timed on their own.
    const restoreOnce = async (name: string): Promise<{ tCreate: number; container: Docker.Container; cacheFilled: Promise<void> }> => {
      // The agent's defaults: chunks kept in memory between the passes up to its budget, the rest through the cache.
      const retain = new RetainBudget(DEFAULT_LAYER_RESTORE_SETTINGS.restoreMemoryBytes!);
      const verified = await verifyLayer(captured.out.layer, store, { fetchWorker: connection, cache, retain });
      let cacheFilled: Promise<void> | undefined;
      try {
        // As the agent: extraction into a staging dir in the overlay2 root while the container is created.
        const made = timed(() => createSandbox(b.docker, imageId, name)).then(async ([tCreate, container]) => ({ tCreate, container, upper: await upperDirOf(container) }));
        await extractVerifiedLayer(verified, store, made.then((x) => x.upper), { fetchWorker: connection, cache, earlyStaging });
        const { tCreate, container } = await made;
        cacheFilled = verified.release();
        return { tCreate, container, cacheFilled };
      } finally {
        if (cacheFilled === undefined) await verified.release();
      }
    };
    settle();
    const cold = await timedCpu(natsPid, () => restoreOnce(`bench-restore-${tag}-${r}`));
    add('oursRestore', cold.s);
    add('restore_cpu', cold.cpuS);
    add('restore_nats_cpu', cold.otherCpuS);
    add('create', cold.out.tCreate);
    const fill = await timedCpu(natsPid, () => cold.out.cacheFilled);
    add('restore_cache_fill', fill.s);
    add('restore_cache_fill_cpu', fill.cpuS);
    // A group returning to this host: every chunk is in the cache already.
    if (!captured.out.layer.chunks.every((c) => cache.has(c.digest))) throw new Error('the chunk cache lacks chunks of the layer after the restore and its cache writes');
    settle();
    const warm = await timedCpu(natsPid, () => restoreOnce(`bench-restore-warm-${tag}-${r}`));
    add('oursRestoreCached', warm.s);
    add('restore_cached_nats_cpu', warm.otherCpuS);
    await warm.out.cacheFilled;

    // Where capture time goes (not part of the comparison): stages alone, on this thread.
    const [tCaptureOnly] = await timed(async () => {
      for await (const piece of captureLayer(upper)) void piece;
    });
    const [tCaptureCdc] = await timed(async () => {
      const chunker = new FastCdcChunker();
      for await (const piece of captureLayer(upper)) chunker.push(piece);
      chunker.finish();
    });
    add('capture_tar_parse_only', tCaptureOnly);
    add('capture_tar_parse_cdc_only', tCaptureCdc);

    // Peer restore on host B: docker load of the committed image + docker create.
    settle();
    const [tLoadCreate] = await timed(async () => {
      const out = await b.docker.loadImage(createReadStream(archive));
      await new Promise<void>((resolve, reject) => b.docker.modem.followProgress(out, (err) => (err ? reject(err) : resolve())));
      await createSandbox(b.docker, committed, `bench-peer-${tag}-${r}`);
    });
    add('loadCreate', tLoadCreate);

    // Clean up this round's artefacts so the next round starts equal.
    for (const name of [`bench-peer-${tag}-${r}`, `bench-restore-${tag}-${r}`, `bench-restore-warm-${tag}-${r}`]) await b.docker.getContainer(name).remove({ force: true });
    await b.docker.getImage(committed).remove({ force: true }).catch(() => undefined);
    await a.docker.getImage(committed).remove({ force: true }).catch(() => undefined);
    await rm(archive, { force: true });
    await rm(cacheDir, { recursive: true, force: true });
    last = { store, stored: captured.out };
  }

  // Incremental checkpoints into the last round's store, each from the previous capture's index:
  // after a conversation turn (1 MiB appended to the session file), then after 10 MiB changed in
  // place across ten files.
  // Every capture of the chain below is incremental: the agent's periodic full read (every 10th by
  // default) would otherwise fall inside it with 5 rounds of each kind.
  const INCREMENTAL_CHAIN = 2 * rounds + 1;
  let previous = last!.stored;
  let seq = 1_000_000;
  const incremental = async (prefix: string, change: () => Promise<void>): Promise<void> => {
    for (let r = 0; r < rounds; r++) {
      await change();
      settle();
      const stored = await timedCpu(natsPid, () => storeLayer(upper, last!.store, { publishWorker: connection, previous: previous.index, fullCaptureEvery: INCREMENTAL_CHAIN }));
      if (stored.out.capture.mode !== 'incremental') throw new Error(`${prefix}: capture was ${stored.out.capture.mode} (${stored.out.capture.reason})`);
      add(`${prefix}_s`, stored.s);
      add(`${prefix}_stored_bytes`, stored.out.stats.storedBytes);
      add(`${prefix}_read_entries`, stored.out.capture.readEntries);
      add(`${prefix}_verified_bytes`, stored.out.capture.verifiedBytes);
      add(`${prefix}_cpu`, stored.cpuS);
      add(`${prefix}_nats_cpu`, stored.otherCpuS);
      previous = stored.out;
    }
  };
  await incremental('append', async () => {
    seq = await appendTurn(jsonl, seq);
  });
  await incremental('scatter', () => scatterChange(blobs));

  await source.remove({ force: true });
  await jsm.streams.delete(last!.store.chunkStream);
  await jsm.streams.delete(last!.store.manifestStream);
  await nc.close();

  const m = (k: string): number => median(s[k] ?? []);
  const layerBytes = previous.layer.size;
  const figures: Record<string, number> = {
    layer_bytes: layerBytes,
    raw_tar_openssl_s: m('raw'),
    capture_store_s: m('ours'),
    docker_commit_save_s: m('commitSave'),
    restore_s: m('oursRestore'),
    restore_cached_s: m('oursRestoreCached'),
    docker_load_create_s: m('loadCreate'),
    capture_speedup_vs_commit_save: m('commitSave') / m('ours'),
    restore_speedup_vs_load_create: m('loadCreate') / m('oursRestore'),
    restore_cached_speedup: m('oursRestore') / m('oursRestoreCached'),
    fraction_of_raw_limit: m('raw') / m('ours'),
    incremental_s: m('append_s'),
    incremental_stored_bytes: m('append_stored_bytes'),
    first_stored_bytes: m('first_stored_bytes'),
    incremental_bytes_fraction: m('append_stored_bytes') / m('first_stored_bytes'),
    incremental_time_fraction: m('append_s') / m('ours'),
    // CPU (this process + nats-server), less at the mercy of other load than wall time.
    incremental_cpu_fraction: (m('append_cpu') + m('append_nats_cpu')) / (m('capture_cpu') + m('capture_nats_cpu')),
    incremental_scatter_s: m('scatter_s'),
    incremental_scatter_stored_bytes: m('scatter_stored_bytes'),
    incremental_scatter_time_fraction: m('scatter_s') / m('ours'),
    incremental_scatter_bytes_fraction: m('scatter_stored_bytes') / m('first_stored_bytes'),
  };
  if (withV1) {
    figures.capture_store_v1_s = m('ours_v1');
    figures.capture_v1_speedup_vs_commit_save = m('commitSave') / m('ours_v1');
  }
  const phases = {
    capture_cpu_s: m('capture_cpu'),
    capture_nats_server_cpu_s: m('capture_nats_cpu'),
    capture_tar_parse_only_s: m('capture_tar_parse_only'),
    capture_tar_parse_cdc_only_s: m('capture_tar_parse_cdc_only'),
    restore_cpu_s: m('restore_cpu'),
    restore_nats_server_cpu_s: m('restore_nats_cpu'),
    restore_cached_nats_server_cpu_s: m('restore_cached_nats_cpu'),
    docker_create_s: m('create'),
    restore_cache_fill_s: m('restore_cache_fill'),
    restore_cache_fill_cpu_s: m('restore_cache_fill_cpu'),
    chunks: m('chunks'),
    incremental_append_cpu_s: m('append_cpu'),
    incremental_append_nats_server_cpu_s: m('append_nats_cpu'),
    incremental_append_read_entries: m('append_read_entries'),
    incremental_append_verified_bytes: m('append_verified_bytes'),
    incremental_scatter_cpu_s: m('scatter_cpu'),
    incremental_scatter_read_entries: m('scatter_read_entries'),
  };
  return { layerMiB: totalMiB, figures, samples: s, phases };
}

async function main(): Promise<void> {
  let hosts: DockerHost[] = [];
  let nats: TestNats | undefined;
  const scratch = `/tmp/sf-bench-${process.pid}`;
  await mkdir(scratch, { recursive: true });
  try {
    hosts = await startDockerHosts(2);
    const [a, b] = hosts as [DockerHost, DockerHost];
    const image = await provisionSandboxImage([a.docker, b.docker], { bridgeVersion: 4 });
    // Same durability as production: fsync before every ack.
    nats = await startTestNats();
    if (nats.server.pid === undefined) throw new Error('nats-server has no pid');
    const jsm = await jetstreamManager(await nats.connect('bench-checkpoint'));
    const results: SizeResult[] = [];
    for (const [i, mib] of sizesMiB.entries()) results.push(await measureSize({ a, b, imageId: image.imageId, nats, jsm, scratch }, mib, i === 0));

    const cores = cpus().length;
    const [small, large] = [results[0]!, results[results.length - 1]!];
    const f = small.figures;
    const p = small.phases;
    const perGiB = (k: string): number => (large.figures[k]! - small.figures[k]!) / ((large.figures.layer_bytes! - small.figures.layer_bytes!) / 1024 ** 3);
    const slope = results.length < 2 ? {} : Object.fromEntries(['capture_store_s', 'restore_s', 'restore_cached_s', 'incremental_s', 'incremental_scatter_s', 'docker_commit_save_s', 'docker_load_create_s', 'raw_tar_openssl_s'].map((k) => [`${k}_per_gib`, perGiB(k)]));
    const f2 = (x: number | undefined): string => (x ?? Number.NaN).toFixed(2);
    const pct = (x: number | undefined): string => `${((x ?? Number.NaN) * 100).toFixed(1)}%`;
    const verdict = (name: string, ok: boolean, value: string): string => `${name} ${value}: ${ok ? 'met' : 'MISSED'}`;
    const notes = [
      `${small.layerMiB} MiB: ${verdict('capture+store vs commit+save', f.capture_speedup_vs_commit_save! >= 3, `${f2(f.capture_speedup_vs_commit_save)}x (target >= 3)`)}; ${verdict('capture vs raw limit', f.fraction_of_raw_limit! >= 0.3, `${pct(f.fraction_of_raw_limit)} (target >= 30%)`)}; ${verdict('restore vs load+create', f.restore_speedup_vs_load_create! >= 2.5, `${f2(f.restore_speedup_vs_load_create)}x (target >= 2.5)`)}; ${verdict('incremental time', f.incremental_time_fraction! <= 0.15, `${pct(f.incremental_time_fraction)} of a full capture (target <= 15%)`)}; ${verdict('incremental bytes', f.incremental_bytes_fraction! <= 0.05, `${pct(f.incremental_bytes_fraction)} (target <= 5%)`)}.`,
      `Load average (1 min) at start ${f2(run.loadAverageStart[0])} on ${cores} cores (end: load_average_end): every contender here is CPU-bound, so absolute times scale with load; ratios are same-run. Medians of ${rounds} rounds; each timed contender starts after a \`sync\` (none pays for the writeback of what the one before it wrote).`,
      `Capture (${small.layerMiB} MiB, medians): ${f2(f.capture_store_s)} s wall; walk+tar+parse+OCI rewrite alone ${f2(p.capture_tar_parse_only_s)} s, with FastCDC ${f2(p.capture_tar_parse_cdc_only_s)} s; the rest is the chunk hashes and the publishes (worker thread, fsync on every ack). CPU meanwhile: this process ${f2(p.capture_cpu_s)} s, nats-server ${f2(p.capture_nats_server_cpu_s)} s. Raw limit (tar | openssl) ${f2(f.raw_tar_openssl_s)} s.` +
        (f.capture_store_v1_s !== undefined ? ` A version-1 capture (whole-tar digest, hashed on the publish worker) took ${f2(f.capture_store_v1_s)} s (${f2(f.capture_v1_speedup_vs_commit_save)}x commit+save).` : ''),
      `Restore (${small.layerMiB} MiB): ${f2(f.restore_s)} s in the agent's order (validation pass keeping up to ${(DEFAULT_LAYER_RESTORE_SETTINGS.restoreMemoryBytes! / MiB).toFixed(0)} MiB in memory and writing the rest to an empty chunk cache, docker create ${f2(p.docker_create_s)} s while extracting from memory and the cache into a staging dir; the kept chunks are cached after that, in the background: ${f2(p.restore_cache_fill_s)} s more, ${f2(p.restore_cache_fill_cpu_s)} s CPU, not in the figure); CPU this process ${f2(p.restore_cpu_s)} s, nats-server ${f2(p.restore_nats_server_cpu_s)} s. From a warm cache (a group returning): ${f2(f.restore_cached_s)} s, ${f2(f.restore_cached_speedup)}x faster, nats-server CPU ${f2(p.restore_cached_nats_server_cpu_s)} s.`,
      `Incremental (${small.layerMiB} MiB): after a 1 MiB append ${f2(f.incremental_s)} s, ${pct(f.incremental_time_fraction)} of a full capture (CPU of this process and nats-server: ${pct(f.incremental_cpu_fraction)} of a full capture's), stored ${pct(f.incremental_bytes_fraction)} (read ${p.incremental_append_read_entries} entries; the session file's old bytes hashed against the old chunks, ${((p.incremental_append_verified_bytes ?? 0) / MiB).toFixed(1)} MiB, not chunked or uploaded); after 10 MiB changed in place in ten files ${f2(f.incremental_scatter_s)} s (${pct(f.incremental_scatter_time_fraction)}), stored ${pct(f.incremental_scatter_bytes_fraction)}.`,
    ];
    if (results.length > 1) {
      const g = large.figures;
      notes.push(
        `${large.layerMiB} MiB: capture ${f2(g.capture_store_s)} s (${f2(g.capture_speedup_vs_commit_save)}x commit+save), restore ${f2(g.restore_s)} s (${f2(g.restore_speedup_vs_load_create)}x load+create), cached restore ${f2(g.restore_cached_s)} s, incremental after 1 MiB ${f2(g.incremental_s)} s (${pct(g.incremental_time_fraction)}), after 10 MiB scattered ${f2(g.incremental_scatter_s)} s. ` +
          `Per GiB more layer: capture +${f2(perGiB('capture_store_s'))} s, restore +${f2(perGiB('restore_s'))} s, incremental (1 MiB append) +${f2(perGiB('incremental_s'))} s, commit+save +${f2(perGiB('docker_commit_save_s'))} s, load+create +${f2(perGiB('docker_load_create_s'))} s.`,
      );
    }
    const result = {
      when: new Date().toISOString(),
      rounds,
      manifest_schema_version: 2,
      layer_mix: { random_fraction: 0.75, jsonl_fraction: 0.25, random_file_mib: 10 },
      ...f,
      phases_median: p,
      sizes: Object.fromEntries(results.map((r) => [`${r.layerMiB}MiB`, { figures: r.figures, phases_median: r.phases, samples: r.samples }])),
      slope,
      machine: { cpus: cores },
      targets: {
        capture_speedup_vs_commit_save: '>= 3',
        fraction_of_raw_limit: '>= 0.3',
        restore_speedup_vs_load_create: '>= 2.5',
        incremental_time_fraction: '<= 0.15',
        incremental_bytes_fraction: '<= 0.05',
      },
      notes,
    };
    console.log(JSON.stringify({ ...f, notes }, null, 2));
    await writeResult(run, result);
  } finally {
    await nats?.cleanup();
    await destroyAll(hosts);
    await rm(scratch, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
