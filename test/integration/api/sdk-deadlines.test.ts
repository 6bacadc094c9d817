// The runner SDK's default deadlines, read where they matter: on the server, from the call itself
// (a real grpc-js server on loopback answering every call at once). Calls that may have to start,
// stop or checkpoint a group before answering (OpenGroup, BeginTurn, CompleteTurn with
// idle_stop_after 0, StopGroup) get WORK_DEADLINE_MS; a read gets 10 s; a deadline the caller gives
// (per client or per call) wins. A 10 s default on CompleteTurn would cut off an idle-0 completion,
// whose stop and checkpoint take seconds on a loaded host.
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RunnerServiceService } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { RunnerClient, WORK_DEADLINE_MS } from '../../../src/runner-sdk/index.ts';
import { successEvidence } from '../../support/evidence.ts';

let server: grpc.Server;
let address: string;
/** Per method: how long the server saw before the call's deadline. */
const seen = new Map<string, number>();

beforeAll(async () => {
  server = new grpc.Server();
  const answer = (name: string) => (call: grpc.ServerUnaryCall<unknown, unknown>, callback: grpc.sendUnaryData<unknown>) => {
    const deadline = call.getDeadline();
    seen.set(name, (deadline instanceof Date ? deadline.getTime() : Number(deadline)) - Date.now());
    callback({ code: grpc.status.NOT_FOUND, details: 'answered at once' });
  };
  server.addService(RunnerServiceService, {
    openGroup: answer('openGroup'),
    beginTurn: answer('beginTurn'),
    completeTurn: answer('completeTurn'),
    stopGroup: answer('stopGroup'),
    getGroupState: answer('getGroupState'),
  } as never);
  const port = await new Promise<number>((resolve, reject) => server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))));
  address = `127.0.0.1:${port}`;
});

afterAll(() => server.forceShutdown());

async function callAll(client: RunnerClient, perCall?: number): Promise<void> {
  const o = perCall === undefined ? {} : { deadlineMs: perCall };
  const calls = [
    client.openGroup({ conversationId: 'c', members: [{ memberId: 'm', cli: 'pi' }] }, o),
    client.beginTurn({ groupId: 'g', memberId: 'm' }, o),
    client.completeTurn({ groupId: 'g', memberId: 'm', turnId: 't', observedLocator: 's', evidence: successEvidence() }, o),
    client.stopGroup({ groupId: 'g' }, o),
    client.getGroupState({ groupId: 'g' }, o),
  ];
  await Promise.all(calls.map((c) => c.then(() => undefined, () => undefined)));
}

describe('runner SDK default deadlines', () => {
  it('gives the calls that change a group the work deadline and a read 10 s', async () => {
    const client = new RunnerClient({ address, insecureLocalDev: true });
    seen.clear();
    await callAll(client);
    client.close();
    for (const m of ['openGroup', 'beginTurn', 'completeTurn', 'stopGroup']) {
      expect(seen.get(m), m).toBeGreaterThan(WORK_DEADLINE_MS - 5_000);
      expect(seen.get(m), m).toBeLessThanOrEqual(WORK_DEADLINE_MS);
    }
    expect(seen.get('getGroupState')).toBeGreaterThan(5_000);
    expect(seen.get('getGroupState')).toBeLessThanOrEqual(10_000);
  });

  it('uses the deadline the caller gives, per client and per call', async () => {
    const client = new RunnerClient({ address, insecureLocalDev: true, deadlineMs: 30_000 });
    seen.clear();
    await callAll(client);
    for (const m of ['openGroup', 'beginTurn', 'completeTurn', 'stopGroup', 'getGroupState']) expect(seen.get(m), m).toBeLessThanOrEqual(30_000);
    expect(seen.get('completeTurn')).toBeGreaterThan(25_000);
    seen.clear();
    await callAll(client, 3_000);
    for (const m of ['openGroup', 'beginTurn', 'completeTurn', 'stopGroup', 'getGroupState']) expect(seen.get(m), m).toBeLessThanOrEqual(3_000);
    client.close();
  });
});
