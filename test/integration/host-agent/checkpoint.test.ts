// END TO END checkpoint migration (R-G2, R-G3, R-G5, R-H5) with real parts only: a member container
// on host A gets a writable layer with every kind of change a native CLI session can leave (new
// files with modes and owners, symlinks, hard links, deleted base files, an opaque directory, empty
// dirs, an xattr, and a Claude-Code-like session history holding the locator). Clean stop on A →
// checkpoint into the chunk store (manifest last) → host A's dockerd stopped and its data root
// DELETED (the agent reports the data loss) → restore on host B → the restored filesystem equals
// the original (docker export listings: path, type, mode, uid, gid, size, sha256, link target) →
// the cold-start check passed → the restored member starts and reads its session history.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import type { NatsConnection } from '@nats-io/transport-node';
import type Docker from 'dockerode';
import tar from 'tar-stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DockerRuntime } from '../../../src/docker/runtime.ts';
import { ChunkStore } from '../../../src/store/chunk-store.ts';
import { fromWireManifest, toWireManifest } from '../../../src/wire/checkpoint-manifest.ts';
import { CommandOutcome, type CheckpointManifest, type CleanStopEvidence } from '../../../src/gen/sandboxfleet/v1/agent.ts';
import { CliKind } from '../../../src/gen/sandboxfleet/v1/common.ts';
import { destroyAll, startDockerHosts, type DockerHost } from '../../support/docker.ts';
import { startTestNats, type TestNats } from '../../support/nats.ts';
import { provisionSandboxImage, type SandboxImage } from '../../support/sandbox-image.ts';
import { heartbeats, okValue, notices, registrationResponder, sendCommand, startAgent, type InProcessAgent } from '../../support/agent.ts';

const GROUP = 'g-e2e';
const SESSION = '3f2a9c1e-7b4d-4e8a-9c0f-2d6b1a5e8f70';
const HISTORY = `/home/agent/.claude/projects/-home-agent/${SESSION}.jsonl`;
const GONE = '/home/agent/.claude/projects/-home-agent/gone.jsonl';

let nats: TestNats | undefined;
let hostA: DockerHost | undefined;
let hostB: DockerHost | undefined;
let nc: NatsConnection;
let image: SandboxImage;
let agentA: InProcessAgent | undefined;
let agentB: InProcessAgent | undefined;
/** Added to the agents' clocks: a test moves it forward to pass a deadline in the middle of a command. */
let skewMs = 0;

beforeAll(async () => {
  const [n, hosts] = await Promise.all([startTestNats(), startDockerHosts(2)]);
  nats = n;
  [hostA, hostB] = hosts;
  nc = await nats.connect('control-plane-driver');
  registrationResponder(nc, { firstEpoch: 1 });
  image = await provisionSandboxImage([hostA!.docker, hostB!.docker], { bridgeVersion: 4 });
  const setup = (hostId: string, host: DockerHost) => ({ hostId, natsUrl: nats!.server.url, host, imageRef: image.reference, nowMs: () => Date.now() + skewMs });
  [agentA, agentB] = await Promise.all([startAgent(await nats.connect('host-a'), setup('host-a', hostA!)), startAgent(await nats.connect('host-b'), setup('host-b', hostB!))]);
});

afterAll(async () => {
  await Promise.allSettled([agentA?.stop(), agentB?.stop()]);
  await nats?.cleanup();
  await destroyAll([hostA, hostB]);
});

const ok = okValue;

const onA = (generation: number, command: Parameters<typeof sendCommand>[2], commandId?: string, deadlineUnixMs?: number) =>
  sendCommand(nc, { hostId: 'host-a', epoch: agentA!.agent.epoch!, generation, ...(commandId ? { commandId } : {}), ...(deadlineUnixMs !== undefined ? { deadlineUnixMs } : {}) }, command);
const onB = (generation: number, command: Parameters<typeof sendCommand>[2]) => sendCommand(nc, { hostId: 'host-b', epoch: agentB!.agent.epoch!, generation }, command);

/** Every path of a container's filesystem as `docker export` streams it, minus per-container engine files. */
async function listing(docker: Docker, containerId: string): Promise<Map<string, string>> {
  const skip = /^(dev|proc|sys)(\/|$)|^\.dockerenv$|^etc\/(hostname|hosts|resolv\.conf)$/;
  const out = new Map<string, string>();
  const extract = tar.extract();
  const done = new Promise<void>((resolve, reject) => {
    extract.on('entry', (h, stream, next) => {
      const hash = createHash('sha256');
      stream.on('data', (d: unknown) => void hash.update(d as Buffer));
      stream.on('end', () => {
        const path = h.name.replace(/^\.?\//, '').replace(/\/$/, '');
        if (path !== '' && !skip.test(path)) {
          out.set(path, [h.type, ((h.mode ?? 0) & 0o7777).toString(8), h.uid, h.gid, h.size, h.type === 'file' ? hash.digest('hex') : '', h.linkname ?? ''].join(' '));
        }
        next();
      });
      stream.resume();
    });
    extract.on('finish', resolve);
    extract.on('error', reject);
  });
  (await docker.getContainer(containerId).export()).pipe(extract);
  await done;
  return out;
}

/** The writable-layer changes a native CLI session might leave behind, made inside the container. */
const MUTATE = [
  'set -e',
  'mkdir -p /home/agent/.claude/projects/-home-agent',
  `printf '%s\\n' '{"type":"user","sessionId":"${SESSION}","message":"hi"}' '{"type":"assistant","sessionId":"${SESSION}","message":"hello"}' > ${HISTORY}`,
  'chown -R 1000:1000 /home/agent/.claude',
  'chmod 600 ' + HISTORY,
  'mkdir -p /work/sub/empty-dir /work/empty',
  'echo hello > /work/file.txt && chmod 640 /work/file.txt && chown 1000:1000 /work/file.txt',
  'printf "#!/bin/sh\\necho run\\n" > /work/run.sh && chmod 4750 /work/run.sh',
  'ln -s file.txt /work/link-rel && ln -s /etc/passwd /work/link-abs && ln -s missing /work/link-dangling',
  'ln /work/file.txt /work/hardlink',
  'rm /etc/group',
  'rm /bin/vi',
  'rm -rf /var && mkdir -p /var/lib/state && echo fresh > /var/lib/state/file && chmod 700 /var/lib/state',
  'mkdir -p /home/agent/.cache && chown 1000:1000 /home/agent/.cache && chmod 2775 /home/agent/.cache',
].join('\n');

describe('checkpoint on host A, restore on host B', () => {
  let sourceId: string;
  let sourceListing: Map<string, string>;
  let evidence: CleanStopEvidence;
  let manifest: CheckpointManifest;
  let badManifest: CheckpointManifest;
  let unnamedManifest: CheckpointManifest;

  it('creates and runs a member, then changes its writable layer', async () => {
    const created = ok(await onA(1, { $case: 'createGroup', value: { groupId: GROUP, conversationId: 'conv-1', members: [{ memberId: 'claude', kind: CliKind.CLAUDE_CODE }], imageRef: image.reference, imageDigest: image.imageId } }), 'createGroup');
    sourceId = created.containerIds.claude!;
    ok(await onA(1, { $case: 'startGroup', value: { groupId: GROUP, memberIds: [] } }), 'startGroup');
    const rt = new DockerRuntime(hostA!.docker);
    const r = await rt.exec(sourceId, ['/bin/sh', '-c', MUTATE]);
    expect(r.stderr).toBe('');
    expect(r.exitCode).toBe(0);
  });

  it('stops cleanly, then checkpoints (manifest last, idempotent)', async () => {
    evidence = ok(await onA(1, { $case: 'stopGroup', value: { groupId: GROUP, graceMs: 5000 } }), 'stopGroup').evidence!;
    expect(evidence.clean).toBe(true);
    // An xattr, set on the stopped layer from the host (busybox has no setfattr).
    const upper = await new DockerRuntime(hostA!.docker).upperDir(sourceId);
    execFileSync('setfattr', ['-n', 'user.sandbox', '-v', 'kept', join(upper, 'work/file.txt')]);
    sourceListing = await listing(hostA!.docker, sourceId);
    expect(sourceListing.get('work/file.txt')).toMatch(/^file 640 1000 1000 6 /);
    expect(sourceListing.has('etc/group')).toBe(false);
    expect(sourceListing.has('bin/vi')).toBe(false);
    expect(sourceListing.has('var/tmp')).toBe(false);
    expect(sourceListing.get('work/hardlink')).toBe('link 640 1000 1000 0  work/file.txt');
    expect(sourceListing.get('work/link-rel')).toBe('symlink 777 0 0 0  file.txt');
    expect(sourceListing.get('work/link-dangling')).toBe('symlink 777 0 0 0  missing');
    expect(sourceListing.get('work/run.sh')).toMatch(/^file 4750 0 0 19 /);
    expect(sourceListing.get('work/sub/empty-dir')).toBe('directory 755 0 0 0  ');
    expect(sourceListing.get('home/agent/.cache')).toBe('directory 2775 1000 1000 0  ');
    expect(sourceListing.get(HISTORY.slice(1))).toMatch(/^file 600 1000 1000 /);

    // The control plane adds what only it knows: no turn was in flight (R-G2).
    const cleanStop = { ...evidence, noTurnInFlight: true };
    const checkpoint = (checkpointId: string, savedLocator: string, paths: string[], commandId?: string) =>
      onA(1, { $case: 'checkpoint', value: { groupId: GROUP, checkpointId, members: [{ memberId: 'claude', kind: CliKind.CLAUDE_CODE, savedLocator, nativeSessionPaths: paths }], cleanStop, activityVersion: 12, lastCompletedTurnId: 'turn-7', maxManifestSchemaVersion: 2 } }, commandId);

    // The agent's own reading is not enough: without the control plane's "no turn in flight" it refuses.
    const unproven = await onA(1, { $case: 'checkpoint', value: { groupId: GROUP, checkpointId: 'cp-x', members: [{ memberId: 'claude', kind: CliKind.CLAUDE_CODE, savedLocator: SESSION, nativeSessionPaths: [HISTORY] }], cleanStop: evidence, activityVersion: 12, lastCompletedTurnId: 'turn-7', maxManifestSchemaVersion: 2 } });
    expect(unproven).toMatchObject({ outcome: CommandOutcome.REFUSED, reason: 'unclean_stop' });

    // Verify before emit (R-G3): a locator the session file does not hold, or a named file the layer
    // lacks, is refused at the source; no manifest is written.
    const unprovable = await checkpoint('cp-bad', 'not-the-session', [HISTORY, GONE]);
    expect(unprovable).toMatchObject({ outcome: CommandOutcome.REFUSED, reason: 'session_files_missing' });
    expect(unprovable.message).toContain(`${HISTORY} locator_absent`);
    expect(unprovable.message).toContain(`${GONE} missing`);
    // A saved session whose file is nowhere in the layer (the CLI's layout finds nothing) is refused too.
    const lost = await checkpoint('cp-lost', 'a1b2c3d4-0000-4000-8000-000000000000', []);
    expect(lost).toMatchObject({ outcome: CommandOutcome.REFUSED, reason: 'session_files_missing' });
    expect(lost.message).toContain('.claude/projects');

    // The control plane names no paths: the agent finds the session file by the CLI's layout.
    const result = ok(await checkpoint('cp-1', SESSION, []), 'checkpoint');
    manifest = result.manifest!;
    expect(manifest).toMatchObject({
      // The newest the control plane verifies (the command's max_manifest_schema_version).
      schemaVersion: 2,
      checkpointId: 'cp-1',
      groupId: GROUP,
      placementGeneration: 1,
      sourceHostId: 'host-a',
      sourceHostEpoch: agentA!.agent.epoch,
      baseImageDigest: image.imageId,
      baseImageRef: image.reference,
      bridgeVersion: 4,
      activityVersion: 12,
      lastCompletedTurnId: 'turn-7',
    });
    expect(manifest.cleanStop).toEqual(cleanStop);
    const [member] = manifest.members;
    expect(member).toMatchObject({ memberId: 'claude', kind: CliKind.CLAUDE_CODE, savedLocator: SESSION, nativeSessionPaths: [HISTORY], sourceContainerId: sourceId });
    expect(member!.layer!.digest).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(member!.layer!.mediaType).toBe('application/vnd.oci.image.layer.v1.tar');
    expect(member!.layer!.entryCount).toBeGreaterThan(10);
    expect(member!.layer!.chunks.reduce((s, c) => s + c.sizeBytes, 0)).toBe(member!.layer!.sizeBytes);

    // A retried command (new id, same checkpoint id) answers the stored checkpoint, not a second one.
    const again = ok(await checkpoint('cp-1', SESSION, [HISTORY]), 'checkpoint').manifest!;
    expect(again.members[0]!.layer!.digest).toBe(member!.layer!.digest);
    expect(again.createdAtUnixMs).toBe(manifest.createdAtUnixMs);

    // For the cold-start check below: a stored manifest (as an older or broken agent on host A could
    // have written it, which the source check above now prevents) naming a locator and a file the
    // layer does not hold.
    const chunks = await ChunkStore.open(nc);
    const planted = { ...fromWireManifest(manifest), checkpointId: 'cp-bad' };
    await chunks.putManifest({ ...planted, members: planted.members.map((m) => ({ ...m, savedLocator: 'not-the-session', nativeSessionPaths: [HISTORY, GONE] })) });
    const wire = (m: Parameters<typeof toWireManifest>[0]) => toWireManifest(m, { baseImageRef: manifest.baseImageRef, activityVersion: 12, lastCompletedTurnId: 'turn-7', cleanStop, sourceContainerIds: new Map([['claude', sourceId]]), entryCounts: new Map([['claude', member!.layer!.entryCount]]) });
    badManifest = wire(await chunks.getManifest('host-a', GROUP, 'cp-bad'));
    // And one naming the saved session but no file at all: nothing to prove is not a proof.
    await chunks.putManifest({ ...planted, checkpointId: 'cp-unnamed', members: planted.members.map((m) => ({ ...m, nativeSessionPaths: [] })) });
    unnamedManifest = wire(await chunks.getManifest('host-a', GROUP, 'cp-unnamed'));
  });

  it('writes no manifest when the deadline passes during the capture (R-G7: GC relies on it)', async () => {
    // The clock jumps an hour ahead as soon as the first chunk of the capture is published: the
    // command arrived in time, its capture ended after the deadline. Version 1 (a control plane that
    // verifies no newer): a full read that publishes, where version 2 would reuse cp-1's chunks unread.
    const watcher = nc.subscribe('sf.chunk.>', { max: 1, callback: () => { skewMs = 3_600_000; } });
    try {
      const late = await onA(1, { $case: 'checkpoint', value: { groupId: GROUP, checkpointId: 'cp-late', members: [{ memberId: 'claude', kind: CliKind.CLAUDE_CODE, savedLocator: SESSION, nativeSessionPaths: [] }], cleanStop: { ...evidence, noTurnInFlight: true }, activityVersion: 12, lastCompletedTurnId: 'turn-7', maxManifestSchemaVersion: 1 } }, undefined, Date.now() + 60_000);
      expect(skewMs).toBe(3_600_000);
      expect(late).toMatchObject({ outcome: CommandOutcome.REFUSED, reason: 'deadline_exceeded' });
      await expect((await ChunkStore.open(nc)).getManifest('host-a', GROUP, 'cp-late')).rejects.toMatchObject({ reason: 'manifest_missing' });
    } finally {
      watcher.unsubscribe();
      skewMs = 0;
    }
  });

  it('host A loses its Docker data root; the agent says so (R-H5)', async () => {
    const hb = heartbeats(nc, 'host-a');
    const n = notices(nc, 'host-a');
    await hostA!.destroy();
    expect(await n.waitFor((x) => x.source === 'docker_data_lost', 15_000)).toMatchObject({ hostEpoch: agentA!.agent.epoch });
    await hb.waitFor((h) => h.dockerDataLost, 15_000);
    await Promise.all([hb.stop(), n.stop(), agentA!.stop()]);
  });

  it('refuses a manifest for another base image, creating nothing', async () => {
    const other = { ...manifest, baseImageDigest: `sha256:${'e'.repeat(64)}` };
    const r = await onB(2, { $case: 'restore', value: { groupId: GROUP, manifest: other } });
    expect(r).toMatchObject({ outcome: CommandOutcome.REFUSED, reason: 'base_image_mismatch' });
    const tampered = { ...manifest, members: [{ ...manifest.members[0]!, savedLocator: 'someone-else' }] };
    expect(await onB(2, { $case: 'restore', value: { groupId: GROUP, manifest: tampered } })).toMatchObject({ outcome: CommandOutcome.REFUSED, reason: 'checkpoint_mismatch' });
    expect(await new DockerRuntime(hostB!.docker).listMembers(GROUP)).toEqual([]);
  });

  it('fails the cold-start check when the session files do not hold the locator, and cleans up', async () => {
    const r = await onB(2, { $case: 'restore', value: { groupId: GROUP, manifest: badManifest } });
    expect(r).toMatchObject({ outcome: CommandOutcome.FAILED, reason: 'session_files_missing' });
    expect(r.message).toContain(`${HISTORY}:locator_absent`);
    expect(r.message).toContain('gone.jsonl:missing');
    const value = r.result?.$case === 'restore' ? r.result.value : undefined;
    expect(value?.verified).toBe(false);
    expect(await new DockerRuntime(hostB!.docker).listMembers(GROUP)).toEqual([]);
  });

  it('fails the cold-start check when the manifest names the saved session but no session file (a verified layout always has one)', async () => {
    const r = await onB(2, { $case: 'restore', value: { groupId: GROUP, manifest: unnamedManifest } });
    expect(r).toMatchObject({ outcome: CommandOutcome.FAILED, reason: 'session_files_missing' });
    expect(r.message).toContain(`no claude_code session file named for ${SESSION}`);
    expect(await new DockerRuntime(hostB!.docker).listMembers(GROUP)).toEqual([]);
  });

  it('restores on host B with an identical filesystem, proves the session, and runs', async () => {
    const restored = ok(await onB(2, { $case: 'restore', value: { groupId: GROUP, manifest } }), 'restore');
    expect(restored.verified).toBe(true);
    expect(restored.members).toEqual([expect.objectContaining({ memberId: 'claude', sessionFilesPresent: true, missingPaths: [] })]);
    const targetId = restored.members[0]!.containerId;
    const rtB = new DockerRuntime(hostB!.docker);
    const info = await rtB.inspect(targetId);
    expect(info.imageId).toBe(image.imageId);
    expect(info.member).toMatchObject({ groupId: GROUP, memberId: 'claude', placementGeneration: 2, cliKind: 'claude-code' });
    expect(info.startedAt).toBeUndefined(); // nothing ran before the layer was in place

    const targetListing = await listing(hostB!.docker, targetId);
    const diff = [...new Set([...sourceListing.keys(), ...targetListing.keys()])].filter((p) => sourceListing.get(p) !== targetListing.get(p)).map((p) => ({ p, a: sourceListing.get(p), b: targetListing.get(p) }));
    expect(diff).toEqual([]);
    expect(targetListing.size).toBeGreaterThan(300);
    const xattr = execFileSync('getfattr', ['--only-values', '-n', 'user.sandbox', join(await rtB.upperDir(targetId), 'work/file.txt')], { encoding: 'utf8' });
    expect(xattr).toBe('kept');

    ok(await onB(2, { $case: 'startGroup', value: { groupId: GROUP, memberIds: [] } }), 'startGroup');
    const cat = await rtB.exec(targetId, ['cat', HISTORY], { user: '1000' });
    expect(cat.exitCode).toBe(0);
    expect(cat.stdout).toContain(`"sessionId":"${SESSION}"`);
    const gone = await rtB.exec(targetId, ['/bin/sh', '-c', 'test ! -e /etc/group && test ! -e /bin/vi && test ! -e /var/tmp && cat /var/lib/state/file && readlink /work/link-rel']);
    expect(gone).toMatchObject({ exitCode: 0, stdout: 'fresh\nfile.txt\n' });
  });
});
