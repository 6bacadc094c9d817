// The generated protocol code (src/gen, from proto/sandboxfleet/v1): messages survive binary and
// JSON round trips with every field kind we rely on (int64 as number, optional scalars, oneofs,
// maps, enums), and the grpc-js service definitions have the wire paths of R-I1 and work over a
// real loopback grpc-js server, including the ErrorDetail status-details convention.
import * as grpc from '@grpc/grpc-js';
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { API_SHA } from '../../src/gen/api-sha.ts';
import { AdminServiceClient, AdminServiceService, type AdminServiceServer, ListEventsResponse } from '../../src/gen/sandboxfleet/v1/admin.ts';
import {
  AgentCommand,
  AgentCommandResult,
  CheckpointManifest,
  CommandOutcome,
  ContainerState,
  Heartbeat,
} from '../../src/gen/sandboxfleet/v1/agent.ts';
import { CliKind, ContextState, ErrorDetail, Event, RpcStatus, TurnEndKind } from '../../src/gen/sandboxfleet/v1/common.ts';
import {
  BeginTurnRequest,
  BeginTurnResponse,
  CompleteTurnRequest,
  RunnerServiceClient,
  RunnerServiceService,
  type RunnerServiceServer,
} from '../../src/gen/sandboxfleet/v1/runner.ts';

const sha = (c: string): string => `sha256:${c.repeat(64)}`;

function sampleManifest(): CheckpointManifest {
  return CheckpointManifest.fromPartial({
    schemaVersion: 1,
    checkpointId: 'ckpt-01',
    groupId: 'grp-7',
    placementGeneration: 3,
    sourceHostId: 'host-a',
    sourceHostEpoch: 12,
    // Larger than 2^32: int64 must survive as a plain number (forceLong=number).
    createdAtUnixMs: 1_767_225_600_123,
    cleanStop: {
      clean: true,
      noTurnInFlight: true,
      graceMs: 10_000,
      stoppedAtUnixMs: 1_767_225_599_000,
      members: [{ memberId: 'claude', exitCode: 0, exitedByItself: true, signal: 'SIGTERM', withinGrace: true, containerPresent: true, writableLayerPresent: true, stopDurationMs: 420 }],
    },
    members: [
      {
        memberId: 'claude',
        kind: CliKind.CLAUDE_CODE,
        savedLocator: '0b7c6f7e-4c1a-4c55-9d7e-2b1f0c8a9e11',
        nativeSessionPaths: ['/root/.claude/projects/-work/0b7c6f7e-4c1a-4c55-9d7e-2b1f0c8a9e11.jsonl'],
        layer: {
          digest: sha('a'),
          sizeBytes: 3 * 1024 * 1024 * 1024 + 5,
          mediaType: 'application/vnd.oci.image.layer.v1.tar',
          entryCount: 41,
          chunks: [
            { digest: sha('b'), sizeBytes: 3 * 1024 * 1024 * 1024, offset: 0 },
            { digest: sha('c'), sizeBytes: 5, offset: 3 * 1024 * 1024 * 1024 },
          ],
        },
        sourceContainerId: 'c0ffee',
      },
      { memberId: 'pi', kind: CliKind.PI, savedLocator: 'pi-session-1', nativeSessionPaths: [], layer: { digest: sha('d'), sizeBytes: 0, chunks: [] } },
    ],
    baseImageDigest: sha('e'),
    baseImageRef: 'sandboxfleet/sandbox:test',
    bridgeVersion: 4,
    activityVersion: 99,
    lastCompletedTurnId: 'turn-5',
  });
}

describe('messages', () => {
  it('round-trips a CheckpointManifest through binary and JSON encodings', () => {
    const manifest = sampleManifest();
    const bytes = CheckpointManifest.encode(manifest).finish();
    const decoded = CheckpointManifest.decode(bytes);
    expect(decoded).toEqual(manifest);
    expect(decoded.members[0]?.layer?.sizeBytes).toBe(3 * 1024 * 1024 * 1024 + 5);
    expect(decoded.members[0]?.layer?.chunks[1]?.offset).toBe(3 * 1024 * 1024 * 1024);
    expect(decoded.createdAtUnixMs).toBe(1_767_225_600_123);
    // JSON keeps proto enum names, which the CLI's `-o json` relies on.
    const json = CheckpointManifest.toJSON(manifest) as { members: { kind: string }[] };
    expect(json.members[0]?.kind).toBe('CLI_KIND_CLAUDE_CODE');
    expect(CheckpointManifest.fromJSON(JSON.parse(JSON.stringify(json)))).toEqual(manifest);
  });

  it('round-trips an AgentCommand with each oneof case and keeps the fence', () => {
    const commands: AgentCommand['command'][] = [
      { $case: 'createGroup', value: { groupId: 'g', conversationId: 'conv', members: [{ memberId: 'codex', kind: CliKind.CODEX }], imageRef: 'img', imageDigest: sha('1') } },
      { $case: 'startGroup', value: { groupId: 'g', memberIds: [] } },
      { $case: 'stopGroup', value: { groupId: 'g', graceMs: 5000 } },
      { $case: 'checkpoint', value: { groupId: 'g', checkpointId: 'c', members: [], cleanStop: undefined, activityVersion: 4, lastCompletedTurnId: '', maxManifestSchemaVersion: 2 } },
      { $case: 'restore', value: { groupId: 'g', manifest: sampleManifest() } },
      { $case: 'deleteGroup', value: { groupId: 'g', reason: 'not_owned' } },
      { $case: 'inventory', value: { groupId: '' } },
      { $case: 'probe', value: { nonce: 'n-1', callbackSubject: 'sf.cp.probe' } },
    ];
    for (const command of commands) {
      const message = AgentCommand.create({ commandId: 'cmd-1', hostId: 'host-a', hostEpoch: 7, placementGeneration: 2, issuedAtUnixMs: 1, deadlineUnixMs: 2, command });
      const decoded = AgentCommand.decode(AgentCommand.encode(message).finish());
      expect(decoded).toEqual(message);
      expect(decoded.command?.$case).toBe(command?.$case);
      expect([decoded.hostEpoch, decoded.placementGeneration]).toEqual([7, 2]);
    }
  });

  it('round-trips a refused AgentCommandResult and a Heartbeat with optional exit codes', () => {
    const refused = AgentCommandResult.create({ commandId: 'cmd-1', hostId: 'h', hostEpoch: 3, outcome: CommandOutcome.REFUSED, reason: 'stale_epoch' });
    expect(AgentCommandResult.decode(AgentCommandResult.encode(refused).finish())).toEqual(refused);

    const heartbeat = Heartbeat.create({
      hostId: 'h',
      hostEpoch: 3,
      sequence: 41,
      inventory: {
        containers: [
          { containerId: 'a', groupId: 'g', memberId: 'm', state: ContainerState.EXITED, exitCode: 0, writableLayerPresent: true },
          { containerId: 'b', groupId: 'g', memberId: 'n', state: ContainerState.RUNNING, writableLayerPresent: true },
        ],
      },
    });
    const decoded = Heartbeat.decode(Heartbeat.encode(heartbeat).finish());
    // proto3 `optional`: an exit code of 0 is present, an absent one stays undefined.
    expect(decoded.inventory?.containers[0]?.exitCode).toBe(0);
    expect(decoded.inventory?.containers[1]?.exitCode).toBeUndefined();
  });

  it('distinguishes an absent locator from an empty one in BeginTurn (R-S3)', () => {
    const absent = BeginTurnRequest.decode(BeginTurnRequest.encode({ idempotencyKey: 'k', groupId: 'g', memberId: 'm' }).finish());
    expect(absent.locator).toBeUndefined();
    const present = BeginTurnRequest.decode(BeginTurnRequest.encode({ idempotencyKey: 'k', groupId: 'g', memberId: 'm', locator: 's-1' }).finish());
    expect(present.locator).toBe('s-1');
  });

  it('decodes an enum value from a newer peer as UNRECOGNIZED rather than failing', () => {
    const bytes = BeginTurnResponse.encode(BeginTurnResponse.create({ turnId: 't', contextState: 99 as ContextState })).finish();
    expect(BeginTurnResponse.decode(bytes).contextState).toBe(99);
    expect(BeginTurnResponse.toJSON(BeginTurnResponse.decode(bytes))).toMatchObject({ contextState: 'UNRECOGNIZED' });
  });
});

describe('API_SHA (R-H1)', () => {
  it('is the content hash of proto/ that scripts/gen-proto documents', () => {
    const protoRoot = fileURLToPath(new URL('../../proto', import.meta.url));
    const files = (readdirSync(protoRoot, { recursive: true }) as string[]).filter((f) => f.endsWith('.proto')).map((f) => `./${f}`).sort();
    const lines = files.map((f) => `${createHash('sha256').update(readFileSync(join(protoRoot, f))).digest('hex')}  ${f}\n`).join('');
    expect(API_SHA).toBe(createHash('sha256').update(lines).digest('hex'));
  });
});

describe('grpc-js service definitions (R-I1)', () => {
  it('name every RunnerService and AdminService method with its wire path', () => {
    expect(Object.values(RunnerServiceService).map((m) => m.path)).toEqual([
      '/sandboxfleet.v1.RunnerService/OpenGroup',
      '/sandboxfleet.v1.RunnerService/BeginTurn',
      '/sandboxfleet.v1.RunnerService/CompleteTurn',
      '/sandboxfleet.v1.RunnerService/StopGroup',
      '/sandboxfleet.v1.RunnerService/GetGroupState',
      '/sandboxfleet.v1.RunnerService/Exec',
      '/sandboxfleet.v1.RunnerService/RunTurn',
    ]);
    expect(RunnerServiceService.exec).toMatchObject({ requestStream: true, responseStream: true });
    expect(RunnerServiceService.runTurn).toMatchObject({ requestStream: false, responseStream: true });
    expect(Object.values(AdminServiceService).map((m) => m.path)).toEqual(
      ['ListHosts', 'GetHost', 'DrainHost', 'RemoveHost', 'ListGroups', 'GetGroup', 'MigrateGroup', 'DestroyGroup', 'ListCheckpoints', 'Verify', 'ListEvents'].map(
        (name) => `/sandboxfleet.v1.AdminService/${name}`,
      ),
    );
    expect(AdminServiceService.listEvents.responseStream).toBe(true);
    expect(RunnerServiceService.beginTurn.responseStream).toBe(false);
  });

  describe('over a loopback server', () => {
    const server = new grpc.Server();
    let runner: RunnerServiceClient;
    let admin: AdminServiceClient;

    const unimplemented = (_call: unknown, callback: grpc.sendUnaryData<never>): void => callback({ code: grpc.status.UNIMPLEMENTED });
    const runnerImpl: RunnerServiceServer = {
      openGroup: unimplemented,
      stopGroup: unimplemented,
      getGroupState: unimplemented,
      exec: (call) => call.emit('error', { code: grpc.status.UNIMPLEMENTED }),
      runTurn: (call) => call.emit('error', { code: grpc.status.UNIMPLEMENTED }),
      beginTurn: (call, callback) => {
        callback(null, BeginTurnResponse.create({ turnId: `turn-of-${call.request.memberId}`, contextState: ContextState.RESTORED, locator: call.request.locator ?? 'saved', placementGeneration: 2 }));
      },
      // Refuses like the control plane does on an identity mismatch: FAILED_PRECONDITION with an
      // ErrorDetail in grpc-status-details-bin (R-S2).
      completeTurn: (call, callback) => {
        const detail = ErrorDetail.create({ reason: 'locator_mismatch', domain: 'control-plane', metadata: { observed: call.request.observedLocator ?? '' } });
        const status = RpcStatus.create({
          code: grpc.status.FAILED_PRECONDITION,
          message: 'locator changed',
          details: [{ typeUrl: 'type.googleapis.com/sandboxfleet.v1.ErrorDetail', value: Buffer.from(ErrorDetail.encode(detail).finish()) }],
        });
        const metadata = new grpc.Metadata();
        metadata.set('grpc-status-details-bin', Buffer.from(RpcStatus.encode(status).finish()));
        callback({ code: grpc.status.FAILED_PRECONDITION, details: 'locator changed', metadata });
      },
    };
    const adminImpl: AdminServiceServer = {
      listHosts: unimplemented,
      getHost: unimplemented,
      drainHost: unimplemented,
      removeHost: unimplemented,
      listGroups: unimplemented,
      getGroup: unimplemented,
      migrateGroup: unimplemented,
      destroyGroup: unimplemented,
      listCheckpoints: unimplemented,
      verify: unimplemented,
      listEvents: (call) => {
        for (let seq = call.request.fromSeq; seq < call.request.fromSeq + 3; seq++) {
          call.write(ListEventsResponse.create({ event: Event.create({ seq, type: 'group.state_changed', detail: { n: String(seq) } }) }));
        }
        call.end();
      },
    };

    beforeAll(async () => {
      server.addService(RunnerServiceService, runnerImpl);
      server.addService(AdminServiceService, adminImpl);
      const port = await new Promise<number>((resolve, reject) =>
        server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
      );
      runner = new RunnerServiceClient(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
      admin = new AdminServiceClient(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
    });
    afterAll(async () => {
      runner?.close();
      admin?.close();
      await new Promise<void>((resolve) => server.tryShutdown(() => resolve()));
    });

    it('serves a unary call', async () => {
      const response = await new Promise<BeginTurnResponse>((resolve, reject) =>
        runner.beginTurn({ idempotencyKey: 'k', groupId: 'g', memberId: 'claude' }, (err, res) => (err ? reject(err) : resolve(res))),
      );
      expect(response).toMatchObject({ turnId: 'turn-of-claude', contextState: ContextState.RESTORED, locator: 'saved', placementGeneration: 2 });
    });

    it('carries an ErrorDetail reason in the status details', async () => {
      const request = CompleteTurnRequest.create({
        idempotencyKey: 'k',
        turnId: 't',
        observedLocator: 'other',
        evidence: { kind: TurnEndKind.RESULT, nativeTurnEnded: true, succeeded: true, cleanupFinished: true, transportUsable: true, locatorUsable: true },
      });
      const err = await new Promise<grpc.ServiceError>((resolve, reject) =>
        runner.completeTurn(request, (e) => (e ? resolve(e) : reject(new Error('expected a refusal')))),
      );
      expect(err.code).toBe(grpc.status.FAILED_PRECONDITION);
      const raw = err.metadata.get('grpc-status-details-bin')[0];
      expect(Buffer.isBuffer(raw)).toBe(true);
      const status = RpcStatus.decode(raw as Buffer);
      expect(status.details[0]?.typeUrl).toBe('type.googleapis.com/sandboxfleet.v1.ErrorDetail');
      const detail = ErrorDetail.decode(status.details[0]?.value ?? new Uint8Array());
      expect(detail).toEqual({ reason: 'locator_mismatch', domain: 'control-plane', metadata: { observed: 'other' } });
    });

    it('streams events from a sequence', async () => {
      const seqs: number[] = [];
      await new Promise<void>((resolve, reject) => {
        const stream = admin.listEvents({ fromSeq: 10, follow: false, subjectKind: '', subjectId: '', limit: 0 });
        stream.on('data', (m: ListEventsResponse) => seqs.push(m.event?.seq ?? -1));
        stream.on('error', reject);
        stream.on('end', resolve);
      });
      expect(seqs).toEqual([10, 11, 12]);
    });
  });
});
