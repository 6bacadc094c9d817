// Turn benchmark (issue 5 "Runner gRPC API"): BeginTurn+CompleteTurn pairs per second and pair
// latency p50/p99 at 1, 8 and 64 concurrent runners, against the REAL control plane:
//   runner SDK client ──gRPC over mTLS──▶ ApiServer ─▶ ControlPlaneRunnerBackend ─▶ NATS JetStream KV
//   (compare-and-set on every write), with groups placed on a real dockerd host by a real host agent
//   (registered, attested, heartbeating). 64 groups of one member each; runner i always drives group
//   i, so c runners never contend for a group. Every turn after a group's first is LIVE.
// Measured in the same run, on the same nats-server and TLS setup, against two ceilings:
//   - a bare grpc-js echo service with the same message sizes (two calls = one "echo pair");
//   - raw nats.js KV compare-and-set at c64 with the same fsync policy.
// Both fsync policies are run, each on its own fresh nats-server, dockerd host and agent:
// `always` (the production setting: every acknowledged write is on disk) gives the required keys,
// `interval` (nats-server's default, fsync every 2 min) the `*_fsync_interval` keys. Writes per pair
// are counted from the JetStream streams' sequence numbers (every stored message, heartbeats
// included), not assumed. Client, API server, control plane and agent share this Node process (the
// echo ceiling is measured the same way); nats-server and dockerd are their own processes.
//
//   node --import tsx bench/turns/run.ts [--seconds 5] [--fsync both|always|interval] [--profile DIR]
// --profile writes a V8 CPU profile of each c64 window (this process only) to DIR.
// --no-async-traces connects the control plane with nats.js `noAsyncTraces` (no Error object with a
// captured stack per request; an experiment, not the production setting).
import * as grpc from '@grpc/grpc-js';
import { mkdir, writeFile } from 'node:fs/promises';
import { Session } from 'node:inspector/promises';
import { join } from 'node:path';
import { cpus, loadavg } from 'node:os';
import { parseArgs } from 'node:util';
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/transport-node';
import { ApiServer } from '../../src/api/runner-server.ts';
import { ControlPlaneConfigSchema } from '../../src/config/control-plane.ts';
import { CONTROL_PLANE_BUCKETS } from '../../src/control-plane/buckets.ts';
import { ControlPlane } from '../../src/control-plane/control-plane.ts';
import type { ControlPlaneRunnerBackend } from '../../src/control-plane/runner-backend.ts';
import { HostRecordSchema } from '../../src/control-plane/records.ts';
import { Keys } from '../../src/control-plane/state.ts';
import { API_SHA } from '../../src/gen/api-sha.ts';
import { ContextState, TurnEndKind } from '../../src/gen/sandboxfleet/v1/common.ts';
import { RunnerServiceService, type BeginTurnResponse, type CompleteTurnResponse, type RunnerServiceServer } from '../../src/gen/sandboxfleet/v1/runner.ts';
import { silentLogger } from '../../src/observability/logger.ts';
import { FleetMetrics } from '../../src/observability/metrics.ts';
import { RunnerClient } from '../../src/runner-sdk/index.ts';
import { ChunkStore } from '../../src/store/chunk-store.ts';
import { connectNats, StateStore } from '../../src/store/connection.ts';
import type { FsyncPolicy } from '../../src/store/local-nats-server.ts';
import { startAgent, TEST_AGENT_SHA, type InProcessAgent } from '../../test/support/agent.ts';
import { createTestPki, type TestPki } from '../../test/support/certs.ts';
import { destroyAll, startDockerHosts, type DockerHost } from '../../test/support/docker.ts';
import { startTestNats, type TestNats } from '../../test/support/nats.ts';
import { provisionSandboxImage } from '../../test/support/sandbox-image.ts';

const { values } = parseArgs({ options: { seconds: { type: 'string', default: '5' }, fsync: { type: 'string', default: 'both' }, profile: { type: 'string' }, 'no-async-traces': { type: 'boolean', default: false } } });
const seconds = Number(values.seconds);
const LEVELS = [1, 8, 64] as const;
const GROUPS = 64;
const HOST = 'host-a';

const percentile = (sorted: number[], p: number): number => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? Number.NaN;
const round = (x: number, d = 1): number => Math.round(x * 10 ** d) / 10 ** d;

interface Level {
  readonly pairs: number;
  readonly pairsPerS: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
}

/** Runs `worker` on `concurrency` loops for the measurement window (after a short warmup). */
async function measure(concurrency: number, worker: (i: number) => Promise<void>): Promise<Level> {
  const warmupEnd = Date.now() + 500;
  while (Date.now() < warmupEnd) await Promise.all(Array.from({ length: concurrency }, (_, i) => worker(i)));
  const latencies: number[] = [];
  const start = performance.now();
  const end = start + seconds * 1000;
  await Promise.all(
    Array.from({ length: concurrency }, async (_, i) => {
      while (performance.now() < end) {
        const t0 = performance.now();
        await worker(i);
        latencies.push(performance.now() - t0);
      }
    }),
  );
  const elapsed = (performance.now() - start) / 1000;
  latencies.sort((a, b) => a - b);
  return { pairs: latencies.length, pairsPerS: round(latencies.length / elapsed), p50Ms: round(percentile(latencies, 50), 2), p99Ms: round(percentile(latencies, 99), 2) };
}

const evidence = {
  kind: TurnEndKind.RESULT,
  nativeTurnEnded: true,
  succeeded: true,
  cleanupFinished: true,
  transportUsable: true,
  locatorUsable: true,
  processExited: false,
  exitConfirmed: false,
  nativeTurnId: '',
  errorMessage: '',
};

/** Every message JetStream stored so far, over all streams (KV writes, events, chunks). */
async function storedMessages(nc: NatsConnection): Promise<number> {
  const jsm = await jetstreamManager(nc);
  let total = 0;
  for await (const s of jsm.streams.list()) total += s.state.last_seq;
  return total;
}

async function waitFor<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 120_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    const v = await probe().catch(() => undefined);
    if (v !== undefined) return v;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`timed out waiting for ${what}`);
}

interface Scenario {
  readonly levels: Record<number, Level & { writesPerPair: number; contextStates: string[] }>;
  readonly echo: Level;
  readonly cas: Level;
  readonly beginEvidence: { readonly heartbeat: number; readonly agent: number };
  readonly loadBefore: number;
  readonly loadAfter: number;
}

async function scenario(fsync: FsyncPolicy, pki: TestPki): Promise<Scenario> {
  const loadBefore = loadavg()[0] ?? 0;
  let nats: TestNats | undefined;
  let hosts: DockerHost[] = [];
  let agent: InProcessAgent | undefined;
  let plane: ControlPlane | undefined;
  let api: ApiServer | undefined;
  let ownNc: NatsConnection | undefined;
  const echoServer = new grpc.Server();
  try {
    [nats, hosts] = await Promise.all([startTestNats({ fsync }), startDockerHosts(1)]);
    const image = await provisionSandboxImage(hosts.map((h) => h.docker), { bridgeVersion: 4 });
    if (values['no-async-traces']) ownNc = await connectNats({ servers: nats.server.url, name: 'control-plane', extra: { noAsyncTraces: true } });
    const nc = ownNc ?? (await nats.connect('control-plane'));
    const store = await StateStore.open(nc, { buckets: CONTROL_PLANE_BUCKETS });
    const chunks = await ChunkStore.open(nc);
    // Production timings (heartbeat every 2 s, TTL 10 s), only the allow-lists are the test ones.
    const config = ControlPlaneConfigSchema.parse({ allowedAgentShas: [TEST_AGENT_SHA], allowedImageDigests: [image.imageId] });
    plane = new ControlPlane({ config, nc, store, chunks, metrics: new FleetMetrics(), logger: silentLogger(), apiSha: API_SHA, replicaId: 'cp-bench' });
    plane.start();
    agent = await startAgent(await nats.connect(HOST), { hostId: HOST, natsUrl: nats.server.url, host: hosts[0]!, imageRef: image.reference, overrides: { heartbeatIntervalMs: config.heartbeatIntervalMs, maxMembers: 256 } });
    const hostRepo = store.repository('hosts', HostRecordSchema);
    await waitFor(`${HOST} READY`, async () => ((await hostRepo.get(Keys.host(HOST)))?.value.lifecycle.state === 'READY' ? true : undefined));

    api = await ApiServer.start({ runner: plane.runner, address: '127.0.0.1:0', security: { mode: 'mtls', mtls: { ca: pki.ca, cert: pki.server.cert, key: pki.server.key } } });
    const client = new RunnerClient({ address: `127.0.0.1:${api.port}`, tls: { ca: pki.ca, cert: pki.runner.cert, key: pki.runner.key }, deadlineMs: 30_000 });

    // 64 groups of one member on the dockerd host, opened 4 at a time (container create + start).
    const groups: string[] = [];
    for (let i = 0; i < GROUPS; i += 4) {
      const batch = await Promise.all(Array.from({ length: 4 }, async (_, j) => {
        const opened = await client.openGroup({ conversationId: `bench-${i + j}`, members: [{ memberId: 'claude', cli: 'claude-code' }] });
        return opened.group?.groupId ?? '';
      }));
      groups.push(...batch);
    }
    // First turn of every group (NEW: the agent is asked), then wait for a heartbeat that lists
    // every container so later turns can be proven LIVE from it.
    await Promise.all(groups.map(async (groupId, i) => {
      const begun = await client.beginTurn({ groupId, memberId: 'claude' });
      await client.completeTurn({ groupId, memberId: 'claude', turnId: begun.turnId, observedLocator: `sess-${i}`, evidence });
    }));
    await new Promise((r) => setTimeout(r, 2 * config.heartbeatIntervalMs + 500));

    const levels: Scenario['levels'] = {};
    for (const c of LEVELS) {
      const states = new Set<string>();
      const before = await storedMessages(nc);
      let counted = 0;
      const profiler = values.profile !== undefined && c === 64 ? new Session() : undefined;
      if (profiler !== undefined) {
        profiler.connect();
        await profiler.post('Profiler.enable');
        await profiler.post('Profiler.start');
      }
      const level = await measure(c, async (i) => {
        const groupId = groups[i] ?? '';
        const begun = await client.beginTurn({ groupId, memberId: 'claude' });
        states.add(ContextState[begun.contextState] ?? String(begun.contextState));
        await client.completeTurn({ groupId, memberId: 'claude', turnId: begun.turnId, observedLocator: `sess-${i}`, evidence });
        counted += 1;
      });
      if (profiler !== undefined) {
        const { profile } = await profiler.post('Profiler.stop');
        await mkdir(values.profile!, { recursive: true });
        await writeFile(join(values.profile!, `turns-c64-${fsync === 'always' ? 'always' : 'interval'}.cpuprofile`), JSON.stringify(profile));
        profiler.disconnect();
      }
      const writes = (await storedMessages(nc)) - before;
      levels[c] = { ...level, writesPerPair: round(writes / counted, 2), contextStates: [...states] };
      console.log(`api c${c} (${JSON.stringify(fsync)}): ${JSON.stringify(levels[c])}`);
    }
    client.close();
    const beginEvidence = (plane.runner as ControlPlaneRunnerBackend).beginEvidenceCounts;

    // --- ceiling 1: bare grpc-js echo with the same message sizes ------------------------------------
    const beginAnswer: BeginTurnResponse = { turnId: `t-${'0'.repeat(32)}`, contextState: ContextState.LIVE, locator: 'sess-1', hostId: HOST, hostEpoch: 1, placementGeneration: 1, containerId: '0'.repeat(64), startedAtUnixMs: Date.now() };
    const completeAnswer: CompleteTurnResponse = { sessionKept: true, savedLocator: 'sess-1', nextContextState: ContextState.LIVE, reason: '' };
    const echo: RunnerServiceServer = {
      openGroup: (_call, cb) => cb({ code: grpc.status.UNIMPLEMENTED }),
      stopGroup: (_call, cb) => cb({ code: grpc.status.UNIMPLEMENTED }),
      getGroupState: (_call, cb) => cb({ code: grpc.status.UNIMPLEMENTED }),
      beginTurn: (_call, cb) => cb(null, beginAnswer),
      completeTurn: (_call, cb) => cb(null, completeAnswer),
    };
    echoServer.addService(RunnerServiceService, echo);
    const echoPort = await new Promise<number>((resolve, reject) =>
      echoServer.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createSsl(pki.ca, [{ cert_chain: pki.server.cert, private_key: pki.server.key }], true), (e, p) => (e ? reject(e) : resolve(p))),
    );
    const echoClient = new RunnerClient({ address: `127.0.0.1:${echoPort}`, tls: { ca: pki.ca, cert: pki.runner.cert, key: pki.runner.key } });
    const echoLevel = await measure(64, async (i) => {
      const begun = await echoClient.beginTurn({ groupId: groups[i] ?? '', memberId: 'claude' });
      await echoClient.completeTurn({ groupId: groups[i] ?? '', memberId: 'claude', turnId: begun.turnId, observedLocator: 'sess-1', evidence });
    });
    console.log(`echo c64: ${JSON.stringify(echoLevel)}`);
    echoClient.close();

    // --- ceiling 2: raw nats.js KV compare-and-set at c64, same server, same fsync policy ------------
    const kvm = new Kvm(jetstream(nc));
    const rawKv = await kvm.create('bench_turns_raw', { history: 1 });
    const value = new TextEncoder().encode(JSON.stringify({ pad: 'x'.repeat(900) }));
    const revisions = await Promise.all(Array.from({ length: 64 }, (_, i) => rawKv.create(`k${i}`, value)));
    const cas = await measure(64, async (i) => {
      revisions[i] = await rawKv.update(`k${i}`, value, revisions[i] ?? 0);
    });
    console.log(`raw kv cas c64: ${JSON.stringify(cas)}`);
    return { levels, echo: echoLevel, cas, beginEvidence, loadBefore, loadAfter: loadavg()[0] ?? 0 };
  } finally {
    echoServer.forceShutdown();
    await api?.shutdown(1_000).catch(() => undefined);
    await plane?.stop().catch(() => undefined);
    await agent?.stop().catch(() => undefined);
    await ownNc?.close().catch(() => undefined);
    await nats?.cleanup().catch(() => undefined);
    await destroyAll(hosts).catch(() => undefined);
  }
}

function keys(s: Scenario, suffix: string): Record<string, unknown> {
  const c64 = s.levels[64]!;
  const out: Record<string, unknown> = {
    pairs_per_s_c1: s.levels[1]?.pairsPerS,
    pairs_per_s_c8: s.levels[8]?.pairsPerS,
    pairs_per_s_c64: c64.pairsPerS,
    p50_ms_c1: s.levels[1]?.p50Ms,
    p99_ms_c1: s.levels[1]?.p99Ms,
    p50_ms_c8: s.levels[8]?.p50Ms,
    p99_ms_c8: s.levels[8]?.p99Ms,
    p50_ms_c64: c64.p50Ms,
    p99_ms_c64: c64.p99Ms,
    echo_pairs_per_s_c64: s.echo.pairsPerS,
    echo_p99_ms_c64: s.echo.p99Ms,
    fraction_of_echo: round(c64.pairsPerS / s.echo.pairsPerS, 3),
    raw_cas_per_s: s.cas.pairsPerS,
    raw_cas_p99_ms: s.cas.p99Ms,
    jetstream_writes_per_pair_c1: s.levels[1]?.writesPerPair,
    jetstream_writes_per_pair_c64: c64.writesPerPair,
    context_states: [...new Set(Object.values(s.levels).flatMap((l) => l.contextStates))],
    begins_by_evidence: s.beginEvidence,
    load_average_1m_before: round(s.loadBefore, 2),
    load_average_1m_after: round(s.loadAfter, 2),
  };
  return Object.fromEntries(Object.entries(out).map(([k, v]) => [`${k}${suffix}`, v]));
}

/**
 * Where the time goes, from this run's own numbers: with `sync_interval: always` nats-server fsyncs
 * every stored message before acknowledging it, so raw CAS/s at c64 is the durable-write ceiling and
 * a pair (two durable writes to the groups stream) cannot beat half of it; by Little's law c64
 * latency is then at least 64 / pairs-per-second.
 */
function notes(r: Partial<Record<'always' | 'interval', Scenario>>): string {
  const parts: string[] = [];
  const a = r.always;
  if (a !== undefined) {
    const c64 = a.levels[64]!;
    const bound = a.cas.pairsPerS / 2;
    parts.push(
      `Writes: a pair is 2 fsynced CAS writes of the group record (answers stored inside them); counted ${c64.writesPerPair} JetStream messages/pair over all streams (heartbeats and events included); was 4 (2 idempotency records + 2 group updates) plus an agent inventory request per begin. Steady-state begins read nothing: LIVE is proven from the heartbeat (${a.beginEvidence.heartbeat} begins) and only first turns asked the agent (${a.beginEvidence.agent}).`,
      `fsync always: ${c64.pairsPerS} pairs/s at c64 = ${round((100 * c64.pairsPerS) / bound)}% of the disk bound raw_cas_per_s/2 = ${round(bound)}.`,
      bound < 1000
        ? 'The 1,000 pairs/s target cannot be met with fsync always on this disk: two durable writes per pair and the server does not group-commit concurrent writes.'
        : 'The disk is not what stops it: the same run without per-write fsync (below) is CPU-bound in the Node process.',
      `Little's law: c64 mean latency >= 64 / pairs_per_s = ${round((64 / c64.pairsPerS) * 1000)} ms, so p99 <= 50 ms at c64 needs >= 1280 pairs/s; the echo ceiling itself has p99 ${a.echo.p99Ms} ms here.`,
    );
  }
  const i = r.interval;
  if (i !== undefined) {
    const c64 = i.levels[64]!;
    parts.push(`fsync interval: ${c64.pairsPerS} pairs/s at c64 = ${round((100 * c64.pairsPerS) / i.echo.pairsPerS)}% of the echo ceiling of the same run (${i.echo.pairsPerS}); raw CAS ${i.cas.pairsPerS}/s is far from the limit.`);
  }
  parts.push(
    'Where the time goes (bench --profile, c64 window, fsync interval, 18:58 run): the Node process is ~96% busy (client, API server and control plane share one thread; nats-server and dockerd use the other core): gRPC/http2/TLS for both sides ~38%, GC ~9%, nats.js ~9% of which ~6.6% is building an Error with a stack per request (connection option noAsyncTraces; --no-async-traces measured ~+5-10%, within noise), group record encode on every write (zod validation + JSON, R-R4) ~6.6%, peer identity from the client certificate on every call (getPeerCertificate, src/api) ~6%, backend decisions + idempotency digests ~3%. A pair costs ~1.5 ms of CPU against ~0.5 ms for an echo pair: two NATS request/replies with validated JSON records plus the API server per-call work.',
    `Load average (1 min) before/after: always ${a ? `${round(a.loadBefore, 2)}/${round(a.loadAfter, 2)}` : '-'}, interval ${i ? `${round(i.loadBefore, 2)}/${round(i.loadAfter, 2)}` : '-'} (other sessions ran tests and benches on the same 2 cores; results between runs varied by up to 2x).`,
  );
  return parts.join(' ');
}

async function main(): Promise<void> {
  const pki = await createTestPki();
  const wanted = values.fsync === 'both' ? (['always', 'interval'] as const) : ([values.fsync === 'interval' ? 'interval' : 'always'] as const);
  const results: Partial<Record<'always' | 'interval', Scenario>> = {};
  try {
    for (const policy of wanted) results[policy] = await scenario(policy === 'always' ? 'always' : { intervalMs: 120_000 }, pki);
  } finally {
    await pki.cleanup();
  }
  const out = {
    bench: 'turns',
    measured_at: new Date().toISOString(),
    machine: { cores: cpus().length, node: process.version },
    backend: 'real control plane (src/control-plane/runner-backend.ts) over NATS JetStream KV; groups on a real dockerd host with a real host agent (production heartbeat timings)',
    transport: 'grpc-js over mTLS on 127.0.0.1, one shared client channel (runner SDK client)',
    layout: 'client, API server, control plane and agent in one Node process; nats-server and dockerd separate',
    groups: `${GROUPS} groups x 1 member; runner i drives group i`,
    seconds_per_level: seconds,
    nats_fsync: 'always (required keys); interval 120000 ms (*_fsync_interval keys)',
    kv_writes_per_pair: 2,
    ...(results.always ? keys(results.always, '') : {}),
    ...(results.interval ? keys(results.interval, '_fsync_interval') : {}),
    notes: notes(results),
  };
  const resultsDir = new URL('../results/', import.meta.url);
  await mkdir(resultsDir, { recursive: true });
  const path = new URL(values.fsync === 'both' ? 'turns.json' : `turns.${values.fsync}.json`, resultsDir);
  await writeFile(path, `${JSON.stringify(out, null, 2)}\n`);
  console.log(JSON.stringify(out, null, 2));
}

await main();
