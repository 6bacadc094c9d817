// Per-host NATS credentials (R-I2, R-R5) against a real nats-server whose static authorization
// admits only nkey users: the control plane (every subject) and one user per host limited to
// core/agent-subjects.ts hostPermissions(host).
// - What a host needs works: heartbeats, registration, answering its own commands, chunk and
//   manifest writes and reads (also from the chunk worker threads), and a whole migration: a group
//   checkpointed on host-a by an agent on host-a's credentials, drained, and restored on host-b by
//   an agent on host-b's credentials, whose next turn is RESTORED.
// - What a host must not do is refused by the server: another host's command or heartbeat
//   subject, anyone else's replies, KV state, stream administration, consumers, the event log.
// - No credentials, or another user's seed for the wrong host, gets nothing at all.
import { join } from 'node:path';
import { jetstreamManager } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import { PermissionViolationError, type NatsConnection } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentSubjects, hostInboxPrefix } from '../../../src/core/agent-subjects.ts';
import { CONTROL_PLANE_BUCKETS } from '../../../src/control-plane/buckets.ts';
import { sha256Digest, ChunkStore } from '../../../src/store/chunk-store.ts';
import { fetchChunksInWorker } from '../../../src/store/chunk-fetch-worker.ts';
import { WorkerChunkWriter } from '../../../src/store/chunk-publish-worker.ts';
import { StateStore, connectNats } from '../../../src/store/connection.ts';
import { NatsCredentialsError, credentialKind, natsAuthConnectOptions, newNkeyUser, workerAuth } from '../../../src/store/nats-auth.ts';
import { startNkeyNats, type NkeyNats } from '../../support/nkey-nats.ts';
import type { TestNats } from '../../support/nats.ts';
import { SUCCESS, startFleet, type Fleet } from '../control-plane/fleet-harness.ts';

let dir: string;
let nats: TestNats;
let cp: NatsConnection;
let auth: NkeyNats['auth'];
let fixture: NkeyNats | undefined;

beforeAll(async () => {
  fixture = await startNkeyNats('sf-nats-auth-');
  ({ nats, dir, auth } = fixture);
  cp = await nats.connect('control-plane', auth.cp);
  // The control plane creates every bucket and stream; agents may not.
  await StateStore.open(cp, { buckets: CONTROL_PLANE_BUCKETS });
  await ChunkStore.open(cp);
}, 60_000);

afterAll(async () => {
  await fixture?.cleanup();
});

/** Resolves with the first permission violation the server reports on `nc` (or undefined after `ms`). */
function nextViolation(nc: NatsConnection, ms = 3_000): Promise<PermissionViolationError | undefined> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(undefined), ms);
    void (async () => {
      for await (const s of nc.status()) {
        if (s.type === 'error' && s.error instanceof PermissionViolationError) {
          clearTimeout(timer);
          resolve(s.error);
          return;
        }
      }
    })();
  });
}

/** Subscribing to `subject` on `nc` is refused by the server. */
async function expectSubscribeRefused(nc: NatsConnection, subject: string): Promise<void> {
  const violation = nextViolation(nc);
  const sub = nc.subscribe(subject);
  await nc.flush();
  const err = await violation;
  expect(err, `subscribe ${subject}`).toBeInstanceOf(PermissionViolationError);
  expect(err?.operation).toBe('subscription');
  expect(err?.subject).toBe(subject);
  sub.unsubscribe();
}

/** Publishing to `subject` on `nc` is refused, and nobody (the control plane listening) gets it. */
async function expectPublishRefused(nc: NatsConnection, subject: string): Promise<void> {
  const received: string[] = [];
  const spy = cp.subscribe(subject, { callback: (_e, m) => void received.push(m.subject) });
  await cp.flush();
  const violation = nextViolation(nc);
  nc.publish(subject, new Uint8Array([1]));
  await nc.flush();
  const err = await violation;
  expect(err, `publish ${subject}`).toBeInstanceOf(PermissionViolationError);
  expect(err?.operation).toBe('publish');
  await cp.flush();
  expect(received).toEqual([]);
  spy.unsubscribe();
}

describe('per-host NATS credentials: what a host may do', () => {
  it('heartbeats, registers, answers its own commands, and reads/writes chunks and manifests', async () => {
    const a = await nats.connect('host-a', auth.a);
    // Heartbeat on its own subject reaches the control plane.
    const beats = cp.subscribe(AgentSubjects.allHeartbeats, { max: 1 });
    await cp.flush();
    a.publish(AgentSubjects.heartbeat('host-a'), new Uint8Array([7]));
    for await (const m of beats) expect(m.subject).toBe(AgentSubjects.heartbeat('host-a'));

    // Registration is a request: the answer comes back on host-a's own inbox.
    const reg = cp.subscribe(AgentSubjects.register, { callback: (_e, m) => void m.respond(new Uint8Array([42])) });
    await cp.flush();
    const answer = await a.request(AgentSubjects.register, new Uint8Array([1]), { timeout: 5_000 });
    expect([...answer.data]).toEqual([42]);
    reg.unsubscribe();

    // A command from the control plane, answered by the host (a reply it may publish because it was asked).
    a.subscribe(AgentSubjects.commands('host-a'), { callback: (_e, m) => void m.respond(new Uint8Array([9])) });
    await a.flush();
    const result = await cp.request(AgentSubjects.commands('host-a'), new Uint8Array([1]), { timeout: 5_000 });
    expect([...result.data]).toEqual([9]);

    // Chunks and manifests through the store, without administering the streams.
    const store = await ChunkStore.open(a, { manage: false });
    const data = new TextEncoder().encode(`chunk of host-a ${Date.now()}`);
    const { ref, stored } = await store.put(data);
    expect(stored).toBe(true);
    expect(await store.has(ref.digest)).toBe(true);
    expect(Buffer.from(await store.get(ref)).equals(Buffer.from(data))).toBe(true);
    // ...and from the worker threads, on their own connections with the same credentials.
    const connection = { servers: nats.server.url, auth: workerAuth(auth.a) };
    const writer = new WorkerChunkWriter({ ...connection, maxInFlight: 4 });
    const big = Buffer.alloc(300_000, 3);
    await writer.put(big);
    const [bigRef] = (await writer.flush()).refs;
    if (bigRef === undefined) throw new Error('the worker stored nothing');
    const fetched: Buffer[] = [];
    for await (const c of fetchChunksInWorker([ref, bigRef], { ...connection, stream: store.chunkStream, maxInFlight: 2 })) fetched.push(c);
    expect(fetched.map((c) => c.length)).toEqual([data.length, big.length]);
    expect(sha256Digest(fetched[1]!)).toBe(bigRef.digest);
  });
});

describe('per-host NATS credentials: what a host may not do', () => {
  it("refuses another host's subjects and everyone else's replies", async () => {
    const a = await nats.connect('host-a-deny', auth.a);
    await expectSubscribeRefused(a, AgentSubjects.commands('host-b'));
    await expectSubscribeRefused(a, 'sf.host.*.cmd');
    await expectSubscribeRefused(a, '_INBOX.>');
    await expectSubscribeRefused(a, `${hostInboxPrefix('host-b')}.>`);
    await expectSubscribeRefused(a, AgentSubjects.allHeartbeats);
    await expectPublishRefused(a, AgentSubjects.heartbeat('host-b'));
    await expectPublishRefused(a, AgentSubjects.notices('host-b'));
    await expectPublishRefused(a, AgentSubjects.probeCallback('host-b'));
    await expectPublishRefused(a, AgentSubjects.commands('host-b'));
    await expectPublishRefused(a, 'sf.events.group.g-1');
    // A checkpoint in another host's name: manifests are written under the writer's own host token.
    await expectPublishRefused(a, 'sf.manifest.host-b.g-1.c-1');
  });

  it('refuses KV state, stream administration, consumers and the event log', async () => {
    const a = await nats.connect('host-a-js', auth.a);
    const jsm = await jetstreamManager(a);
    // Reading or writing control-plane state.
    await expect((await new Kvm(a).open('sf_hosts')).get('host-a')).rejects.toThrow();
    await expect((await new Kvm(a).open('sf_groups_0')).put('g-1', new Uint8Array([1]))).rejects.toThrow();
    await expectPublishRefused(a, '$KV.sf_hosts.host-a');
    await expectPublishRefused(a, '$KV.sf_groups_0.g-1');
    // Administering the checkpoint streams it may use.
    await expect(jsm.streams.delete('SF_CHUNKS')).rejects.toThrow();
    await expect(jsm.streams.purge('SF_CHECKPOINTS')).rejects.toThrow();
    await expect(jsm.streams.update('SF_CHUNKS', { max_age: 1 })).rejects.toThrow();
    await expect(jsm.consumers.add('SF_CHUNKS', { durable_name: 'spy' })).rejects.toThrow();
    // Any other stream, even its info.
    await expect(jsm.streams.info('SF_EVENTS')).rejects.toThrow();
    await expect(jsm.streams.delete('SF_EVENTS')).rejects.toThrow();
    // The streams and state are untouched.
    const cpm = await jetstreamManager(cp);
    expect((await cpm.streams.info('SF_EVENTS')).config.name).toBe('SF_EVENTS');
    expect((await cpm.streams.info('SF_CHUNKS')).config.max_age).toBe(0);
  });

  it('admits nobody without credentials, and reads a credential file strictly', async () => {
    await expect(connectNats({ servers: nats.server.url, name: 'anonymous', maxReconnectAttempts: 0 })).rejects.toThrow(/authorization/i);
    const stranger = await fixture!.seedFile('stranger', newNkeyUser().seed);
    await expect(connectNats({ servers: nats.server.url, name: 'stranger', maxReconnectAttempts: 0, auth: { credsFile: stranger } })).rejects.toThrow(/authorization/i);
    const garbage = await fixture!.seedFile('garbage', 'not a seed');
    expect(() => natsAuthConnectOptions({ credsFile: garbage })).toThrow(NatsCredentialsError);
    expect(() => natsAuthConnectOptions({ credsFile: join(dir, 'missing.nk') })).toThrow(/cannot read/);
    expect(credentialKind(`-----BEGIN NATS USER JWT-----\neyJ0\n------END NATS USER JWT------\n`, 'x')).toBe('creds');
  });
});

describe('per-host NATS credentials: a whole migration', () => {
  let fleet: Fleet;
  afterAll(async () => {
    await fleet?.cleanup();
  });

  it('checkpoints on host-a and restores on host-b with each agent on its own credentials only', async () => {
    fleet = await startFleet(2, {}, { auth: true });
    const plane = await fleet.startPlane();
    await fleet.startAgentOn('host-a', 0);
    await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
    let n = 0;
    const key = () => `auth-${++n}`;
    const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId: 'conv-auth', members: [{ memberId: 'm1', cli: 'claude_code' }] });
    const turn = async () => {
      const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: group.groupId, memberId: 'm1' });
      await fleet.writeSession(begun.hostId, begun.containerId, 'sess-auth');
      await plane.runner.completeTurn({ idempotencyKey: key(), groupId: group.groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-auth', evidence: SUCCESS });
      return begun;
    };
    expect((await turn()).contextState).toBe('NEW');
    const stopped = await plane.runner.stopGroup({ idempotencyKey: key(), groupId: group.groupId });
    expect(stopped.group.stopClean).toBe(true);
    expect(stopped.checkpointId).toBeDefined();

    await fleet.startAgentOn('host-b', 1);
    await fleet.waitFor('host-b READY', async () => ((await fleet.host('host-b')).lifecycle.state === 'READY' ? true : undefined));
    expect(await plane.drainHost('host-a')).toBe(true);
    const moved = await fleet.waitFor('group restored on host-b', async () => {
      const g = await fleet.group(group.groupId);
      return g.lifecycle.state === 'STOPPED' && g.lifecycle.hostId === 'host-b' && g.evacuation === undefined ? g : undefined;
    }, 90_000);
    expect(moved.lifecycle.generation).toBe(2);
    const after = await turn();
    expect(after.contextState).toBe('RESTORED');
    expect(after.hostId).toBe('host-b');
  }, 240_000);
});
