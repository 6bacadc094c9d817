// Shared set-up of the pinned-CLI request-history tests: a real fleet (NATS, two dockerd hosts, the
// control plane) whose sandbox image carries the CLI, host-a's agent running with host networking
// (the CLIs reach the loopback fake model API), the runner gRPC API over mTLS with a runner SDK
// client, and the fake. host-b's agent is started by `drainToHostB`, the migration step.
import { rm } from 'node:fs/promises';
import { expect } from 'vitest';
import { ApiServer } from '../../../src/api/runner-server.ts';
import type { ControlPlaneConfig } from '../../../src/config/control-plane.ts';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { DockerRuntime } from '../../../src/docker/runtime.ts';
import { ContextState } from '../../../src/gen/sandboxfleet/v1/common.ts';
import type { BeginTurnResponse } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { RunnerClient, RunnerError } from '../../../src/runner-sdk/index.ts';
import { createTestPki, type TestPki } from '../../support/certs.ts';
import { ackMarker, startFakeModelApi, type FakeModelApi, type ReplyScript } from '../../support/fake-model-api.ts';
import type { SandboxImageSpec } from '../../support/sandbox-image.ts';
import { startFleet, type Fleet } from '../control-plane/fleet-harness.ts';

const AGENT = { memberNetworkMode: 'host' };

export interface HistoryFleet {
  readonly fleet: Fleet;
  readonly plane: ControlPlane;
  readonly runner: RunnerClient;
  readonly api: FakeModelApi;
  /** The Docker runtime of the host a member runs on. */
  runtimeOf(hostId: string): DockerRuntime;
  /** Stop the group, start host-b, drain host-a, and wait until the group is STOPPED on host-b. */
  drainToHostB(groupId: string): Promise<void>;
  /**
   * Unplanned loss (R-G6): the group must be cleanly STOPPED with its checkpoint. Start host-b, then
   * kill host-a (agent gone, dockerd stopped, data root deleted) and wait until the group is restored
   * and STOPPED on host-b.
   */
  killHostAAndRestoreOnB(groupId: string): Promise<void>;
  /**
   * The migration case every CLI shares (R-G3, R-G5): drain the group to host-b, run `turn('MARK-FOUR')`
   * there, and expect RESTORED on host-b under the saved locator, the CLI reporting that same session
   * (`observed`), and the model API receiving the first three turns' history once, in order (`sent`).
   */
  expectSameSessionAfterDrain<T extends { readonly begun: BeginTurnResponse }>(groupId: string, turn: (marker: string) => Promise<T>, observed: (t: T) => string | undefined, sent: (t: T) => string[]): Promise<void>;
  /** R-S2/R-S3: a BeginTurn naming another locator is refused `locator_mismatch`; the saved one stays, no turn begins. */
  expectLocatorChangeRefusedAtBegin(groupId: string, memberId: string): Promise<void>;
  cleanup(): Promise<void>;
}

/**
 * `config`: control-plane settings that depend on the fake's URL — e.g. the CLI profiles RunTurn
 * runs the CLIs with (binary, and the environment that points them at the fake).
 */
export async function startHistoryFleet(image: SandboxImageSpec, options: {
  config?: (apiUrl: string) => Partial<ControlPlaneConfig>;
  /** Host-agent settings besides host networking, e.g. the member commands that start a CLI behind the live bridge. */
  agent?: (apiUrl: string) => Record<string, unknown>;
  /** How the fake model API answers (default: `ack <marker>`). */
  reply?: ReplyScript;
} = {}): Promise<HistoryFleet> {
  const api = await startFakeModelApi(options.reply ?? ackMarker);
  let fleet: Fleet | undefined;
  let pki: TestPki | undefined;
  let server: ApiServer | undefined;
  let runner: RunnerClient | undefined;
  const cleanup = async (): Promise<void> => {
    runner?.close();
    await server?.shutdown(1_000);
    await fleet?.cleanup();
    await pki?.cleanup();
    await api.close();
  };
  try {
    [fleet, pki] = await Promise.all([startFleet(2, options.config?.(api.url) ?? {}, { image }), createTestPki()]);
    const f = fleet;
    const plane = await f.startPlane();
    const agent = { ...AGENT, ...(options.agent?.(api.url) ?? {}) };
    await f.startAgentOn('host-a', 0, agent);
    await f.waitFor('host-a READY', async () => ((await f.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
    server = await ApiServer.start({ runner: plane.runner, exec: plane.exec, address: '127.0.0.1:0', security: { mode: 'mtls', mtls: { ca: pki.ca, cert: pki.server.cert, key: pki.server.key } } });
    const client = new RunnerClient({ address: `127.0.0.1:${server.port}`, tls: { ca: pki.ca, cert: pki.runner.cert, key: pki.runner.key }, deadlineMs: 120_000 });
    runner = client;
    const h: HistoryFleet = {
      fleet: f,
      plane,
      runner: client,
      api,
      runtimeOf: (hostId) => new DockerRuntime(f.hosts.find((h) => h.name === hostId)!.docker),
      async drainToHostB(groupId) {
        await client.stopGroup({ groupId });
        await f.startAgentOn('host-b', 1, agent);
        await f.waitFor('host-b READY', async () => ((await f.host('host-b')).lifecycle.state === 'READY' ? true : undefined));
        expect(await plane.drainHost('host-a')).toBe(true);
        await f.waitFor('group moved to host-b', async () => {
          const g = await f.group(groupId);
          if (g.lifecycle.state === 'LOST') throw new Error(`group LOST: ${g.lifecycle.lostReason}`);
          return g.lifecycle.state === 'STOPPED' && g.lifecycle.hostId === 'host-b' && g.evacuation === undefined ? true : undefined;
        }, 120_000);
      },
      async killHostAAndRestoreOnB(groupId) {
        const g = await f.group(groupId);
        expect(g.lifecycle).toMatchObject({ state: 'STOPPED', hostId: 'host-a' });
        expect(g.latestCheckpointId).toBeTruthy();
        if (!f.agents.has('host-b')) {
          await f.startAgentOn('host-b', 1, agent);
          await f.waitFor('host-b READY', async () => ((await f.host('host-b')).lifecycle.state === 'READY' ? true : undefined));
        }
        await f.stopAgent('host-a');
        await f.hosts[0]!.stop();
        await rm(f.hosts[0]!.dataRoot, { recursive: true, force: true });
        await f.waitFor('group restored on host-b', async () => {
          const now = await f.group(groupId);
          if (now.lifecycle.state === 'LOST') throw new Error(`group LOST: ${now.lifecycle.lostReason}`);
          return now.lifecycle.state === 'STOPPED' && now.lifecycle.hostId === 'host-b' && now.evacuation === undefined ? true : undefined;
        }, 120_000);
      },
      async expectSameSessionAfterDrain(groupId, turn, observed, sent) {
        const locator = (await client.getGroupState({ groupId })).group?.members[0]?.savedLocator;
        await h.drainToHostB(groupId);
        const t = await turn('MARK-FOUR');
        expect(t.begun).toMatchObject({ contextState: ContextState.RESTORED, hostId: 'host-b', locator });
        expect(observed(t)).toBe(locator);
        expect(sent(t)).toEqual(['user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO', 'assistant:MARK-TWO', 'user:MARK-THREE', 'assistant:MARK-THREE', 'user:MARK-FOUR']);
      },
      async expectLocatorChangeRefusedAtBegin(groupId, memberId) {
        const member = async () => (await client.getGroupState({ groupId })).group?.members.find((m) => m.memberId === memberId);
        const saved = (await member())?.savedLocator;
        expect(saved).toBeTruthy();
        const refused = await client.beginTurn({ groupId, memberId, locator: '00000000-0000-4000-8000-000000000000' }).then(() => undefined, (e: unknown) => e);
        expect(refused).toBeInstanceOf(RunnerError);
        expect((refused as RunnerError).reason).toBe('locator_mismatch');
        expect(await member()).toMatchObject({ savedLocator: saved, turnInFlightId: '' });
      },
      cleanup,
    };
    return h;
  } catch (err) {
    await cleanup();
    throw err;
  }
}
