// Finding native session files in a writable layer (real directories on disk): by the CLI's layout,
// in /root and every /home/<user>, never through a symlink, never another locator's or a sidechain.
import { mkdtemp, mkdir, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { discoverSessionFiles } from '../../../src/host-agent/session-discovery.ts';

let upper: string;
const SID = '7d3f9a2c-5e1b-4f8a-9c6d-2b0e4a1f3c5d';

async function put(path: string, content = `{"sessionId":"${SID}"}\n`): Promise<void> {
  await mkdir(join(upper, path, '..'), { recursive: true });
  await writeFile(join(upper, path), content);
}

beforeEach(async () => {
  upper = await mkdtemp(join(tmpdir(), 'sf-upper-'));
});
afterEach(async () => {
  await rm(upper, { recursive: true, force: true });
});

describe('discoverSessionFiles', () => {
  it('finds the Claude Code session of the locator in root’s and users’ homes, and nothing else', async () => {
    await put(`root/.claude/projects/-root/${SID}.jsonl`);
    await put(`home/agent/.claude/projects/-home-agent-work/${SID}.jsonl`);
    await put('root/.claude/projects/-root/other-session.jsonl');
    await put(`root/.claude/projects/-root/${SID}/subagents/${SID}.jsonl`);
    await put(`srv/.claude/projects/-srv/${SID}.jsonl`);
    expect(await discoverSessionFiles(upper, 'claude_code', SID)).toEqual([
      `/home/agent/.claude/projects/-home-agent-work/${SID}.jsonl`,
      `/root/.claude/projects/-root/${SID}.jsonl`,
    ]);
    expect(await discoverSessionFiles(upper, 'claude_code', 'missing')).toEqual([]);
  });

  it('finds Pi and Codex sessions at their depths', async () => {
    await put(`root/.pi/agent/sessions/--root--/2026-11-30T10-00-00-000Z_${SID}.jsonl`);
    await put(`root/.codex/sessions/2026/11/30/rollout-2026-11-30T10-00-00-${SID}.jsonl`);
    expect(await discoverSessionFiles(upper, 'pi', SID)).toEqual([`/root/.pi/agent/sessions/--root--/2026-11-30T10-00-00-000Z_${SID}.jsonl`]);
    expect(await discoverSessionFiles(upper, 'codex', SID)).toEqual([`/root/.codex/sessions/2026/11/30/rollout-2026-11-30T10-00-00-${SID}.jsonl`]);
  });

  it('never follows a symlink: not for a home, a sessions directory, a project or the file', async () => {
    const outside = await mkdtemp(join(tmpdir(), 'sf-outside-'));
    try {
      await mkdir(join(outside, '.claude/projects/-x'), { recursive: true });
      await writeFile(join(outside, `.claude/projects/-x/${SID}.jsonl`), SID);
      await mkdir(join(upper, 'home'), { recursive: true });
      await symlink(outside, join(upper, 'home/evil'));
      await mkdir(join(upper, 'root/.claude'), { recursive: true });
      await symlink(join(outside, '.claude/projects'), join(upper, 'root/.claude/projects'));
      await mkdir(join(upper, 'home/agent/.claude/projects'), { recursive: true });
      await symlink(join(outside, '.claude/projects/-x'), join(upper, 'home/agent/.claude/projects/-x'));
      await mkdir(join(upper, 'home/user/.claude/projects/-y'), { recursive: true });
      await symlink(join(outside, `.claude/projects/-x/${SID}.jsonl`), join(upper, `home/user/.claude/projects/-y/${SID}.jsonl`));
      expect(await discoverSessionFiles(upper, 'claude_code', SID)).toEqual([]);
    } finally {
      await rm(outside, { recursive: true, force: true });
    }
  });

  it('finds nothing in an empty layer', async () => {
    expect(await discoverSessionFiles(upper, 'claude_code', SID)).toEqual([]);
  });
});
