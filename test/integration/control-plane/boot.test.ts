// `npm start` on embedded defaults: the control plane launches its own nats-server (JetStream,
// data under the state dir), opens the store and serves /healthz, /readyz and /metrics.
// Runs the real entry point as a child process, exactly as scripts/start does (with plaintext gRPC
// on loopback, SANDBOXFLEET_GRPC_INSECURE=1, as `npm start` sets it; without TLS files or that
// flag the process refuses to start, R-R5).
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AdminServiceClient, ListHostsRequest, type ListHostsResponse } from '../../../src/gen/sandboxfleet/v1/admin.ts';

let child: ChildProcess;
let stateDir: string;
let opsUrl: string;
let grpcAddress: string;

beforeAll(async () => {
  stateDir = await mkdtemp(join(tmpdir(), 'sf-cp-'));
  child = spawn(process.execPath, ['--import', 'tsx', 'cmd/control-plane/main.ts'], {
    env: { ...process.env, SANDBOXFLEET_STATE_DIR: stateDir, SANDBOXFLEET_HTTP_PORT: '0', SANDBOXFLEET_NATS_URL: '', SANDBOXFLEET_GRPC_INSECURE: '1', SANDBOXFLEET_GRPC_HOST: '127.0.0.1', SANDBOXFLEET_GRPC_PORT: '0' },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  opsUrl = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('control plane did not become ready in 60 s')), 60_000);
    child.once('exit', (code) => reject(new Error(`control plane exited early with code ${code}`)));
    createInterface({ input: child.stdout! }).on('line', (line) => {
      const entry = JSON.parse(line) as { msg?: string; ops?: string; grpc?: string };
      if (entry.msg === 'control plane ready' && entry.ops) {
        clearTimeout(timer);
        grpcAddress = entry.grpc ?? '';
        resolve(entry.ops);
      }
    });
  });
});

afterAll(async () => {
  if (child.exitCode === null) {
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGTERM');
    await exited;
  }
  await rm(stateDir, { recursive: true, force: true });
});

describe('control plane on embedded defaults', () => {
  it('serves health, readiness and the sandboxfleet metric catalogue', async () => {
    expect((await fetch(`${opsUrl}/healthz`)).status).toBe(200);
    expect((await fetch(`${opsUrl}/readyz`)).status).toBe(200);
    const metrics = await (await fetch(`${opsUrl}/metrics`)).text();
    expect(metrics).toContain('sandboxfleet_lost_sessions_total');
    expect(metrics).toContain('sandboxfleet_attestation_refusals_total');
    expect((await fetch(`${opsUrl}/nope`)).status).toBe(404);
  });

  it('serves gRPC on the loopback address it logged', async () => {
    expect(grpcAddress).toMatch(/^127\.0\.0\.1:\d+$/);
    const client = new AdminServiceClient(grpcAddress, grpc.credentials.createInsecure());
    const hosts = await new Promise<ListHostsResponse>((resolve, reject) =>
      client.listHosts(ListHostsRequest.fromPartial({}), (err, res) => (err ? reject(err) : resolve(res))),
    );
    expect(hosts.hosts).toEqual([]);
    client.close();
  });

  it('shuts down cleanly on SIGTERM, stopping its nats-server', async () => {
    const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
    child.kill('SIGTERM');
    expect(await exited).toBe(0);
  });
});
