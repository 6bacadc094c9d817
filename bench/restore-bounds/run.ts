// Restore bounds benchmark (issue #11 item 3): what a hostile or a big layer costs a real host agent.
// A real nats-server, one real dockerd host and the real agent binary as a CHILD PROCESS (so its
// RSS is its own) on that host; a layer is written straight into the chunk store with a manifest
// under another host's name (as a source agent would), then the agent is sent `restore`:
//   - bomb: a layer of --entries empty files (default 1,000,001: one over the default limit),
//   - big:  a valid --gib GiB layer of incompressible files (default 1 GiB), restored for real.
// Per scenario, a fresh agent: the result (outcome, reason, duration), the longest gap between the
// agent's heartbeats as received here and by their own send time (interval --heartbeat-ms), the
// agent's peak RSS (VmHWM) and whether anything was left in the engine's overlay2 dirs.
// Writes bench/results/restore-bounds.json (bench/common.ts; --out DIR elsewhere, --file NAME for
// another file name, e.g. a baseline). A --smoke run: a 2,001-entry bomb against an agent limit of
// 2,000 entries and a 16 MiB layer, into a temp dir.
//
//   node --import tsx bench/restore-bounds/run.ts [--entries 1000001] [--gib 1] [--heartbeat-ms 1000] [--only bomb|big]
//     [--escape-tail] [--max-entries N] [--smoke] [--out DIR] [--file NAME.json]
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { readFileSync, readdirSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import type { NatsConnection } from '@nats-io/transport-node';
import type { CheckpointManifest, LayerRef } from '../../src/core/checkpoint-manifest.ts';
import { CommandOutcome, Heartbeat, type CleanStopEvidence } from '../../src/gen/sandboxfleet/v1/agent.ts';
import { DEFAULT_CHUNKER_OPTIONS, FastCdcChunker } from '../../src/host-agent/layer/fastcdc.ts';
import { END_OF_ARCHIVE, dataPadding, encodeHeader, type TarHeader } from '../../src/host-agent/layer/tar-format.ts';
import { ChunkStore } from '../../src/store/chunk-store.ts';
import { toWireManifest } from '../../src/wire/checkpoint-manifest.ts';
import { AgentSubjects } from '../../src/core/agent-subjects.ts';
import { Collector, TEST_AGENT_SHA, registrationResponder, sendCommand, type RegistrationResponder } from '../../test/support/agent.ts';
import { destroyAll, startDockerHost, type DockerHost } from '../../test/support/docker.ts';
import { startTestNats, type TestNats } from '../../test/support/nats.ts';
import { provisionSandboxImage, type SandboxImage } from '../../test/support/sandbox-image.ts';
import { BENCH_OPTIONS, startBench, writeResult } from '../common.ts';

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const { values } = parseArgs({
  options: {
    entries: { type: 'string' },
    gib: { type: 'string' },
    'heartbeat-ms': { type: 'string', default: '1000' },
    only: { type: 'string' },
    /** End the bomb with a `../escaped` entry: refused by a name rule after every other entry (any limits). */
    'escape-tail': { type: 'boolean', default: false },
    /** Agent env for the layer limits (SANDBOXFLEET_LAYER_MAX_ENTRIES); default the agent's own default. */
    'max-entries': { type: 'string' },
    /** Result file name under the output dir (default restore-bounds.json). */
    file: { type: 'string' },
    ...BENCH_OPTIONS,
  },
});
const run = startBench('restore-bounds', values);
// Smoke: one entry over a small agent limit, and a 16 MiB layer (one 16 MiB file).
const ENTRIES = Number(values.entries ?? (run.smoke ? 2001 : 1_000_001));
const MAX_ENTRIES = values['max-entries'] ?? (run.smoke ? '2000' : undefined);
const GIB = Number(values.gib ?? (run.smoke ? 1 / 64 : 1));
const HEARTBEAT_MS = Number(values['heartbeat-ms']);
const MiB = 1024 * 1024;
const BRIDGE = 4;

function header(name: string, type: TarHeader['type'], size = 0): TarHeader {
  return { name, type, mode: type === 'directory' ? 0o755 : 0o644, uid: 0, gid: 0, size, mtime: 1_700_000_000, devMajor: 0, devMinor: 0, xattrs: new Map() };
}

/** Tar bytes of `bomb/f<i>` empty files (plus the root and `bomb/` dirs), optionally ending in `../escaped`. */
function* bombTar(entries: number, escapeTail: boolean): Generator<Buffer> {
  yield encodeHeader(header('.', 'directory'));
  yield encodeHeader(header('bomb', 'directory'));
  const batch: Buffer[] = [];
  for (let i = 0; i < entries - 2; i++) {
    batch.push(encodeHeader(header(`bomb/f${String(i).padStart(7, '0')}`, 'file')));
    if (batch.length === 2048) yield Buffer.concat(batch.splice(0));
  }
  if (batch.length > 0) yield Buffer.concat(batch);
  if (escapeTail) yield encodeHeader(header('../escaped', 'file'));
  yield END_OF_ARCHIVE;
}

/** Tar bytes of `data/blob-<i>.bin` incompressible 16 MiB files, `gib` GiB in all. */
function* bigTar(gib: number): Generator<Buffer> {
  yield encodeHeader(header('.', 'directory'));
  yield encodeHeader(header('data', 'directory'));
  const files = Math.round((gib * 1024) / 16);
  for (let i = 0; i < files; i++) {
    yield encodeHeader(header(`data/blob-${i}.bin`, 'file', 16 * MiB));
    for (let j = 0; j < 16; j++) yield randomBytes(MiB);
    yield dataPadding(16 * MiB);
  }
  yield END_OF_ARCHIVE;
}

/** Chunk, store and digest a layer the way a source agent would (FastCDC, put-if-absent). */
async function storeTar(store: ChunkStore, parts: Iterable<Buffer>): Promise<LayerRef> {
  const chunker = new FastCdcChunker(DEFAULT_CHUNKER_OPTIONS);
  const writer = store.writer(16);
  const hash = createHash('sha256');
  const chunks = [];
  let size = 0;
  for (const part of parts) {
    hash.update(part);
    size += part.length;
    for (const c of chunker.push(part)) chunks.push(await writer.put(c));
  }
  const last = chunker.finish();
  if (last !== null) chunks.push(await writer.put(last));
  await writer.flush();
  return { digest: `sha256:${hash.digest('hex')}`, size, chunks };
}

function manifestOf(groupId: string, layer: LayerRef, image: SandboxImage): CheckpointManifest {
  return {
    schemaVersion: 1,
    checkpointId: 'cp-1',
    groupId,
    placementGeneration: 1,
    source: { hostId: 'bench-source', epoch: 1 },
    createdAtMs: Date.now(),
    cleanStop: { stoppedAtMs: 1, lastTurnCompletedAtMs: null, stateRevision: 1, members: [{ memberId: 'm1', exitCode: 0, exitedWithinGrace: true }] },
    members: [{ memberId: 'm1', cliKind: 'claude-code', savedLocator: null, nativeSessionPaths: [], layer }],
    baseImageDigest: image.imageId,
    bridgeVersion: String(BRIDGE),
  };
}

/** The wire form of the clean stop above (the agent compares the manifest it is sent with the stored one). */
const CLEAN_STOP: CleanStopEvidence = {
  clean: true,
  noTurnInFlight: true,
  graceMs: 1000,
  stoppedAtUnixMs: 1,
  members: [{ memberId: 'm1', exitCode: 0, exitedByItself: true, signal: 'SIGTERM', withinGrace: true, containerPresent: true, writableLayerPresent: true, stopDurationMs: 1, sigtermAtUnixMs: 1, exitedAtUnixMs: 1, killed: false, turnInFlight: false }],
};

function procStatus(pid: number, field: 'VmHWM' | 'VmRSS'): number {
  try {
    const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) * 1024 : 0;
  } catch {
    return 0;
  }
}

/** Staging dirs or non-empty upper dirs the restore left in the engine's overlay2 store. */
function leftovers(host: DockerHost): string[] {
  const root = join(host.dataRoot, 'overlay2');
  const out: string[] = [];
  for (const layer of readdirSync(root)) {
    if (layer === 'l') continue;
    let names: string[] = [];
    try {
      names = readdirSync(join(root, layer));
    } catch {
      continue;
    }
    for (const n of names) if (n.includes('.restore-')) out.push(`${layer}/${n}`);
  }
  return out;
}

interface ScenarioResult {
  readonly scenario: string;
  readonly layer_bytes: number;
  readonly layer_chunks: number;
  readonly outcome: string;
  readonly reason: string;
  readonly message: string;
  readonly command_seconds: number;
  readonly heartbeat_interval_ms: number;
  readonly heartbeats_during: number;
  /** Longest gap between heartbeats as received by this process, over the command's duration (ms). */
  readonly max_heartbeat_gap_received_ms: number;
  /** The same, by the agent's own send timestamps. */
  readonly max_heartbeat_gap_sent_ms: number;
  readonly agent_peak_rss_bytes: number;
  readonly agent_rss_before_bytes: number;
  readonly leftovers: readonly string[];
  readonly load_average_1m: number;
}

async function scenario(name: string, nats: TestNats, nc: NatsConnection, host: DockerHost, image: SandboxImage, store: ChunkStore, layer: LayerRef, responder: RegistrationResponder): Promise<ScenarioResult> {
  const hostId = `bench-${name}`;
  const cacheDir = await mkdtemp(join(tmpdir(), 'sf-bench-cache-'));
  const groupId = `g-${name}`;
  const manifest = manifestOf(groupId, layer, image);
  await store.putManifest(manifest);
  const env: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    HOME: process.env.HOME,
    SANDBOXFLEET_HOST_ID: hostId,
    SANDBOXFLEET_NATS_URL: nats.server.url,
    SANDBOXFLEET_DOCKER_SOCKET: host.socketPath,
    SANDBOXFLEET_IMAGE_REF: image.reference,
    SANDBOXFLEET_AGENT_SHA: TEST_AGENT_SHA,
    SANDBOXFLEET_HEARTBEAT_INTERVAL_MS: String(HEARTBEAT_MS),
    SANDBOXFLEET_HTTP_PORT: '0',
    SANDBOXFLEET_LAYER_CACHE_DIR: cacheDir,
    LOG_LEVEL: 'warn',
    ...(MAX_ENTRIES !== undefined ? { SANDBOXFLEET_LAYER_MAX_ENTRIES: MAX_ENTRIES } : {}),
  };
  const registered = responder.next(hostId, 120_000);
  const child = spawn(process.execPath, ['--import', 'tsx', 'cmd/host-agent/main.ts'], { cwd: REPO, env, stdio: ['ignore', 'inherit', 'inherit'] });
  const pid = child.pid!;
  const hb = new Collector(nc, AgentSubjects.heartbeat(hostId), (b) => ({ at: Date.now(), sent: Heartbeat.decode(b).sentAtUnixMs }));
  try {
    await registered;
    const epoch = responder.epochs.get(hostId)!;
    await hb.waitFor(() => true, 60_000);
    const rssBefore = procStatus(pid, 'VmRSS');
    const t0 = Date.now();
    const result = await sendCommand(nc, { hostId, epoch, generation: 1, timeoutMs: 900_000 }, { $case: 'restore', value: { groupId, manifest: toWireManifest(manifest, { baseImageRef: image.reference, activityVersion: 1, lastCompletedTurnId: '', sourceContainerIds: new Map(), entryCounts: new Map(), cleanStop: CLEAN_STOP }) } });
    const t1 = Date.now();
    // Gaps over the command's window, counting the last beat before it and the first after it.
    const beats = hb.items;
    const first = Math.max(0, beats.findIndex((b) => b.at >= t0) - 1);
    let end = beats.findIndex((b) => b.at > t1);
    if (end < 0) {
      await hb.waitFor((b) => b.at > t1, 10_000);
      end = hb.items.findIndex((b) => b.at > t1);
    }
    const window = hb.items.slice(first, end + 1);
    let gapRecv = 0;
    let gapSent = 0;
    for (let i = 1; i < window.length; i++) {
      gapRecv = Math.max(gapRecv, window[i]!.at - window[i - 1]!.at);
      gapSent = Math.max(gapSent, window[i]!.sent - window[i - 1]!.sent);
    }
    return {
      scenario: name,
      layer_bytes: layer.size,
      layer_chunks: layer.chunks.length,
      outcome: CommandOutcome[result.outcome] ?? String(result.outcome),
      reason: result.reason,
      message: result.message.slice(0, 300),
      command_seconds: (t1 - t0) / 1000,
      heartbeat_interval_ms: HEARTBEAT_MS,
      heartbeats_during: window.length,
      max_heartbeat_gap_received_ms: gapRecv,
      max_heartbeat_gap_sent_ms: gapSent,
      agent_peak_rss_bytes: procStatus(pid, 'VmHWM'),
      agent_rss_before_bytes: rssBefore,
      leftovers: leftovers(host),
      load_average_1m: loadavg()[0]!,
    };
  } finally {
    await hb.stop();
    child.kill('SIGTERM');
    await new Promise((r) => child.once('exit', r));
    await rm(cacheDir, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  let host: DockerHost | undefined;
  let nats: TestNats | undefined;
  try {
    [nats, host] = await Promise.all([startTestNats(), startDockerHost({ name: 'bench-target' })]);
    const image = await provisionSandboxImage([host.docker], { bridgeVersion: BRIDGE });
    const nc = await nats.connect('bench-driver');
    const store = await ChunkStore.open(nc);
    const responder = registrationResponder(nc);
    const results: ScenarioResult[] = [];
    if (values.only === undefined || values.only === 'bomb') {
      const t = Date.now();
      const layer = await storeTar(store, bombTar(ENTRIES, values['escape-tail'] === true));
      console.log(`[restore-bounds] bomb layer: ${ENTRIES} entries, ${(layer.size / MiB).toFixed(0)} MiB, ${layer.chunks.length} chunks, stored in ${((Date.now() - t) / 1000).toFixed(1)} s`);
      results.push(await scenario('bomb', nats, nc, host, image, store, layer, responder));
      console.log(JSON.stringify(results.at(-1)));
    }
    if (values.only === undefined || values.only === 'big') {
      const t = Date.now();
      const layer = await storeTar(store, bigTar(GIB));
      console.log(`[restore-bounds] big layer: ${(layer.size / MiB).toFixed(0)} MiB, ${layer.chunks.length} chunks, stored in ${((Date.now() - t) / 1000).toFixed(1)} s`);
      results.push(await scenario('big', nats, nc, host, image, store, layer, responder));
      console.log(JSON.stringify(results.at(-1)));
    }
    await responder.stop();
    const bomb = results.find((r) => r.scenario === 'bomb');
    const big = results.find((r) => r.scenario === 'big');
    const figures = {
      ...(bomb ? { bomb_seconds: bomb.command_seconds, bomb_max_heartbeat_gap_ms: bomb.max_heartbeat_gap_sent_ms, bomb_agent_peak_rss_bytes: bomb.agent_peak_rss_bytes, bomb_refused: bomb.outcome === 'REFUSED' ? 1 : 0 } : {}),
      ...(big ? { big_seconds: big.command_seconds, big_max_heartbeat_gap_ms: big.max_heartbeat_gap_sent_ms, big_agent_peak_rss_bytes: big.agent_peak_rss_bytes, big_restored: big.outcome === 'OK' ? 1 : 0 } : {}),
    };
    await writeResult(run, { measured_at: new Date().toISOString(), cpus: 2, entries: ENTRIES, max_entries: MAX_ENTRIES ?? 'agent default', gib: GIB, ...figures, results }, values.file);
  } finally {
    await nats?.cleanup();
    await destroyAll([host]);
  }
}

await main();
