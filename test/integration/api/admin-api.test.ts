// The AdminService over real mTLS loopback sockets, bound to a real ControlPlane on a real
// nats-server (no Docker hosts: these are the API-level properties). R-R5: admin methods answer an
// admin certificate and refuse runner and host certificates (PERMISSION_DENIED). With separate
// runner and admin CAs (the Helm chart's contract), the signing CA decides the role and a role the
// certificate names must agree with it; with one CA, the SAN/OU role decides. R-I1: validation,
// NOT_FOUND, paging bounds, and the event log read and followed from a sequence.
import * as grpc from '@grpc/grpc-js';
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAdminHandlers } from '../../../src/api/admin-handlers.ts';
import { readErrorDetail } from '../../../src/api/errors.ts';
import { roleCasFrom } from '../../../src/api/peer-identity.ts';
import { ApiServer } from '../../../src/api/runner-server.ts';
import { ControlPlaneConfigSchema } from '../../../src/config/control-plane.ts';
import { CONTROL_PLANE_BUCKETS, type ControlPlaneBuckets } from '../../../src/control-plane/buckets.ts';
import { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { API_SHA } from '../../../src/gen/api-sha.ts';
import * as adminProto from '../../../src/gen/sandboxfleet/v1/admin.ts';
import { AdminServiceClient, ListEventsRequest, type ListEventsResponse } from '../../../src/gen/sandboxfleet/v1/admin.ts';
import * as runnerProto from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { RunnerServiceClient } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { silentLogger } from '../../../src/observability/logger.ts';
import { FleetMetrics } from '../../../src/observability/metrics.ts';
import { ChunkStore } from '../../../src/store/chunk-store.ts';
import { StateStore } from '../../../src/store/connection.ts';
import { createTestPki, type CertPair, type TestPki } from '../../support/certs.ts';
import { startTestNats, type TestNats } from '../../support/nats.ts';

const run = promisify(execFile);

let pki: TestPki;
let nats: TestNats;
let plane: ControlPlane;
let store: StateStore<ControlPlaneBuckets>;
let server: ApiServer;
let split: ApiServer;
/** A second admin CA and certificates for the CA-split server. */
let adminCa: Buffer;
let opsByCa: CertPair;
let hostSignedByAdminCa: CertPair;

async function leaf(dir: string, ca: string, name: string, subject: string, extra: string[]): Promise<CertPair> {
  const o = (args: string[]) => run('openssl', args, { cwd: dir });
  await o(['req', '-new', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', subject]);
  await writeFile(join(dir, `${name}.ext`), `${['basicConstraints=CA:FALSE', 'keyUsage=critical,digitalSignature', 'extendedKeyUsage=clientAuth', ...extra].join('\n')}\n`);
  await o(['x509', '-req', '-in', `${name}.csr`, '-CA', `${ca}.crt`, '-CAkey', `${ca}.key`, '-set_serial', `0x${randomBytes(16).toString('hex')}`, '-out', `${name}.crt`, '-days', '2', '-extfile', `${name}.ext`]);
  return { cert: await readFile(join(dir, `${name}.crt`)), key: await readFile(join(dir, `${name}.key`)) };
}

type Outcome = { code: grpc.status; reason: string | undefined; response: unknown };

/** Complete request messages (the generated encoders expect every field). */
function requestOf(method: string, partial: object): unknown {
  const name = `${method[0]!.toUpperCase()}${method.slice(1)}Request`;
  const type = ((adminProto as Record<string, unknown>)[name] ?? (runnerProto as Record<string, unknown>)[name]) as { fromPartial(o: object): unknown };
  return type.fromPartial(partial);
}

function unaryCall(client: grpc.Client, method: string, partial: object): Promise<Outcome> {
  const request = requestOf(method, partial);
  type Req = unknown;
  const fn = (client as unknown as Record<string, (r: Req, md: grpc.Metadata, o: Partial<grpc.CallOptions>, cb: (e: grpc.ServiceError | null, r: unknown) => void) => void>)[method]!;
  return new Promise((resolve) => {
    fn.call(client, request, new grpc.Metadata(), { deadline: Date.now() + 20_000 }, (e, r) =>
      resolve(e ? { code: e.code, reason: readErrorDetail(e.metadata)?.reason, response: undefined } : { code: grpc.status.OK, reason: undefined, response: r }));
  });
}

function admin(port: number, pair: CertPair): AdminServiceClient {
  return new AdminServiceClient(`127.0.0.1:${port}`, grpc.credentials.createSsl(pki.ca, pair.key, pair.cert));
}

function runnerClient(port: number, pair: CertPair): RunnerServiceClient {
  return new RunnerServiceClient(`127.0.0.1:${port}`, grpc.credentials.createSsl(pki.ca, pair.key, pair.cert));
}

beforeAll(async () => {
  [pki, nats] = await Promise.all([createTestPki(), startTestNats()]);
  const nc = await nats.connect('control-plane');
  store = await StateStore.open(nc, { buckets: CONTROL_PLANE_BUCKETS });
  const chunks = await ChunkStore.open(nc);
  const config = ControlPlaneConfigSchema.parse({ reconcileIntervalMs: 200 });
  plane = new ControlPlane({ config, nc, store, chunks, metrics: new FleetMetrics(), logger: silentLogger(), apiSha: API_SHA, replicaId: 'cp-admin-test' });
  await plane.start();
  server = await ApiServer.start({
    runner: plane.runner, admin: createAdminHandlers(plane), address: '127.0.0.1:0',
    security: { mode: 'mtls', mtls: { ca: pki.ca, cert: pki.server.cert, key: pki.server.key } },
  });

  // The chart's contract: runner CA = the fleet CA, admin CA = a second CA.
  const o = (args: string[]) => run('openssl', args, { cwd: pki.dir });
  await o(['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', 'admin-ca.key', '-out', 'admin-ca.crt', '-days', '2',
    '-subj', '/O=sandboxfleet-test/CN=admin-ca', '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign']);
  adminCa = await readFile(join(pki.dir, 'admin-ca.crt'));
  opsByCa = await leaf(pki.dir, 'admin-ca', 'ops-1', '/O=sandboxfleet-test/CN=ops-1', []);
  hostSignedByAdminCa = await leaf(pki.dir, 'admin-ca', 'host-z', '/O=sandboxfleet-test/OU=host/CN=host-z', ['subjectAltName=URI:spiffe://sandboxfleet/host/host-z']);
  split = await ApiServer.start({
    runner: plane.runner, admin: createAdminHandlers(plane), address: '127.0.0.1:0',
    security: { mode: 'mtls', mtls: { ca: Buffer.concat([pki.ca, Buffer.from('\n'), adminCa]), cert: pki.server.cert, key: pki.server.key, roleCas: roleCasFrom(pki.ca, adminCa) } },
  });
});

afterAll(async () => {
  await server?.shutdown(500);
  await split?.shutdown(500);
  await plane?.stop();
  await nats?.cleanup();
  await pki?.cleanup();
});

describe('admin service authorization (R-R5)', () => {
  it('answers an admin certificate and refuses runner, host and role-less certificates', async () => {
    const ok = await unaryCall(admin(server.port, pki.admin), 'listHosts', {});
    expect(ok.code).toBe(grpc.status.OK);
    for (const [pair, reason] of [[pki.runner, 'role_not_allowed'], [pki.host, 'role_not_allowed'], [pki.noRole, 'role_missing']] as const) {
      for (const method of ['listHosts', 'verify', 'drainHost', 'listGroups']) {
        const refused = await unaryCall(admin(server.port, pair), method, { hostId: 'host-a', idempotencyKey: 'k' });
        expect({ method, code: refused.code, reason: refused.reason }).toEqual({ method, code: grpc.status.PERMISSION_DENIED, reason });
      }
    }
  });

  it('with separate runner and admin CAs, the signing CA decides the role and must agree with the named one', async () => {
    expect(roleCasFrom(pki.ca, pki.ca)).toBeUndefined();
    // Admin CA, no role named: admin.
    expect((await unaryCall(admin(split.port, opsByCa), 'listHosts', {})).code).toBe(grpc.status.OK);
    // Runner CA + runner SAN: a runner; refused on admin, served on the runner service.
    expect((await unaryCall(admin(split.port, pki.runner), 'listHosts', {})).code).toBe(grpc.status.PERMISSION_DENIED);
    expect((await unaryCall(runnerClient(split.port, pki.runner), 'getGroupState', { groupId: 'g-missing', conversationId: '' })).code).toBe(grpc.status.NOT_FOUND);
    // An "admin" SAN signed by the runner CA disagrees with its CA: no role at all.
    const forged = await unaryCall(admin(split.port, pki.admin), 'listHosts', {});
    expect({ code: forged.code, reason: forged.reason }).toEqual({ code: grpc.status.PERMISSION_DENIED, reason: 'role_missing' });
    // Host certificates are refused as runners either way: from the runner CA and from the admin CA.
    for (const pair of [pki.host, hostSignedByAdminCa]) {
      const asRunner = await unaryCall(runnerClient(split.port, pair), 'getGroupState', { groupId: 'g-missing', conversationId: '' });
      expect(asRunner.code).toBe(grpc.status.PERMISSION_DENIED);
    }
    // The admin CA's certificate is not a runner.
    expect((await unaryCall(runnerClient(split.port, opsByCa), 'openGroup', { idempotencyKey: 'k1', conversationId: 'c', members: [] })).code).toBe(grpc.status.PERMISSION_DENIED);
  });
});

describe('admin methods (R-I1)', () => {
  it('validates requests and answers NOT_FOUND for unknown hosts and groups', async () => {
    const c = admin(server.port, pki.admin);
    expect((await unaryCall(c, 'getHost', { hostId: 'nope' })).code).toBe(grpc.status.NOT_FOUND);
    expect((await unaryCall(c, 'getGroup', { groupId: 'g-nope' })).code).toBe(grpc.status.NOT_FOUND);
    expect((await unaryCall(c, 'getHost', { hostId: 'bad host!' })).code).toBe(grpc.status.INVALID_ARGUMENT);
    expect((await unaryCall(c, 'drainHost', { hostId: 'host-a', idempotencyKey: '' })).code).toBe(grpc.status.INVALID_ARGUMENT);
    expect((await unaryCall(c, 'migrateGroup', { groupId: 'g-nope', idempotencyKey: 'k-m1', targetHostId: '' })).code).toBe(grpc.status.NOT_FOUND);
    expect((await unaryCall(c, 'destroyGroup', { groupId: 'g-nope', idempotencyKey: 'k-d1' })).code).toBe(grpc.status.NOT_FOUND);
    expect((await unaryCall(c, 'listHosts', { pageSize: 5000 })).code).toBe(grpc.status.INVALID_ARGUMENT);
    expect((await unaryCall(c, 'listHosts', { pageToken: 'garbage' })).code).toBe(grpc.status.INVALID_ARGUMENT);
    const verify = await unaryCall(c, 'verify', {});
    expect(verify.response).toMatchObject({ ok: true, hosts: [], expectedApiSha: API_SHA, expectedBridgeVersion: 4, controlPlaneReplica: 'cp-admin-test' });
  });

  it('reads the event log from a sequence with a subject filter, and follows new events', async () => {
    const base = Date.now();
    for (let i = 0; i < 3; i++) {
      await store.events.append({ id: `admin-test-${base}-${i}`, timeMs: base + i, actor: 'test', subjectKind: 'group', subjectId: `g-evt-${base}`, type: `step_${i}` });
    }
    await store.events.append({ id: `admin-test-${base}-other`, timeMs: base, actor: 'test', subjectKind: 'host', subjectId: 'host-q', type: 'other' });
    const c = admin(server.port, pki.admin);
    const collect = (req: Partial<ListEventsRequest>, max: number) =>
      new Promise<ListEventsResponse[]>((resolve, reject) => {
        const got: ListEventsResponse[] = [];
        const stream = c.listEvents(ListEventsRequest.fromPartial(req));
        stream.on('data', (m: ListEventsResponse) => {
          got.push(m);
          if (got.length >= max) {
            stream.cancel();
            resolve(got);
          }
        });
        stream.on('error', (e: grpc.ServiceError) => (e.code === grpc.status.CANCELLED ? resolve(got) : reject(e)));
        stream.on('end', () => resolve(got));
      });
    const read = await collect({ subjectKind: 'group', subjectId: `g-evt-${base}` }, 100);
    expect(read.map((r) => r.event?.type)).toEqual(['step_0', 'step_1', 'step_2']);
    const seqs = read.map((r) => r.event?.seq ?? 0);
    expect(seqs).toEqual([...seqs].sort((a, b) => a - b));
    const fromSecond = await collect({ subjectKind: 'group', subjectId: `g-evt-${base}`, fromSeq: seqs[1] }, 100);
    expect(fromSecond.map((r) => r.event?.type)).toEqual(['step_1', 'step_2']);

    // Follow: the existing events, then one appended after the stream opened.
    const followed = collect({ subjectKind: 'group', subjectId: `g-evt-${base}`, follow: true }, 4);
    await new Promise((r) => setTimeout(r, 500));
    await store.events.append({ id: `admin-test-${base}-late`, timeMs: base + 10, actor: 'test', subjectKind: 'group', subjectId: `g-evt-${base}`, type: 'late' });
    expect((await followed).map((r) => r.event?.type)).toEqual(['step_0', 'step_1', 'step_2', 'late']);
  });
});
