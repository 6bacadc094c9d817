// Server reflection as standard clients use it (issue 13 item 5): the real `grpcurl` (built by
// scripts/bootstrap, pinned in scripts/versions.env) drives the real API server over mTLS on
// loopback, bound to a real control plane with one real host (nats-server, agent, dockerd:
// fleet-harness.ts), knowing only the address and its certificates: it lists the services,
// describes every one, checks health and calls the runner and the admin service, all through
// reflection (no .proto files). Then a plain grpc-js stream checks
// what grpcurl cannot show: the bytes served are exactly what `buf build` compiles from proto/,
// imports are sent once per stream, v1alpha answers like v1, and malformed or oversized requests
// are refused.
import * as grpc from '@grpc/grpc-js';
import { create, createFileRegistry, fromBinary, toBinary, toJson, type DescMessage, type FileRegistry } from '@bufbuild/protobuf';
import { FileDescriptorProtoSchema, FileDescriptorSetSchema } from '@bufbuild/protobuf/wkt';
import { execFile } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAdminHandlers } from '../../../src/api/admin-handlers.ts';
import { splitDescriptorSet } from '../../../src/api/reflection-descriptors.ts';
import { ApiServer } from '../../../src/api/runner-server.ts';
import { toolsDir } from '../../../src/config/tools.ts';
import { createTestPki, type TestPki } from '../../support/certs.ts';
import { startFleet, type Fleet } from '../control-plane/fleet-harness.ts';

const run = promisify(execFile);
const root = new URL('../../../', import.meta.url).pathname;

const SERVICES = [
  'grpc.health.v1.Health',
  'grpc.reflection.v1.ServerReflection',
  'grpc.reflection.v1alpha.ServerReflection',
  'sandboxfleet.v1.AdminService',
  'sandboxfleet.v1.RunnerService',
];

const HOST = 'host-a';

let pki: TestPki;
let fleet: Fleet;
let server: ApiServer;
let grpcurlPath: string;
/** What `buf build proto` compiles right now, independent of the checked-in src/gen. */
let bufCompiled: Map<string, Buffer>;
/** Decodes reflection messages with @bufbuild/protobuf from the buf-compiled reflection.proto. */
let registry: FileRegistry;

function grpcurlBinary(): string {
  const candidates = [join(toolsDir(), 'bin', 'grpcurl'), ...(process.env.PATH ?? '').split(delimiter).filter(Boolean).map((d) => join(d, 'grpcurl'))];
  for (const candidate of candidates) {
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // next
    }
  }
  throw new Error('grpcurl not found: run scripts/bootstrap');
}

/**
 * Runs `grpcurl [tls] [-d data] ADDRESS ...command` as `who` (its certificate from the test PKI);
 * resolves with the exit code and output, never rejects.
 */
async function grpcurl(who: 'runner-1' | 'admin-1', command: string[], data?: object): Promise<{ code: number; stdout: string; stderr: string }> {
  const tls = ['-cacert', join(pki.dir, 'fleet-ca.crt'), '-cert', join(pki.dir, `${who}.crt`), '-key', join(pki.dir, `${who}.key`)];
  const body = data === undefined ? [] : ['-d', JSON.stringify(data)];
  try {
    const { stdout, stderr } = await run(grpcurlPath, [...tls, '-max-time', '20', ...body, `127.0.0.1:${server.port}`, ...command], { timeout: 30_000 });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code?: number; stdout?: string; stderr?: string };
    return { code: typeof e.code === 'number' ? e.code : -1, stdout: e.stdout ?? '', stderr: e.stderr ?? '' };
  }
}

beforeAll(async () => {
  grpcurlPath = grpcurlBinary();
  [fleet, pki] = await Promise.all([startFleet(1), createTestPki()]);
  const plane = await fleet.startPlane({ replicaId: 'cp-reflection' });
  server = await ApiServer.start({
    runner: plane.runner,
    admin: createAdminHandlers(plane),
    address: '127.0.0.1:0',
    security: { mode: 'mtls', mtls: { ca: pki.ca, cert: pki.server.cert, key: pki.server.key } },
  });
  await fleet.startAgentOn(HOST, 0);
  await fleet.waitFor(`${HOST} READY`, async () => ((await fleet.host(HOST)).lifecycle.state === 'READY' ? true : undefined));

  const out = await mkdtemp(join(tmpdir(), 'sf-buf-'));
  try {
    await run(join(root, 'node_modules/.bin/buf'), ['build', 'proto', '--as-file-descriptor-set', '-o', join(out, 'proto.binpb')], { cwd: root });
    const files = splitDescriptorSet(await readFile(join(out, 'proto.binpb')));
    bufCompiled = new Map(files.map((bytes) => [fromBinary(FileDescriptorProtoSchema, bytes).name, Buffer.from(bytes)]));
  } finally {
    await rm(out, { recursive: true, force: true });
  }
  registry = createFileRegistry(fromBinary(FileDescriptorSetSchema, await readFile(join(root, 'src/gen/descriptors.binpb'))));
});

afterAll(async () => {
  await server?.shutdown(500);
  await fleet?.cleanup();
  await pki?.cleanup();
});

describe('grpcurl over server reflection', () => {
  it('lists exactly the served services', async () => {
    const listed = await grpcurl('runner-1', ['list']);
    expect(listed.stderr).toBe('');
    expect(listed.stdout.trim().split('\n')).toEqual(SERVICES);
  });

  it('describes every listed service, and the map field that broke proto-loader descriptors', async () => {
    for (const service of SERVICES) {
      const described = await grpcurl('runner-1', ['describe', service]);
      expect({ service, code: described.code, stderr: described.stderr }).toEqual({ service, code: 0, stderr: '' });
      expect(described.stdout).toContain(`${service} is a service:`);
    }
    const runner = await grpcurl('runner-1', ['describe', 'sandboxfleet.v1.RunnerService']);
    for (const method of ['OpenGroup', 'BeginTurn', 'CompleteTurn', 'StopGroup', 'GetGroupState']) expect(runner.stdout).toContain(`rpc ${method} (`);
    const detail = await grpcurl('runner-1', ['describe', 'sandboxfleet.v1.ErrorDetail']);
    expect(detail.code).toBe(0);
    expect(detail.stdout).toMatch(/map<string, string> metadata = 2;/);
    // proto3 `optional` survives (protobufjs-converted descriptors drop it).
    const begin = await grpcurl('runner-1', ['describe', 'sandboxfleet.v1.BeginTurnRequest']);
    expect(begin.stdout).toMatch(/optional string locator = 4;/);
  });

  it('checks health through the described grpc.health.v1 service', async () => {
    const all = await grpcurl('runner-1', ['grpc.health.v1.Health/Check']);
    expect({ code: all.code, status: JSON.parse(all.stdout).status }).toEqual({ code: 0, status: 'SERVING' });
    const runner = await grpcurl('admin-1', ['grpc.health.v1.Health/Check'], { service: 'sandboxfleet.v1.RunnerService' });
    expect({ code: runner.code, status: JSON.parse(runner.stdout).status }).toEqual({ code: 0, status: 'SERVING' });
  });

  it('calls the runner service: OpenGroup and GetGroupState answer, a refusal decodes its ErrorDetail', async () => {
    const opened = await grpcurl('runner-1', ['sandboxfleet.v1.RunnerService/OpenGroup'], {
      idempotency_key: 'grpcurl-open-1',
      conversation_id: 'conv-grpcurl',
      members: [{ member_id: 'claude', kind: 'CLI_KIND_CLAUDE_CODE' }],
    });
    expect({ code: opened.code, stderr: opened.stderr }).toEqual({ code: 0, stderr: '' });
    const { group, created } = JSON.parse(opened.stdout) as { group: { groupId: string; conversationId: string }; created: boolean };
    expect({ conversationId: group.conversationId, created }).toEqual({ conversationId: 'conv-grpcurl', created: true });
    const state = await grpcurl('runner-1', ['sandboxfleet.v1.RunnerService/GetGroupState'], { group_id: group.groupId });
    expect({ code: state.code, groupId: (JSON.parse(state.stdout) as { group: { groupId: string } }).group.groupId }).toEqual({ code: 0, groupId: group.groupId });

    const missing = await grpcurl('runner-1', ['sandboxfleet.v1.RunnerService/GetGroupState'], { group_id: 'g-missing' });
    expect(missing.stderr).toContain('Code: NotFound');
    // grpcurl resolves the status detail's Any type (the message with the map field) through reflection.
    expect(missing.stderr).toContain('"@type": "type.googleapis.com/sandboxfleet.v1.ErrorDetail"');
    expect(missing.stderr).toMatch(/"reason": "\w+"/);
  });

  it('calls the admin service with an admin certificate', async () => {
    const hosts = await grpcurl('admin-1', ['sandboxfleet.v1.AdminService/ListHosts'], { page_size: 10 });
    expect({ code: hosts.code, stderr: hosts.stderr }).toEqual({ code: 0, stderr: '' });
    const listed = JSON.parse(hosts.stdout) as { hosts: { hostId: string; state: string }[] };
    expect(listed.hosts.map((h) => [h.hostId, h.state])).toEqual([[HOST, 'HOST_STATE_READY']]);
    // The runner certificate is refused by the admin service, and grpcurl shows why.
    const refused = await grpcurl('runner-1', ['sandboxfleet.v1.AdminService/ListHosts']);
    expect(refused.stderr).toContain('Code: PermissionDenied');
    expect(refused.stderr).toContain('"reason": "role_not_allowed"');
  });
});

// ---------------------------------------------------------------------------------------------
// The reflection stream itself, over a plain grpc-js bidi call with an independent decoder.

type Json = Record<string, unknown>;

function message(name: string): DescMessage {
  const desc = registry.getMessage(name);
  if (desc === undefined) throw new Error(`${name} missing from src/gen/descriptors.binpb`);
  return desc;
}

/**
 * Sends each request (raw bytes) on one reflection stream; resolves with the decoded answers and the
 * status. With `readAfterMs` the client reads nothing for that long (a slow reader).
 */
async function reflect(version: 'v1' | 'v1alpha', requests: (Json | Buffer)[], readAfterMs = 0): Promise<{ responses: Json[]; code: grpc.status; details: string }> {
  const client = new grpc.Client(`127.0.0.1:${server.port}`, grpc.credentials.createSsl(pki.ca, pki.runner.key, pki.runner.cert));
  const req = message(`grpc.reflection.${version}.ServerReflectionRequest`);
  const res = message(`grpc.reflection.${version}.ServerReflectionResponse`);
  try {
    return await new Promise((resolve) => {
      const responses: Json[] = [];
      const call = client.makeBidiStreamRequest(
        `/grpc.reflection.${version}.ServerReflection/ServerReflectionInfo`,
        (b: Buffer) => b,
        (b: Buffer) => b,
        new grpc.Metadata(),
        { deadline: Date.now() + 20_000 },
      );
      call.on('data', (bytes: Buffer) => responses.push(toJson(res, fromBinary(res, bytes)) as Json));
      call.on('error', () => undefined);
      call.on('status', (s: grpc.StatusObject) => resolve({ responses, code: s.code, details: s.details }));
      if (readAfterMs > 0) {
        call.pause();
        setTimeout(() => call.resume(), readAfterMs);
      }
      for (const r of requests) call.write(Buffer.isBuffer(r) ? r : Buffer.from(toBinary(req, create(req, r as never))));
      call.end();
    });
  } finally {
    client.close();
  }
}

const fileNames = (r: Json) =>
  ((r.fileDescriptorResponse as { fileDescriptorProto: string[] }).fileDescriptorProto).map((b64) => fromBinary(FileDescriptorProtoSchema, Buffer.from(b64, 'base64')).name);

describe('reflection stream (grpc-js client)', () => {
  it('serves the exact bytes buf compiles, each import once per stream', async () => {
    const { responses, code } = await reflect('v1', [
      { messageRequest: { case: 'fileContainingSymbol', value: 'sandboxfleet.v1.ErrorDetail' } },
      { messageRequest: { case: 'fileContainingSymbol', value: 'sandboxfleet.v1.AdminService' } },
      { messageRequest: { case: 'fileByFilename', value: 'sandboxfleet/v1/common.proto' } },
    ]);
    expect(code).toBe(grpc.status.OK);
    expect(responses.map(fileNames)).toEqual([
      ['sandboxfleet/v1/common.proto'],
      ['sandboxfleet/v1/admin.proto', 'sandboxfleet/v1/agent.proto', 'sandboxfleet/v1/exec.proto'],
      ['sandboxfleet/v1/common.proto'],
    ]);
    const served = responses.flatMap((r) => (r.fileDescriptorResponse as { fileDescriptorProto: string[] }).fileDescriptorProto.map((b64) => Buffer.from(b64, 'base64')));
    for (const bytes of served) {
      const name = fromBinary(FileDescriptorProtoSchema, bytes).name;
      expect({ name, equal: bufCompiled.get(name)?.equals(bytes) }).toEqual({ name, equal: true });
    }
    expect(responses[0]?.originalRequest).toEqual({ fileContainingSymbol: 'sandboxfleet.v1.ErrorDetail' });
  });

  it('v1alpha answers like v1; unknown names are NOT_FOUND in-band and the stream goes on', async () => {
    const asked = [
      { messageRequest: { case: 'listServices', value: '' } },
      { messageRequest: { case: 'fileContainingSymbol', value: 'sandboxfleet.v1.Nope' } },
      { messageRequest: { case: 'fileByFilename', value: 'nope.proto' } },
      { messageRequest: { case: 'fileContainingExtension', value: { containingType: 'sandboxfleet.v1.ErrorDetail', extensionNumber: 100 } } },
      { messageRequest: { case: 'allExtensionNumbersOfType', value: 'sandboxfleet.v1.ErrorDetail' } },
      { messageRequest: { case: 'allExtensionNumbersOfType', value: 'sandboxfleet.v1.Nope' } },
      { messageRequest: { case: 'fileContainingSymbol', value: 'sandboxfleet.v1.RunnerService.OpenGroup' } },
    ];
    const v1 = await reflect('v1', asked);
    const alpha = await reflect('v1alpha', asked);
    expect(alpha).toEqual(v1);
    expect(v1.code).toBe(grpc.status.OK);
    const [list, symbol, file, extension, numbers, unknownType, method] = v1.responses;
    expect((list?.listServicesResponse as { service: { name: string }[] }).service.map((s) => s.name)).toEqual(SERVICES);
    for (const r of [symbol, file, extension, unknownType]) expect((r?.errorResponse as { errorCode: number }).errorCode).toBe(grpc.status.NOT_FOUND);
    expect(numbers?.allExtensionNumbersResponse).toEqual({ baseTypeName: 'sandboxfleet.v1.ErrorDetail' });
    expect(fileNames(method!)).toEqual(['sandboxfleet/v1/runner.proto', 'sandboxfleet/v1/common.proto', 'sandboxfleet/v1/exec.proto']);
  });

  it('answers a long burst to a slow reader on one stream, in order (the server stops reading while its writes wait)', async () => {
    const asked = Array.from({ length: 400 }, (_, i) =>
      i % 2 === 0 ? { messageRequest: { case: 'fileByFilename', value: 'sandboxfleet/v1/admin.proto' } } : { messageRequest: { case: 'fileContainingSymbol', value: `sandboxfleet.v1.Nope${i}` } },
    );
    const { responses, code } = await reflect('v1', asked, 1_000);
    expect({ code, answered: responses.length }).toEqual({ code: grpc.status.OK, answered: asked.length });
    responses.forEach((r, i) =>
      expect(r.originalRequest).toEqual(i % 2 === 0 ? { fileByFilename: 'sandboxfleet/v1/admin.proto' } : { fileContainingSymbol: `sandboxfleet.v1.Nope${i}` }),
    );
  });

  it('ends the stream with INVALID_ARGUMENT on a malformed, empty or oversized request', async () => {
    const valid = { messageRequest: { case: 'listServices', value: '' } };
    for (const bad of [
      Buffer.from([0x0a, 0xff]), // truncated length-delimited field
      Buffer.alloc(0), // asks nothing
      { messageRequest: { case: 'fileContainingSymbol', value: `a.${'b'.repeat(2000)}` } },
      { messageRequest: { case: 'fileByFilename', value: 'x\n.proto' } },
    ]) {
      const { responses, code } = await reflect('v1', [valid, bad, valid]);
      expect({ code, answered: responses.length }).toEqual({ code: grpc.status.INVALID_ARGUMENT, answered: 1 });
    }
  });
});
