// Kubernetes Node signals drain hosts (R-H5, R-I6), against a REAL kube-apiserver (with etcd),
// real NATS, real dockerd hosts and agents, and the real control plane: a cordoned Node's host is
// drained and its group moves (stopped cleanly, checkpointed, restored elsewhere); a Node tainted
// by the cluster autoscaler or carrying a spot-termination notice drains its host with that
// reason; Nodes of no fleet host and deleted Nodes are harmless; a Node that departs before its
// host registers still drains the host once it does.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CoreV1Api, type V1Node } from '@kubernetes/client-node';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { NodeWatcher } from '../../../src/kube/node-watcher.ts';
import { createLogger } from '../../../src/observability/logger.ts';
import { startKubeApiServer, type TestKubeApiServer } from '../../support/kube-apiserver.ts';
import { SUCCESS, startFleet, type Fleet } from '../control-plane/fleet-harness.ts';

let kube: TestKubeApiServer;
let fleet: Fleet;
let plane: ControlPlane;
let api: CoreV1Api;
let watcher: NodeWatcher;
let cordoned = '';
let groupId = '';
let n = 0;
const key = () => `kn-${++n}`;

beforeAll(async () => {
  [kube, fleet] = await Promise.all([startKubeApiServer(), startFleet(4)]);
  plane = await fleet.startPlane();
  for (const [i, h] of ['host-a', 'host-b', 'host-c'].entries()) await fleet.startAgentOn(h, i);
  for (const h of ['host-a', 'host-b', 'host-c']) await fleet.waitFor(`${h} READY`, async () => ((await fleet.host(h)).lifecycle.state === 'READY' ? true : undefined));
  api = kube.kubeConfig().makeApiClient(CoreV1Api);
  for (const name of ['host-a', 'host-b', 'host-c', 'node-without-host']) await api.createNode({ body: { metadata: { name } } });
  watcher = new NodeWatcher({
    kubeConfig: kube.kubeConfig(),
    drain: (hostId, source) => plane.drainHost(hostId, source),
    isLeader: () => plane.leader.isLeader,
    logger: createLogger({ name: 'kube-nodes-test', level: process.env.CP_TEST_LOG ?? 'silent' }),
    recheckMs: 300,
  });
  await watcher.start();
}, 300_000);

afterAll(async () => {
  await watcher?.stop();
  await fleet?.cleanup();
  await kube?.stop();
});

async function edit(name: string, change: (node: V1Node) => void): Promise<void> {
  const node = await api.readNode({ name });
  change(node);
  await api.replaceNode({ name, body: node });
}

function departing(hostId: string) {
  return fleet.waitFor(`${hostId} departing`, async () => {
    const h = await fleet.host(hostId);
    return h.lifecycle.goingAway !== undefined ? h.lifecycle : undefined;
  }, 30_000);
}

describe('Kubernetes Node watch', () => {
  it('leaves hosts alone while their Nodes are schedulable and untainted', async () => {
    await edit('host-b', (node) => {
      node.metadata = { ...node.metadata, labels: { ...node.metadata?.labels, 'example.com/pool': 'gpu' } };
      node.spec = { ...node.spec, taints: [{ key: 'dedicated', value: 'sandboxes', effect: 'NoSchedule' }] };
    });
    await new Promise((r) => setTimeout(r, 1_000));
    for (const h of ['host-a', 'host-b', 'host-c']) expect((await fleet.host(h)).lifecycle.state).toBe('READY');
  });

  it('a cordoned Node drains its host, and the group there moves to another host with its session', async () => {
    const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId: 'conv-kube', members: [{ memberId: 'm1', cli: 'claude_code' }] });
    const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: group.groupId, memberId: 'm1' });
    await fleet.writeSession(begun.hostId, begun.containerId, 'sess-kube');
    await plane.runner.completeTurn({ idempotencyKey: key(), groupId: group.groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-kube', evidence: SUCCESS });
    const source = begun.hostId;
    cordoned = source;
    groupId = group.groupId;

    await edit(source, (node) => { node.spec = { ...node.spec, unschedulable: true }; });
    expect(await departing(source)).toMatchObject({ goingAway: 'node_cordoned' });
    const moved = await fleet.waitFor('group moved', async () => {
      const g = await fleet.group(group.groupId);
      return g.lifecycle.state === 'STOPPED' && g.lifecycle.hostId !== source && g.evacuation === undefined ? g : undefined;
    }, 90_000);
    const next = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: group.groupId, memberId: 'm1' });
    expect(next).toMatchObject({ contextState: 'RESTORED', hostId: moved.lifecycle.hostId });
    const events = await fleet.store.events.read({ subjectKind: 'host', subjectId: source, limit: 100 });
    expect(events.events.some((e) => e.event.reason === 'node_cordoned')).toBe(true);
  });

  it('autoscaler and spot-termination taints drain with their reasons; other Nodes and deletions are harmless', async () => {
    // The cordoned host and the one its group moved to are left alone; the third is tainted.
    const moved = (await fleet.group(groupId)).lifecycle.hostId;
    const [tainted, untouched] = ['host-a', 'host-b', 'host-c'].filter((h) => h !== cordoned && h !== moved).concat(moved);
    expect(tainted).toBeDefined();
    await edit(tainted!, (node) => { node.spec = { ...node.spec, taints: [{ key: 'ToBeDeletedByClusterAutoscaler', value: '1764500000', effect: 'NoSchedule' }] }; });
    expect(await departing(tainted!)).toMatchObject({ goingAway: 'disruption_taint' });

    await edit('node-without-host', (node) => { node.spec = { ...node.spec, unschedulable: true }; });
    await api.deleteNode({ name: 'node-without-host' });
    await api.deleteNode({ name: tainted! });

    // A Node that announces its host's preemption before the host has even registered: the drain
    // follows as soon as the host exists.
    await api.createNode({ body: { metadata: { name: 'host-d' }, spec: { taints: [{ key: 'aws-node-termination-handler/spot-itn', effect: 'NoExecute' }] } } });
    await new Promise((r) => setTimeout(r, 600));
    await fleet.startAgentOn('host-d', 3);
    expect(await departing('host-d')).toMatchObject({ goingAway: 'spot_preemption' });
    expect((await fleet.host(untouched!)).lifecycle.goingAway).toBeUndefined();
  });
});
