// Turn benchmark (issue "Runner gRPC API"): BeginTurn+CompleteTurn pairs per second and pair
// latency p50/p99 at 1, 8 and 64 concurrent runners, over mTLS gRPC, with every state write a
// compare-and-set in NATS JetStream KV. Measured in the same run, on the same nats-server and the
// same TLS setup, against two ceilings:
//   - a bare grpc-js echo service with the same message sizes (two calls = one "echo pair"),
//   - the raw nats.js KV compare-and-set rate at the same concurrency (c64).
// Backend: the NAMED SEAM backend (test/integration/api/seam-backend.ts: core member-session and
// group rules, idempotency records, CAS retries) persisting to NATS KV through src/store's
// KvRepository; the control plane's backend needs registered hosts and agents, which this bench
// does not start. Writes bench/results/turns.json.
//
//   node --import tsx bench/turns/run.ts [--seconds 5] [--fsync always|interval]
import * as grpc from '@grpc/grpc-js';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { z } from 'zod';
import { Kvm } from '@nats-io/kv';
import { jetstream } from '@nats-io/jetstream';
import { ApiServer } from '../../src/api/runner-server.ts';
import { ContextState, TurnEndKind } from '../../src/gen/sandboxfleet/v1/common.ts';
import { RunnerServiceService, type BeginTurnResponse, type CompleteTurnResponse, type RunnerServiceServer } from '../../src/gen/sandboxfleet/v1/runner.ts';
import { RunnerClient } from '../../src/runner-sdk/index.ts';
import { connectNats } from '../../src/store/connection.ts';
import { KvRepository } from '../../src/store/kv-repository.ts';
import { LocalNatsServer, type FsyncPolicy } from '../../src/store/local-nats-server.ts';
import { createTestPki, type TestPki } from '../../test/support/certs.ts';
import { SeamBackend, type SeamRecord } from '../../test/integration/api/seam-backend.ts';

const { values } = parseArgs({ options: { seconds: { type: 'string', default: '5' }, fsync: { type: 'string', default: 'always' } } });
const seconds = Number(values.seconds);
// 'always' is the store's production default (every acknowledged write is on disk); 'interval'
// is nats-server's own default (fsync every 2 min), to show what the disk costs.
const fsync: FsyncPolicy = values.fsync === 'interval' ? { intervalMs: 120_000 } : 'always';
const LEVELS = [1, 8, 64] as const;

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

async function main(): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'sf-bench-turns-'));
  const pki: TestPki = await createTestPki();
  const nats = await LocalNatsServer.start({ storeDir: join(dir, 'store'), workDir: dir, fsync, startTimeoutMs: 20_000 });
  const nc = await connectNats({ servers: nats.url, name: 'bench-turns' });
  const mtls = { ca: pki.ca, cert: pki.server.cert, key: pki.server.key };
  const servers: ApiServer[] = [];
  const echoServer = new grpc.Server({ 'grpc.max_receive_message_length': 256 * 1024 });
  try {
    const kvm = new Kvm(jetstream(nc));
    const seamKv = await kvm.create('bench_turns_seam', { history: 1 });
    const repo = new KvRepository<SeamRecord>({ kv: seamKv, bucket: 'bench_turns_seam', schema: z.custom<SeamRecord>((v) => typeof v === 'object' && v !== null), maxRecordBytes: 64 * 1024 });
    const backend = new SeamBackend({ store: repo });
    const api = await ApiServer.start({ runner: backend, address: '127.0.0.1:0', security: { mode: 'mtls', mtls } });
    servers.push(api);
    const client = new RunnerClient({ address: `127.0.0.1:${api.port}`, tls: { ca: pki.ca, cert: pki.runner.cert, key: pki.runner.key }, deadlineMs: 10_000 });

    // --- the API: one group per runner, begin+complete pairs ---------------------------------------
    const results: Record<number, Level> = {};
    let run = 0;
    for (const c of LEVELS) {
      run += 1;
      const groups = await Promise.all(
        Array.from({ length: c }, async (_, i) => {
          const opened = await client.openGroup({ conversationId: `bench-${run}-${i}`, members: [{ memberId: 'claude', cli: 'claude-code' }] });
          return opened.group?.groupId ?? '';
        }),
      );
      results[c] = await measure(c, async (i) => {
        const groupId = groups[i] ?? '';
        const begun = await client.beginTurn({ groupId, memberId: 'claude' });
        if (begun.contextState === ContextState.UNSPECIFIED) throw new Error('no context state');
        await client.completeTurn({ groupId, memberId: 'claude', turnId: begun.turnId, observedLocator: `sess-${run}-${i}`, evidence });
      });
      console.log(`api c${c}: ${JSON.stringify(results[c])}`);
    }
    client.close();

    // --- ceiling 1: bare grpc-js echo with the same message sizes ------------------------------------
    const beginAnswer: BeginTurnResponse = { turnId: `t-${'0'.repeat(24)}`, contextState: ContextState.LIVE, locator: 'sess-1-1', hostId: 'seam-host-1', hostEpoch: 1, placementGeneration: 1, containerId: 'ctr-000000000000', startedAtUnixMs: Date.now() };
    const completeAnswer: CompleteTurnResponse = { sessionKept: true, savedLocator: 'sess-1-1', nextContextState: ContextState.LIVE, reason: '' };
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
    const echo64 = await measure(64, async (i) => {
      const begun = await echoClient.beginTurn({ groupId: `g-${i}`, memberId: 'claude' });
      await echoClient.completeTurn({ groupId: `g-${i}`, memberId: 'claude', turnId: begun.turnId, observedLocator: 'sess-1-1', evidence });
    });
    console.log(`echo c64: ${JSON.stringify(echo64)}`);
    echoClient.close();

    // --- ceiling 2: raw nats.js KV compare-and-set at c64 -------------------------------------------
    const rawKv = await kvm.create('bench_turns_raw', { history: 1 });
    const value = new TextEncoder().encode(JSON.stringify({ pad: 'x'.repeat(900) }));
    const revisions = await Promise.all(Array.from({ length: 64 }, (_, i) => rawKv.create(`k${i}`, value)));
    const cas = await measure(64, async (i) => {
      revisions[i] = await rawKv.update(`k${i}`, value, revisions[i] ?? 0);
    });
    console.log(`raw kv cas c64: ${JSON.stringify(cas)}`);

    const c64 = results[64] as Level;
    const out = {
      bench: 'turns',
      measured_at: new Date().toISOString(),
      machine: { cores: (await import('node:os')).cpus().length, node: process.version },
      backend: 'seam (test/integration/api/seam-backend.ts) over NATS KV via src/store KvRepository',
      transport: 'grpc-js over mTLS on 127.0.0.1, one shared client channel',
      nats_fsync: fsync === 'always' ? 'always' : `interval ${fsync.intervalMs} ms`,
      load_average_1m_at_end: round((await import('node:os')).loadavg()[0] ?? 0, 2),
      seconds_per_level: seconds,
      pairs_per_s_c1: results[1]?.pairsPerS,
      pairs_per_s_c8: results[8]?.pairsPerS,
      pairs_per_s_c64: c64.pairsPerS,
      p50_ms_c1: results[1]?.p50Ms,
      p99_ms_c1: results[1]?.p99Ms,
      p50_ms_c8: results[8]?.p50Ms,
      p99_ms_c8: results[8]?.p99Ms,
      p50_ms_c64: c64.p50Ms,
      p99_ms_c64: c64.p99Ms,
      echo_pairs_per_s_c64: echo64.pairsPerS,
      echo_p99_ms_c64: echo64.p99Ms,
      fraction_of_echo: round(c64.pairsPerS / echo64.pairsPerS, 3),
      raw_cas_per_s: cas.pairsPerS,
      raw_cas_p99_ms: cas.p99Ms,
      kv_writes_per_pair: 4,
    };
    const resultsDir = new URL('../results/', import.meta.url);
    await mkdir(resultsDir, { recursive: true });
    await writeFile(new URL('turns.json', resultsDir), `${JSON.stringify(out, null, 2)}\n`);
    console.log(JSON.stringify(out, null, 2));
  } finally {
    await Promise.allSettled(servers.map((s) => s.shutdown(1_000)));
    echoServer.forceShutdown();
    await nc.close();
    await nats.stop();
    await pki.cleanup();
    await rm(dir, { recursive: true, force: true });
  }
}

await main();
