// Host agent registration, attestation, heartbeats, reverse probe and reclaim notices against a
// real nats-server and a real dockerd (R-H1, R-H2, R-H3, R-H5, R-H7). The control plane side is
// played by the test driver in test/support/agent.ts.
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { NatsConnection } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentSubjects } from '../../../src/core/agent-subjects.ts';
import { API_SHA } from '../../../src/gen/api-sha.ts';
import { CommandOutcome, ProbeEcho, ProbeEchoAck } from '../../../src/gen/sandboxfleet/v1/agent.ts';
import { destroyAll, startDockerHost, type DockerHost } from '../../support/docker.ts';
import { startTestNats, type TestNats } from '../../support/nats.ts';
import { provisionSandboxImage, type SandboxImage } from '../../support/sandbox-image.ts';
import {
  TEST_AGENT_SHA,
  ensureCheckpointStreams,
  heartbeats,
  notices,
  registrationResponder,
  sendCommand,
  spawnAgent,
  startAgent,
  type InProcessAgent,
  type RegistrationResponder,
} from '../../support/agent.ts';

let nats: TestNats | undefined;
let host: DockerHost | undefined;
let nc: NatsConnection;
let responder: RegistrationResponder;
let good: SandboxImage;
let old: SandboxImage;
let lying: SandboxImage;
const agents: InProcessAgent[] = [];

beforeAll(async () => {
  [nats, host] = await Promise.all([startTestNats(), startDockerHost({ name: 'agent-reg' })]);
  nc = await nats.connect('control-plane-driver');
  responder = registrationResponder(nc, { firstEpoch: 7 });
  good = await provisionSandboxImage([host.docker], { bridgeVersion: 4 });
  old = await provisionSandboxImage([host.docker], { bridgeVersion: 3 });
  lying = await provisionSandboxImage([host.docker], { bridgeVersion: 4, helperVersion: 3 });
});

afterAll(async () => {
  await Promise.allSettled(agents.map((a) => a.stop()));
  await nats?.cleanup();
  await destroyAll([host]);
});

async function agentOn(hostId: string, image: SandboxImage, overrides = {}): Promise<InProcessAgent> {
  const a = await startAgent(await nats!.connect(hostId), { hostId, natsUrl: nats!.server.url, host: host!, imageRef: image.reference, overrides });
  agents.push(a);
  return a;
}

describe('host agent registration (R-H1, R-H2)', () => {
  it('attests build, API, engine, image id and a proven live-bridge 4/4, and gets its epoch', async () => {
    const hb = heartbeats(nc, 'reg-good');
    const a = await agentOn('reg-good', good);
    const reg = responder.registrations.find((r) => r.hostId === 'reg-good')!;
    expect(reg.attestation).toMatchObject({
      agentBuildSha: TEST_AGENT_SHA,
      apiSha: API_SHA,
      storageDriver: 'overlay2',
      imageRef: good.reference,
      imageDigest: good.imageId,
      bridge: { helperVersion: '4', labelVersion: '4', agree: true, claimedVersion: '4' },
    });
    expect(reg.attestation!.engineVersion).toMatch(/^\d+\.\d+/);
    expect(reg.agentInstanceId).toBe(a.agent.instanceId);
    expect(a.agent.epoch).toBe(7);

    // R-H3: heartbeats with epoch, growing sequence, inventory and capacity.
    const first = await hb.waitFor((h) => h.sequence >= 2, 10_000);
    expect(first).toMatchObject({ hostId: 'reg-good', hostEpoch: 7, dockerDataLost: false });
    expect(first.inventory).toBeDefined();
    expect(first.inventory!.containers).toEqual([]);
    expect(first.capacity!.maxMembers).toBe(64);
    expect(first.capacity!.diskFreeBytes).toBeGreaterThan(0);
    const seqs = hb.items.map((h) => h.sequence);
    expect([...seqs].sort((x, y) => x - y)).toEqual(seqs);
    await hb.stop();
  });

  it('reports an old helper image truthfully as 3/3 (agreement is not admission)', async () => {
    await agentOn('reg-old', old);
    const reg = responder.registrations.find((r) => r.hostId === 'reg-old')!;
    expect(reg.attestation!.bridge).toMatchObject({ helperVersion: '3', labelVersion: '3', agree: true, claimedVersion: '3' });
    expect(reg.attestation!.imageDigest).toBe(old.imageId);
  });

  it('reports a label/helper disagreement as such and claims nothing', async () => {
    await agentOn('reg-lying', lying);
    const reg = responder.registrations.find((r) => r.hostId === 'reg-lying')!;
    expect(reg.attestation!.bridge).toMatchObject({ helperVersion: '3', labelVersion: '4', agree: false, claimedVersion: '' });
  });

  it('refuses to start when the configured data root is not the engine data root (a wrong mount would make every layer look missing)', async () => {
    const err = await agentOn('reg-wrong-root', good, { dockerDataRoot: '/var/lib/not-this-engine' }).then(() => undefined, (e: unknown) => e);
    expect(err).toMatchObject({ name: 'HostAgentError', reason: 'data_root_mismatch' });
    expect(responder.registrations.some((r) => r.hostId === 'reg-wrong-root')).toBe(false);
    // The same path spelled with a trailing slash is the same directory.
    await agentOn('reg-right-root', good, { dockerDataRoot: `${host!.dataRoot}/` });
    expect(responder.registrations.some((r) => r.hostId === 'reg-right-root')).toBe(true);
  });
});

/**
 * The control plane's side of the reverse probe, answering each echo only after `holdMs`, and
 * noting how long it really held each one: the round trip the agent reports must contain that hold.
 */
function slowProbeResponder(hostId: string, replica: string, holdMs: number): { echoes: ProbeEcho[]; heldMs: number[]; stop(): Promise<void> } {
  const echoes: ProbeEcho[] = [];
  const heldMs: number[] = [];
  const sub = nc.subscribe(AgentSubjects.probeCallback(hostId), {
    callback: (_err, msg) => {
      const received = performance.now();
      const echo = ProbeEcho.decode(msg.data);
      echoes.push(echo);
      setTimeout(() => {
        heldMs.push(performance.now() - received);
        msg.respond(ProbeEchoAck.encode({ nonce: echo.nonce, replica, receivedAtUnixMs: Date.now() }).finish());
      }, holdMs);
    },
  });
  return { echoes, heldMs, stop: () => sub.drain() };
}

describe('commands at the host scope', () => {
  it('answers the reverse probe with the round trip it measured (R-H7)', async () => {
    const pr = slowProbeResponder('reg-good', 'cp-1', 400);
    const sent = performance.now();
    const res = await sendCommand(nc, { hostId: 'reg-good', epoch: 7 }, { $case: 'probe', value: { nonce: 'n-123', callbackSubject: AgentSubjects.probeCallback('reg-good') } });
    const wholeCommandMs = performance.now() - sent;
    expect(res.outcome).toBe(CommandOutcome.OK);
    expect(res.result?.$case).toBe('probe');
    const probe = res.result!.$case === 'probe' ? res.result!.value : undefined;
    expect(probe).toMatchObject({ nonce: 'n-123', callbackOk: true, answeredBy: 'cp-1' });
    // The round trip is measured, not made up: it holds the time the control plane sat on the echo,
    // and fits inside the whole command as timed from here.
    expect(pr.heldMs).toHaveLength(1);
    expect(probe!.callbackRoundTripMs).toBeGreaterThanOrEqual(Math.floor(pr.heldMs[0]!));
    expect(probe!.callbackRoundTripMs).toBeLessThanOrEqual(Math.ceil(wholeCommandMs));
    expect(pr.echoes[0]).toMatchObject({ hostId: 'reg-good', hostEpoch: 7, nonce: 'n-123', agentBuildSha: TEST_AGENT_SHA, apiSha: API_SHA });
    await pr.stop();
  });

  it('refuses a probe to a subject that is not a probe subject', async () => {
    const res = await sendCommand(nc, { hostId: 'reg-good', epoch: 7 }, { $case: 'probe', value: { nonce: 'n', callbackSubject: 'sf.agent.register' } });
    expect(res.outcome).toBe(CommandOutcome.FAILED);
    expect(res.reason).toBe('probe_failed');
  });

  it('refuses a command of another epoch with the reason and counts it (R-H6)', async () => {
    const a = agents.find((x) => x.agent.lastAck?.hostId === 'reg-good')!;
    const stale = await sendCommand(nc, { hostId: 'reg-good', epoch: 6 }, { $case: 'inventory', value: { groupId: '' } });
    expect(stale).toMatchObject({ outcome: CommandOutcome.REFUSED, reason: 'stale_epoch', hostEpoch: 7 });
    const future = await sendCommand(nc, { hostId: 'reg-good', epoch: 8 }, { $case: 'inventory', value: { groupId: '' } });
    expect(future).toMatchObject({ outcome: CommandOutcome.REFUSED, reason: 'unknown_epoch' });
    const text = await a.metrics.registry.getSingleMetricAsString('sandboxfleet_fenced_reports_total');
    expect(text).toContain('kind="agent_command_stale_epoch"} 1');
    const ok = await sendCommand(nc, { hostId: 'reg-good', epoch: 7 }, { $case: 'inventory', value: { groupId: '' } });
    expect(ok.outcome).toBe(CommandOutcome.OK);
    expect(ok.result?.$case).toBe('inventory');
  });
});

describe('going away (R-H5)', () => {
  it('publishes a reclaim notice under its epoch when the notice file appears, and keeps it in heartbeats', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'sf-notice-'));
    const file = join(dir, 'reclaim');
    const n = notices(nc, 'reg-spot');
    const hb = heartbeats(nc, 'reg-spot');
    const a = await agentOn('reg-spot', good, { reclaimNoticeFile: file });
    writeFileSync(file, JSON.stringify({ source: 'spot', deadlineUnixMs: 1_900_000_000_000 }));
    const notice = await n.waitFor(() => true, 10_000);
    // R-H6: the notice names the epoch it was sent under, so a revoked epoch's notice can be fenced.
    expect(notice).toEqual({ source: 'spot', deadlineUnixMs: 1_900_000_000_000, hostEpoch: a.agent.epoch });
    expect(notice.hostEpoch).toBeGreaterThan(0);
    const beat = await hb.waitFor((h) => h.reclaimNotice?.source === 'spot', 10_000);
    expect(beat.reclaimNotice?.hostEpoch).toBe(beat.hostEpoch);
    await Promise.all([n.stop(), hb.stop()]);
  });

  it('a notice file cannot claim docker_data_lost (only the agent itself finds that): it is a spot notice', async () => {
    const file = join(mkdtempSync(join(tmpdir(), 'sf-notice-')), 'reclaim');
    const n = notices(nc, 'reg-claim');
    await agentOn('reg-claim', good, { reclaimNoticeFile: file });
    writeFileSync(file, JSON.stringify({ source: 'docker_data_lost' }));
    expect((await n.waitFor(() => true, 10_000)).source).toBe('spot');
    await n.stop();
  });

  it('runs as a process: registers, SIGUSR2 is a preemption notice, SIGTERM stops it gracefully', async () => {
    const hb = heartbeats(nc, 'reg-proc');
    const n = notices(nc, 'reg-proc');
    const registered = responder.next('reg-proc');
    await ensureCheckpointStreams(nc);
    const child = spawnAgent({ hostId: 'reg-proc', natsUrl: nats!.server.url, host: host!, imageRef: good.reference });
    try {
      const reg = await registered;
      expect(reg.attestation!.bridge!.agree).toBe(true);
      await hb.waitFor(() => true, 20_000);
      child.kill('SIGUSR2');
      expect(await n.waitFor(() => true, 10_000)).toMatchObject({ source: 'preemption', hostEpoch: responder.epochs.get('reg-proc') });
      child.kill('SIGTERM');
      expect(await child.exited).toBe(0);
      expect(child.output()).toContain('host agent stopped');
    } finally {
      child.kill('SIGKILL');
      await Promise.all([hb.stop(), n.stop()]);
    }
  });

  it('keeps retrying registration until a control plane answers', async () => {
    await responder.stop();
    const pending = agentOn('reg-late', good);
    await new Promise((r) => setTimeout(r, 2500));
    const late = registrationResponder(nc, { firstEpoch: 3 });
    const a = await pending;
    expect(a.agent.epoch).toBe(3);
    const text = await a.metrics.registry.getSingleMetricAsString('sandboxfleet_agent_registrations_total');
    expect(text).toMatch(/result="error"} [1-9]/);
    await late.stop();
  });
});
