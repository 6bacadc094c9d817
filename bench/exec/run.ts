// Exec through the fleet (R-I9) against its peer, direct dockerode exec on the host's own Docker
// socket, in one run on the same container:
//   - first-byte latency of `echo`, p50/p99 over N samples (fleet: the runner SDK over gRPC → the
//     control plane's relay → NATS → the host agent, a child process as in production → dockerd);
//   - stdout throughput of `cat` of a pseudo-random file (100 MB), sha256 checked on both paths.
// Goals (issue 13): fleet first byte ≤ 2× direct + 5 ms; fleet throughput ≥ 25% of direct.
//   node --import tsx bench/exec/run.ts [--samples 50] [--mb 100] [--smoke] [--out DIR]
import { createHash } from 'node:crypto';
import { parseArgs } from 'node:util';
import type Docker from 'dockerode';
import { ApiServer } from '../../src/api/runner-server.ts';
import { ExecFrameParser } from '../../src/docker/runtime.ts';
import { RunnerClient } from '../../src/runner-sdk/index.ts';
import { spawnAgent, type ChildAgent } from '../../test/support/agent.ts';
import { createTestPki } from '../../test/support/certs.ts';
import { startFleet, type Fleet } from '../../test/integration/control-plane/fleet-harness.ts';
import { BENCH_OPTIONS, startBench, writeResult } from '../common.ts';

const { values } = parseArgs({ options: { samples: { type: 'string' }, mb: { type: 'string' }, ...BENCH_OPTIONS } });
const run = startBench('exec', values);
const SAMPLES = Number(values.samples ?? (run.smoke ? 5 : 50));
const MB = Number(values.mb ?? (run.smoke ? 4 : 100));
const BYTES = MB * 1_000_000;

function quantile(xs: readonly number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
}
const round = (x: number, d = 2): number => Math.round(x * 10 ** d) / 10 ** d;

/** Direct: one exec on the engine; resolves at the first stdout byte, then drains (sha256) to the end. */
async function direct(docker: Docker, containerId: string, cmd: string[]): Promise<{ firstByteMs: number; totalMs: number; bytes: number; sha256: string }> {
  const t0 = performance.now();
  const ex = await docker.getContainer(containerId).exec({ Cmd: cmd, AttachStdout: true, AttachStderr: true });
  const stream = (await ex.start({ hijack: true, stdin: false })) as NodeJS.ReadableStream;
  const hash = createHash('sha256');
  let first = -1;
  let bytes = 0;
  const parser = new ExecFrameParser((kind, data) => {
    if (kind !== 1) return;
    if (first < 0) first = performance.now() - t0;
    bytes += data.length;
    hash.update(data);
  });
  await new Promise<void>((resolve, reject) => {
    stream.on('data', (c: Buffer) => parser.push(c));
    stream.on('end', resolve);
    stream.on('error', reject);
  });
  return { firstByteMs: first, totalMs: performance.now() - t0, bytes, sha256: hash.digest('hex') };
}

/** Fleet: the same command through RunnerService.Exec. */
async function fleetExec(runner: RunnerClient, groupId: string, cmd: string[]): Promise<{ firstByteMs: number; totalMs: number; bytes: number; sha256: string }> {
  const t0 = performance.now();
  const h = await runner.exec({ groupId, memberId: 'm1', argv: cmd, outputLimitBytes: 4 * BYTES + 1_000_000 });
  const hash = createHash('sha256');
  let first = -1;
  let bytes = 0;
  for await (const e of h.output()) {
    if (e.kind !== 'stdout') continue;
    if (first < 0) first = performance.now() - t0;
    bytes += e.data.length;
    hash.update(e.data);
  }
  return { firstByteMs: first, totalMs: performance.now() - t0, bytes, sha256: hash.digest('hex') };
}

let fleet: Fleet | undefined;
let agent: ChildAgent | undefined;
let server: ApiServer | undefined;
let runner: RunnerClient | undefined;
const pki = await createTestPki();
try {
  fleet = await startFleet(1);
  const plane = await fleet.startPlane();
  // The agent as a child process (as in production): its CPU is not this process's.
  agent = spawnAgent({ hostId: 'host-a', natsUrl: fleet.nats.server.url, host: fleet.hosts[0]!, imageRef: fleet.image.reference, overrides: { heartbeatIntervalMs: 500 } });
  await fleet.waitFor('host-a heartbeating', async () => (plane.fleet.heartbeat('host-a') !== undefined ? true : undefined), 60_000);
  server = await ApiServer.start({ runner: plane.runner, exec: plane.exec, address: '127.0.0.1:0', security: { mode: 'mtls', mtls: { ca: pki.ca, cert: pki.server.cert, key: pki.server.key } } });
  runner = new RunnerClient({ address: `127.0.0.1:${server.port}`, tls: { ca: pki.ca, cert: pki.runner.cert, key: pki.runner.key }, deadlineMs: 120_000 });
  const opened = await runner.openGroup({ conversationId: 'bench-exec', members: [{ memberId: 'm1', cli: 'claude-code' }] });
  const groupId = opened.group!.groupId;
  const containerId = opened.group!.members[0]!.containerId;
  const docker = fleet.hosts[0]!.docker;
  await direct(docker, containerId, ['/bin/sh', '-c', `head -c ${BYTES} /dev/urandom > /tmp/blob`]);

  // Warm both paths, then alternate samples so drift of this noisy machine hits both alike.
  await direct(docker, containerId, ['echo', 'x']);
  await fleetExec(runner, groupId, ['echo', 'x']);
  const firstDirect: number[] = [];
  const firstFleet: number[] = [];
  for (let i = 0; i < SAMPLES; i++) {
    firstDirect.push((await direct(docker, containerId, ['echo', 'x'])).firstByteMs);
    firstFleet.push((await fleetExec(runner, groupId, ['echo', 'x'])).firstByteMs);
  }
  const rounds = run.smoke ? 1 : 3;
  const tputDirect: number[] = [];
  const tputFleet: number[] = [];
  let digestsEqual = true;
  for (let r = 0; r < rounds; r++) {
    const d = await direct(docker, containerId, ['cat', '/tmp/blob']);
    const f = await fleetExec(runner, groupId, ['cat', '/tmp/blob']);
    if (d.bytes !== BYTES || f.bytes !== BYTES || d.sha256 !== f.sha256) digestsEqual = false;
    tputDirect.push(BYTES / 1e6 / (d.totalMs / 1000));
    tputFleet.push(BYTES / 1e6 / (f.totalMs / 1000));
  }
  const p50d = quantile(firstDirect, 0.5);
  const p50f = quantile(firstFleet, 0.5);
  const p99d = quantile(firstDirect, 0.99);
  const p99f = quantile(firstFleet, 0.99);
  const td = quantile(tputDirect, 0.5);
  const tf = quantile(tputFleet, 0.5);
  const fraction = tf / td;
  const result = {
    samples: SAMPLES,
    stream_bytes: BYTES,
    throughput_rounds: rounds,
    first_byte_p50_ms_fleet: round(p50f),
    first_byte_p50_ms_direct: round(p50d),
    first_byte_p99_ms_fleet: round(p99f),
    first_byte_p99_ms_direct: round(p99d),
    throughput_mb_s_fleet: round(tf, 1),
    throughput_mb_s_direct: round(td, 1),
    throughput_fraction_of_direct: round(fraction, 3),
    stream_intact: digestsEqual,
    goals: {
      first_byte_p50: { goal: '≤ 2 × direct + 5 ms', limit_ms: round(2 * p50d + 5), met: p50f <= 2 * p50d + 5 },
      first_byte_p99: { goal: '≤ 2 × direct + 5 ms', limit_ms: round(2 * p99d + 5), met: p99f <= 2 * p99d + 5 },
      throughput: { goal: '≥ 25% of direct', met: fraction >= 0.25 },
    },
    setup: 'one dockerd host; the host agent a child process (as in production); control plane, gRPC server (mTLS) and runner client in this process; direct = dockerode on the host\'s socket from this process; both paths sha256 every byte',
  };
  console.log(JSON.stringify(result, null, 2));
  await writeResult(run, result);
} finally {
  runner?.close();
  await server?.shutdown(1_000).catch(() => undefined);
  if (agent !== undefined) {
    agent.kill('SIGKILL');
    await agent.exited;
  }
  await fleet?.cleanup();
  await pki.cleanup();
}
