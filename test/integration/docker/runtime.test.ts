// Two real dockerd "hosts" side by side, one sandbox image archive loaded into both (same image id
// everywhere), and the DockerRuntime adapter against them: create/start/exec/stop/remove,
// idempotency, exit evidence for clean and unclean stops (R-G2), the writable layer (upper dir).
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { DockerRuntimeError } from '../../../src/docker/errors.ts';
import { DockerRuntime, LABELS, memberContainerName, type MemberSpec } from '../../../src/docker/runtime.ts';
import { destroyAll, startDockerHosts, type DockerHost } from '../../support/docker.ts';
import { provisionSandboxImage, type SandboxImage } from '../../support/sandbox-image.ts';

let hosts: DockerHost[] = [];
let image: SandboxImage;
let a: DockerRuntime;
let b: DockerRuntime;

beforeAll(async () => {
  hosts = await startDockerHosts(2);
  image = await provisionSandboxImage(hosts.map((h) => h.docker), { bridgeVersion: 4 });
  a = new DockerRuntime(hosts[0]!.docker);
  b = new DockerRuntime(hosts[1]!.docker);
});

afterAll(async () => {
  await destroyAll(hosts);
  for (const h of hosts) expect(existsSync(h.dir)).toBe(false);
});

/** Wait until the member's shell has installed its TERM trap (it touches /tmp/ready after). */
async function waitReady(rt: DockerRuntime, id: string): Promise<void> {
  for (let i = 0; i < 100; i++) {
    if ((await rt.exec(id, ['test', '-f', '/tmp/ready'])).exitCode === 0) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`container ${id} never became ready`);
}

function spec(over: Partial<MemberSpec> = {}): MemberSpec {
  return {
    groupId: 'g1',
    memberId: 'claude',
    cliKind: 'claude',
    placementGeneration: 1,
    imageId: image.imageId,
    cmd: ['/bin/sh', '-c', "trap 'exit 0' TERM; touch /tmp/ready; while :; do sleep 0.1; done"],
    limits: { memoryBytes: 64 * 1024 * 1024, pidsLimit: 64, nanoCpus: 500_000_000 },
    ...over,
  };
}

describe('docker hosts', () => {
  it('are separate engines with overlay2 and the same image id', async () => {
    const [ia, ib] = await Promise.all([a.engineInfo(), b.engineInfo()]);
    expect(ia.storageDriver).toBe('overlay2');
    expect(ib.storageDriver).toBe('overlay2');
    expect(ia.dockerRootDir).not.toBe(ib.dockerRootDir);
    const [ma, mb] = await Promise.all([a.imageInfo(image.reference), b.imageInfo(image.reference)]);
    expect(ma.id).toBe(image.imageId);
    expect(mb.id).toBe(image.imageId);
    expect(ma.labels['http-agent-live-bridge']).toBe('4');
  });

  it('runs a container on each host that writes a file read back by exec', async () => {
    const rts = [a, b];
    await Promise.all(
      rts.map(async (rt, i) => {
        const { id } = await rt.createMember(spec({ groupId: `files${i}`, cmd: ['/bin/sh', '-c', `echo host-${i} > /home/agent/note; exec sleep 3600`] }));
        await rt.start(id);
        // The write races the exec: retry the read briefly.
        let out = '';
        for (let t = 0; t < 50 && out === ''; t++) {
          const r = await rt.exec(id, ['cat', '/home/agent/note']);
          if (r.exitCode === 0) out = r.stdout;
          else await new Promise((res) => setTimeout(res, 50));
        }
        expect(out).toBe(`host-${i}\n`);
        const info = await rt.inspect(id);
        expect(info.member).toEqual({ groupId: `files${i}`, memberId: 'claude', cliKind: 'claude', placementGeneration: 1 });
        // The writable layer is the overlay upper dir, on this host's data root.
        const upper = await rt.upperDir(id);
        expect(upper.startsWith(hosts[i]!.dataRoot)).toBe(true);
        expect(readFileSync(join(upper, 'home/agent/note'), 'utf8')).toBe(`host-${i}\n`);
        await rt.remove(id, { force: true });
      }),
    );
  });
});

describe('DockerRuntime', () => {
  it('creates idempotently under a deterministic name and refuses a different identity', async () => {
    const s = spec({ groupId: 'idem' });
    const first = await a.createMember(s);
    expect(first.created).toBe(true);
    expect(first.name).toBe(memberContainerName('idem', 'claude', 1));
    const again = await a.createMember(s);
    expect(again).toEqual({ ...first, created: false });
    await expect(a.createMember({ ...s, cliKind: 'codex' })).rejects.toMatchObject({ reason: 'name_conflict' });
    // A new placement generation is a new container.
    const next = await a.createMember({ ...s, placementGeneration: 2 });
    expect(next.id).not.toBe(first.id);

    expect((await a.start(first.id)).alreadyRunning).toBe(false);
    expect((await a.start(first.id)).alreadyRunning).toBe(true);
    const members = await a.listMembers('idem');
    expect(members.map((m) => m.id).sort()).toEqual([first.id, next.id].sort());
    expect(members.every((m) => m.labels[LABELS.group] === 'idem')).toBe(true);

    expect((await a.remove(first.id, { force: true })).removed).toBe(true);
    expect((await a.remove(first.id, { force: true })).removed).toBe(false);
    await a.remove(next.id);
    expect(await a.listMembers('idem')).toEqual([]);
  });

  it('reports a clean stop when the process exits by itself on SIGTERM', async () => {
    const { id } = await a.createMember(spec({ groupId: 'clean' }));
    await a.start(id);
    await waitReady(a, id);
    const ev = await a.stop(id, 5);
    expect(ev).toMatchObject({ alreadyStopped: false, exitCode: 0, oomKilled: false, engineKilled: false, signalsSent: [15], exitedByItself: true });
    expect(ev.stopMillis).toBeLessThan(5000);
    // Stopping again is idempotent but proves nothing.
    const again = await a.stop(id, 5);
    expect(again).toMatchObject({ alreadyStopped: true, exitedByItself: false, exitCode: 0 });
    // The writable layer survives the stop.
    expect(existsSync(await a.upperDir(id))).toBe(true);
    await a.remove(id);
  });

  it('answers a stop across a step back of the wall clock (seam: Date.now of this process, as NTP steps a host\'s clock)', async () => {
    const { id } = await a.createMember(spec({ groupId: 'clockstep' }));
    await a.start(id);
    await waitReady(a, id);
    // Stepped back 3 s right after the stop began (chaos seed 4108: the engine refused an events
    // query whose `since` came after its `until`, the stop failed and its group stayed STOPPING).
    const realNow = Date.now.bind(Date);
    let calls = 0;
    const stepped = vi.spyOn(Date, 'now').mockImplementation(() => (calls++ === 0 ? realNow() : realNow() - 3_000));
    let ev;
    try {
      ev = await a.stop(id, 5);
    } finally {
      stepped.mockRestore();
    }
    expect(calls).toBeGreaterThan(1);
    // Only this process's clock stepped, not the engine's: its kill event falls outside the
    // stepped window, so the signals are not asserted here; the stop's own evidence is.
    expect(ev).toMatchObject({ alreadyStopped: false, exitCode: 0, oomKilled: false, engineKilled: false, exitedByItself: true });
    await a.remove(id);
  });

  it('reports an unclean stop when the engine must SIGKILL a process ignoring TERM', async () => {
    const { id } = await a.createMember(spec({ groupId: 'stubborn', cmd: ['/bin/sh', '-c', "trap '' TERM; touch /tmp/ready; while :; do sleep 0.1; done"] }));
    await a.start(id);
    await waitReady(a, id);
    const ev = await a.stop(id, 1);
    expect(ev).toMatchObject({ alreadyStopped: false, exitCode: 137, engineKilled: true, signalsSent: [15, 9], exitedByItself: false });
    expect(ev.stopMillis).toBeGreaterThanOrEqual(1000);
    await a.remove(id);
  });

  it('maps engine failures to typed reasons', async () => {
    await expect(a.inspect('does-not-exist')).rejects.toMatchObject({ reason: 'container_not_found' });
    await expect(a.stop('does-not-exist', 1)).rejects.toMatchObject({ reason: 'container_not_found' });
    await expect(a.createMember(spec({ imageId: image.reference }))).rejects.toMatchObject({ reason: 'invalid_input' });
    await expect(a.createMember(spec({ imageId: `sha256:${'0'.repeat(64)}` }))).rejects.toMatchObject({ reason: 'image_not_found' });
    await expect(a.createMember(spec({ groupId: 'bad/id' }))).rejects.toBeInstanceOf(DockerRuntimeError);
    const { id } = await a.createMember(spec({ groupId: 'stopped' }));
    await expect(a.exec(id, ['true'])).rejects.toMatchObject({ reason: 'invalid_state' });
    await a.remove(id);
  });

  it('runs a bounded one-shot command and leaves no container behind', async () => {
    const r = await a.runOnce({ imageId: image.imageId, cmd: ['/bin/sh', '-c', 'id -u agent; echo oops >&2; exit 3'] });
    expect(r).toMatchObject({ exitCode: 3, stdout: '1000\n', stderr: 'oops\n' });
    await expect(a.runOnce({ imageId: image.imageId, cmd: ['sleep', '30'], timeoutMs: 500 })).rejects.toMatchObject({ reason: 'timeout' });
    const left = await hosts[0]!.docker.listContainers({ all: true, filters: { label: [LABELS.oneshot] } });
    expect(left).toEqual([]);
    expect(await a.removeOneshots()).toBe(0);
  });
});
