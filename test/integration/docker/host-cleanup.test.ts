// The test-host harness must recover from a run that died hard: a dockerd killed with SIGKILL
// leaves a containerd shim, the container's processes, overlay and bind mounts, and cgroups.
// reapStaleHosts() (called by every startDockerHost) must remove all of it once the owner is gone.
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, expect, it } from 'vitest';
import { DockerRuntime } from '../../../src/docker/runtime.ts';
import { destroyAll, reapStaleHosts, startDockerHost, type DockerHost } from '../../support/docker.ts';
import { provisionSandboxImage } from '../../support/sandbox-image.ts';

let host: DockerHost | undefined;

afterAll(async () => {
  await destroyAll([host]);
});

function mountsUnder(dir: string): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' ')[4] ?? '')
    .filter((p) => p === dir || p.startsWith(`${dir}/`));
}

/** Killed processes may linger as zombies until whoever inherited them reaps them: that is dead too. */
async function deadOrZombie(pid: number): Promise<boolean> {
  for (let i = 0; i < 40; i++) {
    let stat: string;
    try {
      stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    } catch {
      return true;
    }
    if (stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z')) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return false;
}

it('reaps a host left behind by a dead test process, mounts and container processes included', async () => {
  host = await startDockerHost({ name: 'leaky' });
  const image = await provisionSandboxImage([host.docker], { bridgeVersion: 4 });
  const rt = new DockerRuntime(host.docker);
  const { id } = await rt.createMember({ groupId: 'leak', memberId: 'm', cliKind: 'claude', placementGeneration: 1, imageId: image.imageId, cmd: ['sleep', '3600'] });
  await rt.start(id);
  const containerPid = (await host.docker.getContainer(id).inspect()).State.Pid;
  expect(mountsUnder(host.dir).length).toBeGreaterThan(0);

  // Simulate a dead run: dockerd killed hard, and the owning test process gone.
  process.kill(host.pid, 'SIGKILL');
  const dead = spawnSync('true').pid;
  writeFileSync(join(host.dir, 'owner.pid'), `${dead}\n`);
  await new Promise((r) => setTimeout(r, 200));

  const reaped = await reapStaleHosts();
  expect(reaped).toContain(host.dir);
  expect(existsSync(host.dir)).toBe(false);
  expect(mountsUnder(host.dir)).toEqual([]);
  expect(await deadOrZombie(containerPid)).toBe(true);
  expect(existsSync(`/sys/fs/cgroup/pids/docker/${id}`)).toBe(false);
});
