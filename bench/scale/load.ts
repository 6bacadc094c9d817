// The load generator of bench/scale: one child process simulating every host of the fleet the way a
// host agent talks to the control plane (src/host-agent): a Registration request on
// `sf.agent.register` with an attestation the control plane's policy admits, then a Heartbeat
// published on the host's subject every interval with its epoch, a rising sequence, its capacity and
// its inventory — one exited member container with its writable layer per group the host holds, as
// a real agent lists every member container of its engine (host-health.ts). Hosts beat at evenly
// spread phases, so N hosts at interval T are a steady N/T messages a second, not bursts.
// It runs apart from the control plane so that the control plane's CPU is its own.
//
// Each heartbeat is the concatenation of two encoded Heartbeat messages (protobuf merges repeated
// encodings of one message): the per-beat header and the host's inventory, encoded once — so this
// process stays light and does not steal the 2-core machine's CPU from what it measures. Like the
// real agent (src/host-agent/inventory-elision.ts, where the tree has it), a host's unchanged
// container entries go out in full every FULL_INVENTORY_EVERY_BEATS-th beat and are left out of
// the others, named by their digest; the simulated inventories never change, so which beats carry
// them is a count, and both encodings of each host's inventory are made once.
//
// IPC: parent → child `{ type: 'interval', ms } | { type: 'inventory', full } | { type: 'silence', host }
// | { type: 'stats' } | { type: 'stop' }`; child → parent `registered`, `stats`, `error`.
import { loadProduct } from './product.ts';
import { BENCH_AGENT_SHA, BENCH_IMAGE_DIGEST, hostId, inventoryOf } from './fleet.ts';

export interface LoadJob {
  readonly root: string;
  readonly natsUrl: string;
  readonly hosts: number;
  readonly groups: number;
  readonly intervalMs: number;
}

export type LoadMessage =
  | { readonly type: 'registered'; readonly seconds: number; readonly admitted: number }
  | { readonly type: 'stats'; readonly sent: number; readonly bytes: number }
  | { readonly type: 'error'; readonly message: string };

type Command = { type: 'interval'; ms: number } | { type: 'inventory'; full: boolean } | { type: 'silence'; host: number } | { type: 'stats' } | { type: 'stop' };

const send = (m: LoadMessage): void => {
  process.send?.(m);
};

async function main(): Promise<void> {
  const job = JSON.parse(process.argv[2] ?? '') as LoadJob;
  const p = await loadProduct(job.root);
  const { Heartbeat, Registration, RegistrationAck } = p.proto;
  const subjects = p.subjects.AgentSubjects;
  const nc = await p.connection.connectNats({ servers: job.natsUrl, name: 'bench-scale-hosts' });
  const perHost = Math.ceil(job.groups / job.hosts);
  const maxMembers = Math.max(16, 2 * perHost);

  // Registration, a few hosts at a time (the control plane serves registrations one by one).
  const epochs: number[] = new Array<number>(job.hosts).fill(0);
  const t0 = performance.now();
  let next = 0;
  let admitted = 0;
  await Promise.all(Array.from({ length: 16 }, async () => {
    for (let h = next++; h < job.hosts; h = next++) {
      const reg = Registration.fromPartial({
        hostId: hostId(h), agentInstanceId: `bench-${hostId(h)}`, sentAtUnixMs: Date.now(), capacity: { maxMembers },
        attestation: {
          agentBuildSha: BENCH_AGENT_SHA, apiSha: p.apiSha.API_SHA, engineVersion: '20.10.24', storageDriver: 'overlay2',
          imageRef: 'sandbox:bench', imageDigest: BENCH_IMAGE_DIGEST, bridge: { claimedVersion: '4', helperOutput: '4', labelVersion: '4' },
        },
      });
      const ack = RegistrationAck.decode((await nc.request(subjects.register, Registration.encode(reg).finish(), { timeout: 30_000 })).data);
      if (!ack.admitted) throw new Error(`${hostId(h)} not admitted: ${ack.refusalReasons.join(',')}`);
      admitted += 1;
      epochs[h] = ack.hostEpoch;
    }
  }));
  send({ type: 'registered', seconds: (performance.now() - t0) / 1000, admitted });

  const now = Date.now();
  const elision = p.inventoryElision;
  const fullEvery = elision?.FULL_INVENTORY_EVERY_BEATS ?? 1;
  const fullInventory: Uint8Array[] = [];
  const omittedInventory: Uint8Array[] = [];
  for (let h = 0; h < job.hosts; h++) {
    const inventory = inventoryOf(p, h, job.hosts, job.groups, now);
    const digest = elision?.containersDigest(inventory.containers);
    fullInventory.push(Heartbeat.encode(Heartbeat.fromPartial({ inventory, ...(digest !== undefined ? { containersDigest: digest } : {}) })).finish());
    omittedInventory.push(Heartbeat.encode(Heartbeat.fromPartial({ inventory: { ...inventory, containers: [] }, ...(digest !== undefined ? { containersDigest: digest, containersOmitted: true } : {}) })).finish());
  }
  const emptyInventory = Heartbeat.encode(Heartbeat.fromPartial({ inventory: { containers: [], takenAtUnixMs: now } })).finish();
  let full = true;
  let interval = job.intervalMs;
  const silenced = new Set<number>();
  const sequence = new Array<number>(job.hosts).fill(0);
  let sent = 0;
  let bytes = 0;
  const due: number[] = [];
  const phase = (start: number): void => {
    for (let h = 0; h < job.hosts; h++) due[h] = start + (h / job.hosts) * interval;
  };
  phase(Date.now());

  const beat = (h: number, at: number): void => {
    const header = Heartbeat.encode(Heartbeat.fromPartial({
      hostId: hostId(h), hostEpoch: epochs[h]!, sequence: ++sequence[h]!, sentAtUnixMs: at,
      capacity: { usedMembers: perHost, maxMembers, diskFreeBytes: 400e9, memoryAvailableBytes: 64e9 },
    })).finish();
    // The host's first beat and every fullEvery-th after it carry the entries (sequence is 1-based).
    const inv = !full ? emptyInventory : (sequence[h]! - 1) % fullEvery === 0 ? fullInventory[h]! : omittedInventory[h]!;
    const msg = new Uint8Array(header.length + inv.length);
    msg.set(header, 0);
    msg.set(inv, header.length);
    nc.publish(subjects.heartbeat(hostId(h)), msg);
    sent += 1;
    bytes += msg.length;
  };
  const timer = setInterval(() => {
    const at = Date.now();
    for (let h = 0; h < job.hosts; h++) {
      if (due[h]! > at) continue;
      if (!silenced.has(h)) beat(h, at);
      // Behind by a whole interval (this process stalled): resume the rhythm from now, no burst.
      due[h] = due[h]! + interval > at ? due[h]! + interval : at + interval;
    }
  }, 10);

  process.on('message', (cmd: Command) => {
    void (async () => {
      try {
        if (cmd.type === 'interval') {
          interval = cmd.ms;
          phase(Date.now());
        } else if (cmd.type === 'inventory') {
          full = cmd.full;
        } else if (cmd.type === 'silence') {
          silenced.add(cmd.host);
        } else if (cmd.type === 'stats') {
          send({ type: 'stats', sent, bytes });
        } else if (cmd.type === 'stop') {
          clearInterval(timer);
          await nc.close();
          process.disconnect?.();
          process.exit(0);
        }
      } catch (err) {
        send({ type: 'error', message: err instanceof Error ? err.stack ?? err.message : String(err) });
      }
    })();
  });
}

main().catch((err: unknown) => {
  send({ type: 'error', message: err instanceof Error ? err.stack ?? err.message : String(err) });
  process.exitCode = 1;
});
