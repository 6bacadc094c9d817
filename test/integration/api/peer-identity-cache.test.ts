// The caller's role is derived once per connection, not per call (src/api/call-handler.ts), and
// never shared between connections. A real grpc-js server and clients on loopback: if grpc-js
// stops exposing the connection in the shape we read, the first test fails (the cache silently
// fell back to per-call), and the second guards the security property either way.
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NotFound } from '../../../src/core/errors.ts';
import type { RunnerBackend } from '../../../src/core/runner-port.ts';
import type { HandlerDeps } from '../../../src/api/call-handler.ts';
import { runnerServiceImplementation } from '../../../src/api/runner-server.ts';
import { RunnerServiceClient, RunnerServiceService } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { silentLogger } from '../../../src/observability/logger.ts';

const notFound = (): never => {
  throw new NotFound('group_not_found', 'no such group');
};
const backend: RunnerBackend = { openGroup: notFound, beginTurn: notFound, completeTurn: notFound, stopGroup: notFound, getGroupState: notFound };

let server: grpc.Server;
let address: string;
const identified: unknown[] = [];

beforeAll(async () => {
  const deps: HandlerDeps = {
    logger: silentLogger(),
    identify: (call) => {
      identified.push(call);
      return { role: 'runner', name: `caller-${identified.length}`, localDev: false };
    },
  };
  server = new grpc.Server();
  server.addService(RunnerServiceService, runnerServiceImplementation(deps, backend));
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
  );
  address = `127.0.0.1:${port}`;
});

afterAll(() => server.forceShutdown());

function getState(client: RunnerServiceClient): Promise<grpc.ServiceError> {
  return new Promise((resolve) => client.getGroupState({ groupId: 'g-1', conversationId: '' }, (err) => resolve(err as grpc.ServiceError)));
}

describe('peer identity per connection', () => {
  it('derives the identity once for many calls on one connection', async () => {
    const client = new RunnerServiceClient(address, grpc.credentials.createInsecure());
    const before = identified.length;
    for (let i = 0; i < 5; i++) expect((await getState(client)).code).toBe(grpc.status.NOT_FOUND);
    expect(identified.length - before).toBe(1);
    client.close();
  });

  it('derives it again for every new connection', async () => {
    const before = identified.length;
    for (let i = 0; i < 3; i++) {
      // A distinct channel option forces a new subchannel, hence a new TCP connection.
      const client = new RunnerServiceClient(address, grpc.credentials.createInsecure(), { 'grpc.primary_user_agent': `conn-${i}` });
      expect((await getState(client)).code).toBe(grpc.status.NOT_FOUND);
      expect((await getState(client)).code).toBe(grpc.status.NOT_FOUND);
      client.close();
    }
    expect(identified.length - before).toBe(3);
  });
});
