// Bounded restore before extraction (issue #11 item 3) on real parts: a real dockerd host, a real
// nats-server, the real host agent (in-process) and GNU tar. A hostile layer must be refused in the
// validation pass, BEFORE anything is written (no container, no staging dir, GNU tar never asked to
// extract), with a precise machine-readable reason in the command result, while the agent's
// heartbeats stay on time. The agent-level cases use the default limits; the configured limits
// (entry bomb, size bomb) and the per-host chunk cache are driven through CheckpointOps with a
// parsed agent configuration on the same real engine and store; so are version-2 checkpoints (issue
// #17: a checkpoint reads only what changed since the last one of the container on this host).
// The 1,000,000-entry and 1 GiB figures come from bench/restore-bounds/run.ts, not from here.
import { appendFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { pino } from 'pino';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import type { NatsConnection } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it, onTestFinished, vi } from 'vitest';
import { DockerRuntime } from '../../../src/docker/runtime.ts';
import { CommandOutcome, Heartbeat } from '../../../src/gen/sandboxfleet/v1/agent.ts';
import { CliKind } from '../../../src/gen/sandboxfleet/v1/common.ts';
import { CaptureIndexStore } from '../../../src/host-agent/layer/capture-index.ts';
import { CheckpointOps } from '../../../src/host-agent/checkpoint-ops.ts';
import { CommandError } from '../../../src/host-agent/command-error.ts';
import { layerRestoreSettingsOf, parseHostAgentConfig, type HostAgentConfigInput } from '../../../src/host-agent/config.ts';
import { GroupOps } from '../../../src/host-agent/group-ops.ts';
import { FleetMetrics } from '../../../src/observability/metrics.ts';
import { ChunkStore } from '../../../src/store/chunk-store.ts';
import { AgentSubjects } from '../../../src/core/agent-subjects.ts';
import { restoreFaultScope } from '../../../src/wire/agent-protocol.ts';
import { Collector, TEST_AGENT_SHA, registrationResponder, sendCommand, startAgent, type InProcessAgent } from '../../support/agent.ts';
import { destroyAll, startDockerHosts, type DockerHost } from '../../support/docker.ts';
import { startTestNats, type TestNats } from '../../support/nats.ts';
import { provisionSandboxImage, type SandboxImage } from '../../support/sandbox-image.ts';
import { BRIDGE, CLEAN_STOP, entryBomb, filesLayer, header, recordTarInvocations, stagingDirs, storeLayerBytes, testManifest, wireManifest } from './restore-fixtures.ts';

const HOST = 'host-t';
const HEARTBEAT_MS = 250;
const MiB = 1024 * 1024;

let nats: TestNats | undefined;
let host: DockerHost | undefined;
let nc: NatsConnection;
let store: ChunkStore;
let image: SandboxImage;
let agent: InProcessAgent | undefined;
let tar: ReturnType<typeof recordTarInvocations>;
const scratch = mkdtempSync(join(tmpdir(), 'sf-restore-bounds-'));

beforeAll(async () => {
  tar = recordTarInvocations(); // before any worker or child starts: they copy PATH then
  const [n, hosts] = await Promise.all([startTestNats(), startDockerHosts(1)]);
  nats = n;
  [host] = hosts;
  nc = await nats.connect('control-plane-driver');
  store = await ChunkStore.open(nc);
  registrationResponder(nc, { firstEpoch: 1 });
  image = await provisionSandboxImage([host!.docker], { bridgeVersion: BRIDGE });
  agent = await startAgent(await nats.connect(HOST), { hostId: HOST, natsUrl: nats.server.url, host: host!, imageRef: image.reference, overrides: { heartbeatIntervalMs: HEARTBEAT_MS } });
});

afterAll(async () => {
  await agent?.stop();
  await nats?.cleanup();
  await destroyAll([host]);
  rmSync(scratch, { recursive: true, force: true });
});

async function restoreOnAgent(groupId: string, manifest: ReturnType<typeof testManifest>) {
  return sendCommand(nc, { hostId: HOST, epoch: agent!.agent.epoch!, generation: 1 }, { $case: 'restore', value: { groupId, manifest: wireManifest(manifest, image.reference) } });
}

/** Longest gap between heartbeats received while `run` ran, the beats just before and after included. */
async function longestHeartbeatGap<T>(run: () => Promise<T>): Promise<{ result: T; gapMs: number; beats: number }> {
  const beats = new Collector(nc, AgentSubjects.heartbeat(HOST), (b) => ({ at: performance.now(), seq: Heartbeat.decode(b).sequence }));
  try {
    await beats.waitFor(() => true, 10_000);
    const result = await run();
    const end = performance.now();
    await beats.waitFor((b) => b.at > end, 10_000);
    const times = beats.items.map((b) => b.at);
    let gapMs = 0;
    for (let i = 1; i < times.length; i++) gapMs = Math.max(gapMs, times[i]! - times[i - 1]!);
    return { result, gapMs, beats: times.length };
  } finally {
    await beats.stop();
  }
}

describe('the host agent refuses a hostile layer before extracting anything', () => {
  it('a 100,000-entry layer whose last entry is `../escaped`: REFUSED layer_path_invalid, nothing created or written, heartbeats on time', async () => {
    const groupId = 'g-escape';
    const layer = await storeLayerBytes(store, entryBomb(100_000, [header('../escaped', 'file')]));
    const manifest = testManifest(groupId, 'cp-1', layer, image.imageId);
    await store.putManifest(manifest);
    tar.clear();

    const { result, gapMs, beats } = await longestHeartbeatGap(() => restoreOnAgent(groupId, manifest));

    expect(result).toMatchObject({ outcome: CommandOutcome.REFUSED, reason: 'layer_path_invalid' });
    expect(restoreFaultScope(result.reason)).toBe('checkpoint'); // the control plane ends the group, no retry elsewhere
    expect(result.message).toContain('path_traversal');
    expect(result.message).toContain('../escaped');
    expect(result.message).toContain('member m1');
    // Nothing was written: no container (so no upper dir), no staging dir, GNU tar never extracted.
    expect(await new DockerRuntime(host!.docker).listMembers(groupId)).toEqual([]);
    expect(stagingDirs(host!.dataRoot)).toEqual([]);
    expect(tar.extractions()).toEqual([]);
    // Never more than one heartbeat interval late (a beat at most two intervals after the previous).
    console.log(`[restore-bounds] 100k-entry refusal: longest heartbeat gap ${gapMs.toFixed(0)} ms over ${beats} beats (interval ${HEARTBEAT_MS} ms)`);
    expect(gapMs).toBeLessThanOrEqual(2 * HEARTBEAT_MS);
  });

  it('keeps the precise reason for a layer digest that does not match its chunks and for a missing chunk', async () => {
    const layer = await storeLayerBytes(store, filesLayer([3 * MiB]));
    const wrongDigest = testManifest('g-digest', 'cp-1', { ...layer, digest: `sha256:${'0'.repeat(64)}` }, image.imageId);
    await store.putManifest(wrongDigest);
    const r1 = await restoreOnAgent('g-digest', wrongDigest);
    expect(r1).toMatchObject({ outcome: CommandOutcome.REFUSED, reason: 'layer_digest_mismatch' });

    const missing = testManifest('g-missing', 'cp-1', { ...layer, chunks: [...layer.chunks.slice(0, -1), { digest: `sha256:${'1'.repeat(64)}`, size: layer.chunks.at(-1)!.size }] }, image.imageId);
    await store.putManifest(missing);
    const r2 = await restoreOnAgent('g-missing', missing);
    expect(r2).toMatchObject({ outcome: CommandOutcome.REFUSED, reason: 'chunk_missing' });
    expect(r2.message).toContain('1111');
    for (const g of ['g-digest', 'g-missing']) expect(await new DockerRuntime(host!.docker).listMembers(g)).toEqual([]);
    expect(tar.extractions()).toEqual([]);
  });

  it('restores a valid layer through both passes', async () => {
    const groupId = 'g-valid';
    const layer = await storeLayerBytes(store, filesLayer([2 * MiB, 100, 0]));
    const manifest = testManifest(groupId, 'cp-1', layer, image.imageId);
    await store.putManifest(manifest);
    tar.clear();
    const r = await restoreOnAgent(groupId, manifest);
    expect(r).toMatchObject({ outcome: CommandOutcome.OK, reason: '' });
    expect(tar.extractions()).toHaveLength(1);
    const [c] = await new DockerRuntime(host!.docker).listMembers(groupId);
    expect(readdirSync(join(c!.upperDir!, 'data')).sort()).toEqual(['file-0.bin', 'file-1.bin', 'file-2.bin']);
    expect(stagingDirs(host!.dataRoot)).toEqual([]);
  });
});

describe('configured limits and the chunk cache (CheckpointOps on the same engine and store)', () => {
  const cacheDir = join(scratch, 'cache');
  const opsWith = (overrides: Partial<HostAgentConfigInput>, logs?: Record<string, unknown>[]) => {
    const config = parseHostAgentConfig({ hostId: HOST, natsUrl: nats!.server.url, imageRef: image.reference, agentSha: TEST_AGENT_SHA, dockerSocket: host!.socketPath, layerCacheDir: cacheDir, layerCacheMaxBytes: 64 * MiB, ...overrides });
    const logger = logs === undefined ? undefined : pino({ level: 'info' }, { write: (line: string) => void logs.push(JSON.parse(line) as Record<string, unknown>) });
    const runtime = new DockerRuntime(host!.docker);
    const metrics = new FleetMetrics();
    const ops = new CheckpointOps({
      runtime,
      store,
      groups: new GroupOps({ runtime, config, imageId: () => image.imageId, nowMs: Date.now }),
      metrics,
      hostId: HOST,
      epoch: () => 1,
      imageId: () => image.imageId,
      imageRef: image.reference,
      bridgeVersion: () => BRIDGE,
      nowMs: Date.now,
      workerConnection: { servers: nats!.server.url },
      layerRestore: layerRestoreSettingsOf(config),
      logger,
    });
    return { ops, metrics };
  };
  const refusal = async (p: Promise<unknown>): Promise<CommandError> => {
    const err = await p.then(
      () => undefined,
      (e: unknown) => e,
    );
    if (!(err instanceof CommandError)) throw new Error(`expected a CommandError, got ${String(err)}`);
    return err;
  };
  const restoreCmd = (groupId: string, manifest: ReturnType<typeof testManifest>) => ({ groupId, manifest: wireManifest(manifest, image.reference) });

  it('an entry bomb one over SANDBOXFLEET_LAYER_MAX_ENTRIES is REFUSED layer_entry_limit before anything is created or extracted', async () => {
    const { ops } = opsWith({ layerMaxEntries: 20_000 });
    const layer = await storeLayerBytes(store, entryBomb(20_001));
    const manifest = testManifest('g-bomb', 'cp-1', layer, image.imageId);
    await store.putManifest(manifest);
    tar.clear();
    const err = await refusal(ops.restore(restoreCmd('g-bomb', manifest), 1));
    expect(err).toMatchObject({ outcome: CommandOutcome.REFUSED, reason: 'layer_entry_limit' });
    expect(err.message).toContain('more than 20000 entries');
    expect(tar.extractions()).toEqual([]);
    expect(await new DockerRuntime(host!.docker).listMembers('g-bomb')).toEqual([]);
    expect(stagingDirs(host!.dataRoot)).toEqual([]);
    // The same layer within the limit restores (the bound is the configured one, not a constant).
    const { ops: roomy } = opsWith({ layerMaxEntries: 20_001 });
    const ok = await roomy.restore(restoreCmd('g-bomb', manifest), 1);
    expect(ok.verified).toBe(true);
    expect(tar.extractions()).toHaveLength(1);
  });

  it('a layer above SANDBOXFLEET_LAYER_MAX_BYTES is REFUSED layer_size_limit (declared size at once, data in the scan)', async () => {
    const { ops } = opsWith({ layerMaxBytes: MiB });
    const layer = await storeLayerBytes(store, filesLayer([MiB / 2, MiB / 2 + 1]));
    const manifest = testManifest('g-size', 'cp-1', layer, image.imageId);
    await store.putManifest(manifest);
    tar.clear();
    const err = await refusal(ops.restore(restoreCmd('g-size', manifest), 1));
    expect(err).toMatchObject({ outcome: CommandOutcome.REFUSED, reason: 'layer_size_limit' });
    expect(err.message).toContain('layer_too_large');
    const { ops: tiny } = opsWith({ layerMaxBytes: 1000 });
    const declared = await refusal(tiny.restore(restoreCmd('g-size', manifest), 1));
    expect(declared).toMatchObject({ outcome: CommandOutcome.REFUSED, reason: 'layer_size_limit' });
    expect(tar.extractions()).toEqual([]);
    expect(await new DockerRuntime(host!.docker).listMembers('g-size')).toEqual([]);
  });

  it('version-2 checkpoints: the second reads only what changed (index saved after the manifest), and each restores', async () => {
    const indexDir = join(scratch, 'index');
    const logs: Record<string, unknown>[] = [];
    const { ops } = opsWith({ layerManifestVersion: 2, layerIndexDir: indexDir }, logs);
    // A member holding a layer, restored from a version-1 checkpoint: old manifests stay readable.
    const layer = await storeLayerBytes(store, filesLayer([2 * MiB, 3000, 50_000]));
    const v1 = testManifest('g-incr', 'cp-0', layer, image.imageId);
    await store.putManifest(v1);
    expect((await ops.restore(restoreCmd('g-incr', v1), 1)).verified).toBe(true);
    const [member] = await new DockerRuntime(host!.docker).listMembers('g-incr');
    const upper = member!.upperDir!;
    const cmd = (checkpointId: string) => ({ groupId: 'g-incr', checkpointId, members: [{ memberId: 'm1', kind: CliKind.CLAUDE_CODE, savedLocator: '', nativeSessionPaths: [] }], cleanStop: CLEAN_STOP, activityVersion: 1, lastCompletedTurnId: '', maxManifestSchemaVersion: 2 });
    const captured = (): Record<string, unknown> => logs.filter((l) => l.msg === 'member layer captured').at(-1)!;
    // Past the racy margin: the files were written by the restore a moment ago.
    await new Promise((r) => setTimeout(r, 2_100));
    const first = await ops.checkpoint(cmd('cp-1'), 1);
    expect(first.schemaVersion).toBe(2);
    expect(captured()).toMatchObject({ mode: 'full', reason: 'no index of a previous capture' });
    const indexes = new CaptureIndexStore(indexDir);
    expect((await indexes.load('g-incr', 'm1', member!.id))?.capturesSinceFull).toBe(0);
    // A conversation turn appends to one file: only it (its prefix hashed, not stored again) is read.
    appendFileSync(join(upper, 'data/file-2.bin'), 'one more line\n');
    const second = await ops.checkpoint(cmd('cp-2'), 1);
    expect(captured()).toMatchObject({ mode: 'incremental', readEntries: 1 });
    expect(captured().reusedEntries).toBe((captured().walkedEntries as number) - 1);
    expect((await indexes.load('g-incr', 'm1', member!.id))?.capturesSinceFull).toBe(1);
    // Both restore (a new generation each), the second with the appended line.
    for (const [generation, m] of [[2, first], [3, second]] as const) {
      const out = await ops.restore({ groupId: 'g-incr', manifest: m }, generation);
      expect(out.verified).toBe(true);
      const c = (await new DockerRuntime(host!.docker).listMembers('g-incr')).find((x) => x.member?.placementGeneration === generation)!;
      expect(readFileSync(join(c.upperDir!, 'data/file-0.bin')).equals(readFileSync(join(upper, 'data/file-0.bin')))).toBe(true);
      expect(readFileSync(join(c.upperDir!, 'data/file-2.bin'), 'latin1').endsWith('one more line\n')).toBe(generation === 3);
    }
    // A control plane older than max_manifest_schema_version (0) verifies version 1 only: it gets
    // version 1, a full read, though this agent would write 2.
    const old = await ops.checkpoint({ ...cmd('cp-3'), maxManifestSchemaVersion: 0 }, 1);
    expect(old.schemaVersion).toBe(1);
    expect(captured()).toMatchObject({ mode: 'full', why: 'version_1' });
    expect((await ops.restore({ groupId: 'g-incr', manifest: old }, 4)).verified).toBe(true);
  });

  it('once it knows the overlay2 root, the agent extracts there while creating the container; stale staging dirs of its host are removed first', async () => {
    const layer = await storeLayerBytes(store, filesLayer([3 * MiB, 1000]));
    const manifest = testManifest('g-early', 'cp-1', layer, image.imageId);
    await store.putManifest(manifest);
    const root = join((await host!.docker.info()).DockerRootDir as string, 'overlay2');
    const mine = join(root, `.sf-restore-${HOST}-0123456789ab`);
    const theirs = join(root, '.sf-restore-other-host-0123456789ab');
    for (const d of [mine, theirs]) mkdirSync(join(d, 'half-extracted'), { recursive: true });
    onTestFinished(() => rmSync(theirs, { recursive: true, force: true })); // no agent of this engine removes it
    const { ops } = opsWith({});
    expect(await ops.stagingParent()).toBeUndefined();
    // What is in the overlay2 root while the container is being created (made slow here).
    const seenDuringCreate: string[][] = [];
    const create = DockerRuntime.prototype.createMember;
    const spy = vi.spyOn(DockerRuntime.prototype, 'createMember').mockImplementation(async function (this: DockerRuntime, ...args: Parameters<typeof create>) {
      const made = await create.apply(this, args);
      await new Promise((r) => setTimeout(r, 1_000));
      seenDuringCreate.push(readdirSync(root).filter((n) => n.startsWith(`.sf-restore-${HOST}-`) && join(root, n) !== mine));
      return made;
    });
    onTestFinished(() => spy.mockRestore());
    for (const generation of [1, 2]) {
      expect((await ops.restore(restoreCmd('g-early', manifest), generation)).verified).toBe(true);
      // Learned from the first container: the second restore extracted there, the first next to its upper dir.
      expect(await ops.stagingParent()).toBe(root);
      const c = (await new DockerRuntime(host!.docker).listMembers('g-early')).find((m) => m.member?.placementGeneration === generation)!;
      expect(readdirSync(join(c.upperDir!, 'data')).sort()).toEqual(['file-0.bin', 'file-1.bin']);
      expect(readdirSync(dirname(c.upperDir!)).filter((n) => n.includes('restore'))).toEqual([]);
    }
    // The first restore extracted after its create; the second during it, in the overlay2 root.
    expect(seenDuringCreate[0]).toEqual([]);
    expect(seenDuringCreate[1]).toHaveLength(1);
    expect(existsSync(mine)).toBe(false);
    expect(existsSync(theirs)).toBe(true);
    expect(readdirSync(root).filter((n) => n.startsWith(`.sf-restore-${HOST}-`))).toEqual([]);
  });

  it('the extraction pass reads the chunk cache the validation pass filled; a group coming back fetches nothing; a corrupt cached chunk is fetched again', async () => {
    const layer = await storeLayerBytes(store, filesLayer([4 * MiB, 1000]));
    const manifest = testManifest('g-cache', 'cp-1', layer, image.imageId);
    await store.putManifest(manifest);
    const bytes = async (metrics: FleetMetrics, kind: string): Promise<number> => (await metrics.checkpointBytes.get()).values.find((v) => v.labels.kind === kind)?.value ?? 0;

    const first = opsWith({});
    expect((await first.ops.restore(restoreCmd('g-cache', manifest), 1)).verified).toBe(true);
    expect(await bytes(first.metrics, 'restore_fetched')).toBe(layer.size);
    expect(await bytes(first.metrics, 'restore_cached')).toBe(0);
    await first.ops.cacheFilled(); // the chunks kept in memory are cached after the answer

    // The group returns to this host (a new generation): every chunk comes from the cache.
    const second = opsWith({});
    expect((await second.ops.restore(restoreCmd('g-cache', manifest), 2)).verified).toBe(true);
    expect(await bytes(second.metrics, 'restore_fetched')).toBe(0);
    expect(await bytes(second.metrics, 'restore_cached')).toBe(layer.size);

    // A cached chunk damaged on disk is never used: it is fetched from the store again.
    const victim = layer.chunks[0]!.digest.slice(7);
    writeFileSync(join(cacheDir, 'sha256', victim.slice(0, 2), victim), 'not the chunk');
    const third = opsWith({});
    const out = await third.ops.restore(restoreCmd('g-cache', manifest), 3);
    expect(out.verified).toBe(true);
    expect(await bytes(third.metrics, 'restore_fetched')).toBe(layer.chunks[0]!.size);
    const c = (await new DockerRuntime(host!.docker).listMembers('g-cache')).find((m) => m.member?.placementGeneration === 3)!;
    expect(readdirSync(join(c.upperDir!, 'data')).sort()).toEqual(['file-0.bin', 'file-1.bin']);
  });
});
