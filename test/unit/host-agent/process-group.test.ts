// The agent signals an exec's process group only while its pid still names that very process in the
// member's container (exec-sessions.ts ProcessGroup): a pid the engine reported that is not in the
// container (with hostPID, any host process) or that was reused since is never signalled. Real
// processes of this test stand for the exec; the engine's answer (`state`) is a seam, and the
// reuse case also reads a copy of /proc (a seam: a pid cannot be made to be reused on demand).
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { ProcessGroup, procStat } from '../../../src/host-agent/exec-sessions.ts';

const CONTAINER = 'c'.repeat(64);
const children: ChildProcess[] = [];
const dirs: string[] = [];

afterEach(async () => {
  for (const c of children.splice(0)) c.kill('SIGKILL');
  for (const d of dirs.splice(0)) await rm(d, { recursive: true, force: true });
});

function sleeper(): ChildProcess & { pid: number } {
  const c = spawn('sleep', ['60'], { stdio: 'ignore' });
  children.push(c);
  return c as ChildProcess & { pid: number };
}

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

describe('ProcessGroup (seam: the engine\'s exec state)', () => {
  it('never signals a pid the engine reported that is not in the member container', async () => {
    const other = sleeper();
    const group = new ProcessGroup(async () => ({ running: true, exitCode: null, pid: other.pid }), CONTAINER);
    expect(await group.pin()).toBeUndefined();
    expect(await group.signal('SIGTERM')).toBe(false);
    await new Promise((r) => setTimeout(r, 100));
    expect(alive(other.pid)).toBe(true);
  });

  it('never signals a pid whose start time changed since it was pinned (seam: a copy of /proc)', async () => {
    const exec = sleeper();
    await new Promise((r) => setTimeout(r, 50));
    const proc = await mkdtemp(join(tmpdir(), 'sf-proc-'));
    dirs.push(proc);
    await mkdir(join(proc, String(exec.pid)));
    const stat = await readFile(`/proc/${exec.pid}/stat`, 'utf8');
    await writeFile(join(proc, String(exec.pid), 'stat'), stat);
    await writeFile(join(proc, String(exec.pid), 'cgroup'), `4:memory:/docker/${CONTAINER}\n`);
    const group = new ProcessGroup(async () => ({ running: true, exitCode: null, pid: exec.pid }), CONTAINER, proc);
    const pinned = await group.pin();
    expect(pinned).toMatchObject({ pid: exec.pid, startTime: (await procStat(exec.pid))!.startTime });
    // The pid now names another process (another start time): it is left alone.
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    rest[19] = String(Number(rest[19]) + 12345);
    await writeFile(join(proc, String(exec.pid), 'stat'), `${stat.slice(0, stat.lastIndexOf(')') + 2)}${rest.join(' ')}`);
    expect(await group.signal('SIGTERM')).toBe(false);
    await new Promise((r) => setTimeout(r, 100));
    expect(alive(exec.pid)).toBe(true);
    // The very process again: signalled.
    await writeFile(join(proc, String(exec.pid), 'stat'), stat);
    expect(await group.signal('SIGTERM')).toBe(true);
    await new Promise<void>((r) => exec.once('exit', () => r()));
    expect(alive(exec.pid)).toBe(false);
  });
});
