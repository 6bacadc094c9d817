// Backend-only cost of a turn pair (no gRPC): the control plane's runner backend driven directly at
// c64 against real NATS (fsync always), a real dockerd host and agent. For iterating on the hot
// path: reports pairs/s and CPU per pair of this process and of nats-server, per window.
//   node --import tsx bench/turns/backend.ts [--seconds 5] [--windows 3]
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { startFleet, SUCCESS } from '../../test/integration/control-plane/fleet-harness.ts';

const { values } = parseArgs({ options: { seconds: { type: 'string', default: '5' }, windows: { type: 'string', default: '3' } } });
const procCpuS = (pid: number | undefined): number => {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return (Number(f[11]) + Number(f[12])) / 100;
};
const fleet = await startFleet(1);
try {
  const plane = await fleet.startPlane();
  await fleet.startAgentOn('host-a', 0, { maxMembers: 256 });
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
  let n = 0;
  const groups: string[] = [];
  for (let i = 0; i < 64; i += 8) {
    groups.push(...(await Promise.all(Array.from({ length: 8 }, async (_, j) => (await plane.runner.openGroup({ idempotencyKey: `o-${i + j}`, conversationId: `c-${i + j}`, members: [{ memberId: 'm', cli: 'claude_code' }] })).group.groupId))));
  }
  const pair = async (g: string): Promise<void> => {
    const b = await plane.runner.beginTurn({ idempotencyKey: `k-${++n}`, groupId: g, memberId: 'm' });
    await plane.runner.completeTurn({ idempotencyKey: `k-${++n}`, groupId: g, memberId: 'm', turnId: b.turnId, observedLocator: `s-${g}`, evidence: SUCCESS });
  };
  await Promise.all(groups.map(pair));
  await new Promise((r) => setTimeout(r, 1500));
  for (let w = 0; w < Number(values.windows); w++) {
    let pairs = 0;
    const end = performance.now() + Number(values.seconds) * 1000;
    const c0 = process.cpuUsage();
    const n0 = procCpuS(fleet.nats.server.pid);
    const t0 = performance.now();
    await Promise.all(groups.map(async (g) => {
      while (performance.now() < end) {
        await pair(g);
        pairs++;
      }
    }));
    const wall = (performance.now() - t0) / 1000;
    const c = process.cpuUsage(c0);
    const nats = procCpuS(fleet.nats.server.pid) - n0;
    console.log(JSON.stringify({ pairsPerS: Math.round(pairs / wall), serverUsPerPair: Math.round((c.user + c.system) / pairs), natsUsPerPair: Math.round((nats * 1e6) / pairs) }));
  }
} finally {
  await fleet.cleanup();
}
