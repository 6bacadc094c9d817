// SEAM TEST (test/seam: not the product's backend, no real services behind the server). The runner
// gRPC API server (R-I1, R-R4, R-R5) over real mTLS loopback sockets, bound to the NAMED SEAM
// backend (seam-backend.ts: core rules over an in-memory CAS store and a simulated host), not the
// control plane. What is proven here belongs to the API layer alone: status codes and reasons of
// every error class, request validation under fuzzing, deadlines, idempotency over the wire, mTLS
// and role authorization, health and reflection, and the SDK client's retries. The same status,
// deadline, idempotency and CAS cases against the product's real backend (control plane, NATS,
// agents, dockerd) are in test/integration/api/runner-api.real-backend.test.ts.
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import fc from 'fast-check';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { protoPath as healthProtoPath } from 'grpc-health-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readErrorDetail } from '../../src/api/errors.ts';
import { groupToProto } from '../../src/api/mapping.ts';
import { ApiServer, InsecureConfigurationError } from '../../src/api/runner-server.ts';
import { CliKind, ContextState, GroupState, StopOutcome, TurnEndKind } from '../../src/gen/sandboxfleet/v1/common.ts';
import { AdminServiceClient, ListHostsRequest } from '../../src/gen/sandboxfleet/v1/admin.ts';
import { RunnerServiceClient } from '../../src/gen/sandboxfleet/v1/runner.ts';
import { RunnerClient, RunnerError } from '../../src/runner-sdk/index.ts';
import { createTestPki, type CertPair, type TestPki } from '../support/certs.ts';
import { MemoryCasStore, SeamBackend, type SeamRecord } from './seam-backend.ts';
import { successEvidence } from '../support/evidence.ts';
import { PROPERTY_RUNS } from '../support/property-runs.ts';

const ok = successEvidence;

let pki: TestPki;
let store: MemoryCasStore<SeamRecord>;
let backend: SeamBackend;
let server: ApiServer;
let runner: RunnerClient;

function sdk(pair: CertPair, ca = pki.ca, retry = { maxRetries: 4, initialDelayMs: 5, maxDelayMs: 20 }): RunnerClient {
  return new RunnerClient({ address: `127.0.0.1:${server.port}`, tls: { ca, cert: pair.cert, key: pair.key }, deadlineMs: 30_000, retry });
}

function raw(pair: CertPair | undefined): RunnerServiceClient {
  const creds = pair === undefined ? grpc.credentials.createSsl(pki.ca) : grpc.credentials.createSsl(pki.ca, pair.key, pair.cert);
  return new RunnerServiceClient(`127.0.0.1:${server.port}`, creds);
}

/** Calls a raw unary method and resolves with the status (OK or the error), never rejects. */
function callRaw<Req>(fn: (req: Req, md: grpc.Metadata, opts: Partial<grpc.CallOptions>, cb: (e: grpc.ServiceError | null, r: unknown) => void) => unknown, req: Req, deadline = Date.now() + 30_000) {
  return new Promise<{ code: grpc.status; reason: string | undefined; details: string; response: unknown }>((resolve) => {
    fn(req, new grpc.Metadata(), { deadline }, (e, r) =>
      resolve(e ? { code: e.code, reason: readErrorDetail(e.metadata)?.reason, details: e.details, response: undefined } : { code: grpc.status.OK, reason: undefined, details: '', response: r }),
    );
  });
}

async function expectRefused(p: Promise<unknown>, code: grpc.status, reason: string): Promise<RunnerError> {
  const error = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(RunnerError);
  const e = error as RunnerError;
  expect({ code: e.codeName, reason: e.reason }).toEqual({ code: grpc.status[code], reason });
  return e;
}

let conversationSeq = 0;
async function openGroup(members: { memberId: string; cli: 'claude-code' | 'codex' | 'pi' | 'opencode' | 'kilo' }[] = [{ memberId: 'claude', cli: 'claude-code' }]) {
  const res = await runner.openGroup({ conversationId: `conv-${++conversationSeq}`, members });
  return res.group?.groupId ?? '';
}

beforeAll(async () => {
  pki = await createTestPki();
  store = new MemoryCasStore<SeamRecord>();
  backend = new SeamBackend({ store });
  server = await ApiServer.start({ runner: backend, address: '127.0.0.1:0', security: { mode: 'mtls', mtls: { ca: pki.ca, cert: pki.server.cert, key: pki.server.key } } });
  runner = sdk(pki.runner);
});

afterAll(async () => {
  runner?.close();
  await server?.shutdown(1_000);
  await pki?.cleanup();
});

describe('turn protocol over gRPC (seam backend)', () => {
  it('reports NEW, then LIVE, then RESTORED after stop/start, and saves the observed locator', async () => {
    const groupId = await openGroup();
    const t1 = await runner.beginTurn({ groupId, memberId: 'claude' });
    expect(t1.contextState).toBe(ContextState.NEW);
    expect(t1.locator).toBe('');
    const c1 = await runner.completeTurn({ groupId, memberId: 'claude', turnId: t1.turnId, observedLocator: 'sess-1', evidence: ok() });
    expect(c1).toMatchObject({ sessionKept: true, savedLocator: 'sess-1', nextContextState: ContextState.LIVE });

    const t2 = await runner.beginTurn({ groupId, memberId: 'claude' });
    expect(t2).toMatchObject({ contextState: ContextState.LIVE, locator: 'sess-1' });
    await runner.completeTurn({ groupId, memberId: 'claude', turnId: t2.turnId, observedLocator: 'sess-1', evidence: ok() });

    const stopped = await runner.stopGroup({ groupId });
    expect(stopped.outcome).toBe(StopOutcome.CLEAN);
    expect(stopped.group?.state).toBe(GroupState.STOPPED);

    const t3 = await runner.beginTurn({ groupId, memberId: 'claude', locator: 'sess-1' });
    expect(t3).toMatchObject({ contextState: ContextState.RESTORED, locator: 'sess-1' });
  });

  it('refuses a locator mismatch at begin and at end with FAILED_PRECONDITION and keeps the saved locator (R-S2, R-S3)', async () => {
    const groupId = await openGroup();
    const t1 = await runner.beginTurn({ groupId, memberId: 'claude' });
    await runner.completeTurn({ groupId, memberId: 'claude', turnId: t1.turnId, observedLocator: 'saved-1', evidence: ok() });

    const atBegin = await expectRefused(runner.beginTurn({ groupId, memberId: 'claude', locator: 'other-1' }), grpc.status.FAILED_PRECONDITION, 'locator_mismatch');
    expect(atBegin.metadata.memberId).toBe('claude');

    const t2 = await runner.beginTurn({ groupId, memberId: 'claude' });
    const atEnd = await expectRefused(
      runner.completeTurn({ groupId, memberId: 'claude', turnId: t2.turnId, observedLocator: 'other-2', evidence: ok() }),
      grpc.status.FAILED_PRECONDITION,
      'locator_mismatch',
    );
    expect(atEnd.metadata.phase).toBe('end');
    const state = await runner.getGroupState({ groupId });
    expect(state.group?.members[0]?.savedLocator).toBe('saved-1');
  });

  it('makes an unconfirmed turn (disconnect) LOST on the next begin (R-S5)', async () => {
    const groupId = await openGroup();
    const t1 = await runner.beginTurn({ groupId, memberId: 'claude' });
    await runner.completeTurn({ groupId, memberId: 'claude', turnId: t1.turnId, observedLocator: 's', evidence: ok() });
    const t2 = await runner.beginTurn({ groupId, memberId: 'claude' });
    // A disconnect claiming "ended" is still not a native end: the mapping forces native_turn_ended off.
    const c2 = await runner.completeTurn({ groupId, memberId: 'claude', turnId: t2.turnId, observedLocator: 's', evidence: ok({ kind: TurnEndKind.DISCONNECT }) });
    expect(c2).toMatchObject({ sessionKept: false, nextContextState: ContextState.LOST, reason: 'unconfirmed' });
    const lost = await expectRefused(runner.beginTurn({ groupId, memberId: 'claude' }), grpc.status.FAILED_PRECONDITION, 'context_lost');
    expect(lost.metadata.lostReason).toBe('turn_unconfirmed');
  });
});

describe('status codes and reasons per error class (R-I1)', () => {
  it('INVALID_ARGUMENT: missing idempotency key, bad ids, bad members, reused key', async () => {
    const client = raw(pki.runner);
    const begin = client.beginTurn.bind(client) as never;
    const open = client.openGroup.bind(client) as never;
    expect(await callRaw(begin, { idempotencyKey: '', groupId: 'g', memberId: 'm' })).toMatchObject({ code: grpc.status.INVALID_ARGUMENT, reason: 'empty_value' });
    expect(await callRaw(begin, { idempotencyKey: 'k', groupId: '../etc', memberId: 'm' })).toMatchObject({ code: grpc.status.INVALID_ARGUMENT, reason: 'invalid_characters' });
    expect(await callRaw(open, { idempotencyKey: 'k', conversationId: 'c', members: [] })).toMatchObject({ code: grpc.status.INVALID_ARGUMENT, reason: 'empty_value' });
    const nine = Array.from({ length: 9 }, (_, i) => ({ memberId: `m${i}`, kind: CliKind.PI }));
    expect(await callRaw(open, { idempotencyKey: 'k', conversationId: 'c', members: nine })).toMatchObject({ code: grpc.status.INVALID_ARGUMENT, reason: 'too_many_entries' });
    const dup = [{ memberId: 'a', kind: CliKind.PI }, { memberId: 'a', kind: CliKind.CODEX }];
    expect(await callRaw(open, { idempotencyKey: 'k', conversationId: 'c', members: dup })).toMatchObject({ code: grpc.status.INVALID_ARGUMENT, reason: 'malformed' });
    expect(await callRaw(open, { idempotencyKey: 'k', conversationId: 'c', members: [{ memberId: 'a', kind: 42 }] })).toMatchObject({ code: grpc.status.INVALID_ARGUMENT, reason: 'out_of_range' });
    client.close();

    const groupId = await openGroup();
    await runner.beginTurn({ groupId, memberId: 'claude' }, { idempotencyKey: 'reused-key-1' });
    await expectRefused(runner.beginTurn({ groupId, memberId: 'claude', locator: 'x' }, { idempotencyKey: 'reused-key-1' }), grpc.status.INVALID_ARGUMENT, 'idempotency_key_reused');
  });

  it('FAILED_PRECONDITION: turn in flight (R-S8) and an invalid lifecycle transition', async () => {
    const groupId = await openGroup();
    await runner.beginTurn({ groupId, memberId: 'claude' });
    await expectRefused(runner.beginTurn({ groupId, memberId: 'claude' }), grpc.status.FAILED_PRECONDITION, 'turn_in_flight');
    const stopped = await runner.stopGroup({ groupId });
    expect(stopped.outcome).toBe(StopOutcome.UNCLEAN);
    await expectRefused(runner.stopGroup({ groupId }), grpc.status.FAILED_PRECONDITION, 'invalid_transition');
  });

  it('NOT_FOUND: group, member, turn', async () => {
    const groupId = await openGroup();
    await expectRefused(runner.beginTurn({ groupId: 'no-such-group', memberId: 'claude' }), grpc.status.NOT_FOUND, 'group_not_found');
    await expectRefused(runner.beginTurn({ groupId, memberId: 'nobody' }), grpc.status.NOT_FOUND, 'member_not_found');
    await expectRefused(runner.completeTurn({ groupId, memberId: 'claude', turnId: 't-unknown', observedLocator: 's', evidence: ok() }), grpc.status.NOT_FOUND, 'turn_not_found');
    await expectRefused(runner.getGroupState({ conversationId: 'never-opened' }), grpc.status.NOT_FOUND, 'group_not_found');
  });

  it('UNAVAILABLE: store down and a missing container; RESOURCE_EXHAUSTED: no capacity', async () => {
    const groupId = await openGroup();
    backend.host.removeContainer(groupId, 'claude');
    await expectRefused(runner.beginTurn({ groupId, memberId: 'claude' }), grpc.status.UNAVAILABLE, 'container_missing');

    const noRetry = sdk(pki.runner, pki.ca, { maxRetries: 0, initialDelayMs: 1, maxDelayMs: 1 });
    store.down = true;
    try {
      await expectRefused(noRetry.getGroupState({ groupId }), grpc.status.UNAVAILABLE, 'store_unavailable');
    } finally {
      store.down = false;
      noRetry.close();
    }

    const before = backend.host.maxGroups;
    backend.host.maxGroups = 0;
    try {
      await expectRefused(runner.openGroup({ conversationId: 'full-host', members: [{ memberId: 'pi', cli: 'pi' }] }), grpc.status.RESOURCE_EXHAUSTED, 'no_capacity');
    } finally {
      backend.host.maxGroups = before;
    }
  });

  it('ABORTED: a CAS conflict that escapes the backend; the SDK retries with the same key and the turn begins once', async () => {
    const groupId = await openGroup();
    backend.casRetries = 0;
    const noRetry = sdk(pki.runner, pki.ca, { maxRetries: 0, initialDelayMs: 1, maxDelayMs: 1 });
    try {
      store.interfereNextUpdates = 1;
      await expectRefused(noRetry.beginTurn({ groupId, memberId: 'claude' }), grpc.status.ABORTED, 'cas_conflict');

      const client = sdk(pki.runner);
      store.interfereNextUpdates = 2;
      const t = await client.beginTurn({ groupId, memberId: 'claude' });
      expect(client.retries).toBe(2);
      expect(t.contextState).toBe(ContextState.NEW);
      const state = await client.getGroupState({ groupId });
      expect(state.group?.members[0]?.turnInFlightId).toBe(t.turnId);
      client.close();
    } finally {
      backend.casRetries = 8;
      store.interfereNextUpdates = 0;
      noRetry.close();
    }
  });

  it('INTERNAL: an unexpected failure answers a generic message without internals', async () => {
    const groupId = await openGroup();
    backend.host.failNextObservation = new Error('secret: /var/lib/docker at /src/host.ts:42');
    const e = await expectRefused(runner.beginTurn({ groupId, memberId: 'claude' }), grpc.status.INTERNAL, 'internal');
    expect(e.message).toBe('internal error');
    expect(JSON.stringify(e)).not.toContain('secret');
  });
});

describe('fuzzed requests (R-R4)', () => {
  const text = fc.oneof(fc.string({ maxLength: 40 }), fc.string({ minLength: 300, maxLength: 2_000 }), fc.constantFrom('', '../x', 'a b', 'a/b', '\u0000', 'ok-id'));
  // Invalid for both CliKind (1..5) and TurnEndKind (1..5, 10..14): 0, 6..9, 15+ and negatives.
  const badEnum = fc.oneof(fc.constant(0), fc.integer({ min: 6, max: 9 }), fc.integer({ min: 15, max: 1_000 }), fc.integer({ min: -1_000, max: -1 }));

  it('answers INVALID_ARGUMENT to random invalid requests and stays SERVING', async () => {
    const client = raw(pki.runner);
    const open = client.openGroup.bind(client) as never;
    const begin = client.beginTurn.bind(client) as never;
    const complete = client.completeTurn.bind(client) as never;
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          // OpenGroup with at least one guaranteed-invalid member kind.
          fc.record({ conversationId: text, members: fc.array(fc.record({ memberId: text, kind: badEnum }), { minLength: 1, maxLength: 12 }) }).map((r) => ({ m: open, req: { idempotencyKey: 'k', ...r } })),
          // BeginTurn with an idempotency key that is empty, oversized or has spaces.
          fc.record({ idempotencyKey: fc.constantFrom('', 'x'.repeat(129), 'has space'), groupId: text, memberId: text, locator: fc.option(text, { nil: undefined }) }).map((req) => ({ m: begin, req })),
          // CompleteTurn with an unknown evidence kind or none at all.
          fc.record({ groupId: fc.constant('g-1'), memberId: fc.constant('m'), turnId: text, kind: fc.option(badEnum, { nil: undefined }) }).map(({ kind, ...r }) => ({
            m: complete,
            req: { idempotencyKey: 'k', ...r, ...(kind === undefined ? {} : { evidence: ok({ kind: kind as TurnEndKind }) }) },
          })),
        ),
        async ({ m, req }) => {
          const res = await callRaw(m, req);
          expect(res.code).toBe(grpc.status.INVALID_ARGUMENT);
          expect(res.reason).toBeTypeOf('string');
        },
      ),
      { numRuns: PROPERTY_RUNS },
    );
    // Oversized: bigger than the 256 KiB receive limit.
    const huge = await callRaw(begin, { idempotencyKey: 'k', groupId: 'g'.repeat(300 * 1024), memberId: 'm' });
    expect(huge.code).toBe(grpc.status.RESOURCE_EXHAUSTED);
    client.close();
    expect(await healthCheck(pki.runner)).toBe('SERVING');
    const groupId = await openGroup();
    expect((await runner.beginTurn({ groupId, memberId: 'claude' })).contextState).toBe(ContextState.NEW);
  });
});

describe('deadlines (R-I1)', () => {
  it('returns DEADLINE_EXCEEDED when the backend is slower than the deadline', async () => {
    const groupId = await openGroup();
    backend.latencyMs = 400;
    try {
      const started = Date.now();
      await expectRefused(runner.beginTurn({ groupId, memberId: 'claude' }, { deadlineMs: 100 }), grpc.status.DEADLINE_EXCEEDED, 'deadline_exceeded');
      expect(Date.now() - started).toBeLessThan(350);
    } finally {
      backend.latencyMs = 0;
    }
  });

  it('never starts work for a call whose deadline has already passed', async () => {
    const client = raw(pki.runner);
    const before = backend.calls.beginTurn;
    const res = await callRaw(client.beginTurn.bind(client) as never, { idempotencyKey: 'k-expired', groupId: 'g', memberId: 'm' }, Date.now() - 1);
    expect(res.code).toBe(grpc.status.DEADLINE_EXCEEDED);
    expect(backend.calls.beginTurn).toBe(before);
    client.close();
  });
});

describe('idempotency over the wire (R-I1)', () => {
  it('answers a repeat with the same key with the first answer', async () => {
    const groupId = await openGroup();
    const first = await runner.beginTurn({ groupId, memberId: 'claude' }, { idempotencyKey: 'begin-once' });
    const again = await runner.beginTurn({ groupId, memberId: 'claude' }, { idempotencyKey: 'begin-once' });
    expect(again).toEqual(first);
    const done = await runner.completeTurn({ groupId, memberId: 'claude', turnId: first.turnId, observedLocator: 's-1', evidence: ok() }, { idempotencyKey: 'complete-once' });
    const doneAgain = await runner.completeTurn({ groupId, memberId: 'claude', turnId: first.turnId, observedLocator: 's-1', evidence: ok() }, { idempotencyKey: 'complete-once' });
    expect(doneAgain).toEqual(done);
    const state = await runner.getGroupState({ groupId });
    expect(Number(state.group?.members[0]?.completedTurns)).toBe(1);
  });

  it('converges concurrent duplicates on one answer; concurrent different keys get one turn (R-S8)', async () => {
    const opened = await Promise.all(Array.from({ length: 8 }, () => runner.openGroup({ conversationId: 'conv-dup', members: [{ memberId: 'codex', cli: 'codex' }] }, { idempotencyKey: 'open-dup' })));
    expect(new Set(opened.map((o) => JSON.stringify(o))).size).toBe(1);
    const groupId = opened[0]?.group?.groupId ?? '';

    const begins = await Promise.all(Array.from({ length: 8 }, () => runner.beginTurn({ groupId, memberId: 'codex' }, { idempotencyKey: 'begin-dup' })));
    expect(new Set(begins.map((b) => b.turnId)).size).toBe(1);

    const other = await openGroup([{ memberId: 'pi', cli: 'pi' }]);
    const races = await Promise.allSettled(Array.from({ length: 8 }, () => runner.beginTurn({ groupId: other, memberId: 'pi' })));
    const won = races.filter((r) => r.status === 'fulfilled');
    expect(won).toHaveLength(1);
    for (const r of races) if (r.status === 'rejected') expect((r.reason as RunnerError).reason).toBe('turn_in_flight');
  });
});

describe('mTLS and roles (R-R5)', () => {
  it('refuses a client without a certificate and one from the wrong CA before any work', async () => {
    const before = backend.calls.getGroupState;
    const noCert = raw(undefined);
    const res = await callRaw(noCert.getGroupState.bind(noCert) as never, { groupId: 'g', conversationId: '' });
    expect(res.code).toBe(grpc.status.UNAVAILABLE);
    noCert.close();

    const rogue = sdk(pki.rogueRunner, pki.ca, { maxRetries: 0, initialDelayMs: 1, maxDelayMs: 1 });
    const e = await rogue.getGroupState({ groupId: 'g' }).catch((err: unknown) => err as RunnerError);
    expect(e).toBeInstanceOf(RunnerError);
    expect((e as RunnerError).codeName).toBe('UNAVAILABLE');
    rogue.close();
    expect(backend.calls.getGroupState).toBe(before);
  });

  it('refuses a host certificate used as a runner, and a certificate without a role, with PERMISSION_DENIED', async () => {
    const before = { ...backend.calls };
    const host = sdk(pki.host);
    await expectRefused(host.beginTurn({ groupId: 'g', memberId: 'm' }), grpc.status.PERMISSION_DENIED, 'role_not_allowed');
    await expectRefused(host.getGroupState({ groupId: 'g' }), grpc.status.PERMISSION_DENIED, 'role_not_allowed');
    host.close();
    const nobody = sdk(pki.noRole);
    await expectRefused(nobody.openGroup({ conversationId: 'c', members: [{ memberId: 'pi', cli: 'pi' }] }), grpc.status.PERMISSION_DENIED, 'role_missing');
    nobody.close();
    expect(backend.calls).toEqual(before);
  });

  it('lets an admin read group state but not drive turns', async () => {
    const groupId = await openGroup();
    const admin = sdk(pki.admin);
    expect((await admin.getGroupState({ groupId })).group?.groupId).toBe(groupId);
    await expectRefused(admin.beginTurn({ groupId, memberId: 'claude' }), grpc.status.PERMISSION_DENIED, 'role_not_allowed');
    admin.close();
  });

  it('refuses to start without mTLS on a non-loopback address', async () => {
    await expect(ApiServer.start({ runner: backend, address: '0.0.0.0:0', security: { mode: 'insecure-local-dev' } })).rejects.toBeInstanceOf(InsecureConfigurationError);
    const dev = await ApiServer.start({ runner: backend, address: '127.0.0.1:0', security: { mode: 'insecure-local-dev' } });
    const client = new RunnerClient({ address: `127.0.0.1:${dev.port}`, insecureLocalDev: true });
    const res = await client.openGroup({ conversationId: 'dev-conv', members: [{ memberId: 'kilo', cli: 'kilo' }] });
    expect(res.created).toBe(true);
    client.close();
    await dev.shutdown(500);
  });
});

// --- health and reflection, through their standard protos -----------------------------------------

function loadService(file: string, includeDirs: string[]): grpc.GrpcObject {
  return grpc.loadPackageDefinition(protoLoader.loadSync(file, { includeDirs, keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true }));
}

type Ctor = new (address: string, creds: grpc.ChannelCredentials) => grpc.Client & Record<string, (...args: unknown[]) => unknown>;

async function healthCheck(pair: CertPair, service = ''): Promise<string> {
  const pkg = loadService(healthProtoPath, []) as unknown as { grpc: { health: { v1: { Health: Ctor } } } };
  const client = new pkg.grpc.health.v1.Health(`127.0.0.1:${server.port}`, grpc.credentials.createSsl(pki.ca, pair.key, pair.cert));
  try {
    return await new Promise<string>((resolve, reject) =>
      (client.Check as (req: object, cb: (e: Error | null, r: { status: string }) => void) => void)({ service }, (e, r) => (e ? reject(e) : resolve(r.status))),
    );
  } finally {
    client.close();
  }
}

describe('standard services', () => {
  it('answers grpc.health.v1 Check with SERVING for the server and the runner service', async () => {
    expect(await healthCheck(pki.runner)).toBe('SERVING');
    expect(await healthCheck(pki.runner, 'sandboxfleet.v1.RunnerService')).toBe('SERVING');
  });

  it('lists the services through server reflection', async () => {
    const reflectionDir = join(dirname(createRequire(import.meta.url).resolve('@grpc/reflection/package.json')), 'build', 'proto');
    const pkg = loadService('grpc/reflection/v1/reflection.proto', [reflectionDir]) as unknown as { grpc: { reflection: { v1: { ServerReflection: Ctor } } } };
    const client = new pkg.grpc.reflection.v1.ServerReflection(`127.0.0.1:${server.port}`, grpc.credentials.createSsl(pki.ca, pki.runner.key, pki.runner.cert));
    const names = await new Promise<string[]>((resolve, reject) => {
      const call = (client.ServerReflectionInfo as () => grpc.ClientDuplexStream<object, { list_services_response?: { service: { name: string }[] } }>)();
      call.on('data', (r) => {
        resolve((r.list_services_response?.service ?? []).map((s: { name: string }) => s.name));
        call.end();
      });
      call.on('error', reject);
      call.write({ list_services: '' });
    });
    client.close();
    expect(names).toEqual(expect.arrayContaining(['sandboxfleet.v1.RunnerService', 'grpc.health.v1.Health']));
  });
});

describe('admin service wiring (R-R5)', () => {
  it('serves admin handlers to admin certificates only, and names unserved methods', async () => {
    const adminServer = await ApiServer.start({
      runner: backend,
      admin: { getGroup: async (request) => ({ group: groupToProto(await backend.getGroupState({ groupId: request.groupId })) }) },
      address: '127.0.0.1:0',
      security: { mode: 'mtls', mtls: { ca: pki.ca, cert: pki.server.cert, key: pki.server.key } },
    });
    const groupId = await openGroup();
    const call = (pair: CertPair, method: 'getGroup' | 'listHosts', req: object) => {
      const client = new AdminServiceClient(`127.0.0.1:${adminServer.port}`, grpc.credentials.createSsl(pki.ca, pair.key, pair.cert));
      return callRaw(client[method].bind(client) as never, req).finally(() => client.close());
    };
    expect((await call(pki.admin, 'getGroup', { groupId })).code).toBe(grpc.status.OK);
    expect(await call(pki.runner, 'getGroup', { groupId })).toMatchObject({ code: grpc.status.PERMISSION_DENIED, reason: 'role_not_allowed' });
    expect(await call(pki.host, 'listHosts', ListHostsRequest.create())).toMatchObject({ code: grpc.status.PERMISSION_DENIED, reason: 'role_not_allowed' });
    expect(await call(pki.admin, 'listHosts', ListHostsRequest.create())).toMatchObject({ code: grpc.status.UNIMPLEMENTED, reason: 'method_not_served' });
    await adminServer.shutdown(500);
  });
});
