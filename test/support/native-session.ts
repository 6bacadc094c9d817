// Test stand-in for a native CLI's session history: writes, inside a running member container, the
// session file its CLI would write for a locator (core/native-session-layout.ts), so a checkpoint
// finds and proves it the way it does for the real CLI (test/integration/cli-history runs the real
// Claude Code binary). Tests that complete a turn with a locator and then checkpoint or migrate the
// group call this during the turn, as the CLI would.
import type Docker from 'dockerode';
import { NATIVE_SESSION_LAYOUTS } from '../../src/core/native-session-layout.ts';
import type { CliKind } from '../../src/core/turn-end-evidence.ts';

/** The path the stand-in writes for `cli` and `locator` (under /root, one directory per level). */
export function nativeSessionPath(cli: CliKind, locator: string): string {
  const layout = NATIVE_SESSION_LAYOUTS[cli];
  // OpenCode and Kilo: one SQLite store of every session (its file name does not depend on the locator).
  if (layout.sqlite !== undefined) return `/root/${layout.root}/${cli === 'kilo' ? 'kilo' : 'opencode'}.db`;
  const dirs = ['2026', '11', '30'].slice(0, layout.depth);
  const name = cli === 'claude_code' ? `${locator}.jsonl`
    : cli === 'pi' ? `2026-11-30T10-00-00-000Z_${locator}.jsonl`
    : cli === 'codex' ? `rollout-2026-11-30T10-00-00-${locator}.jsonl`
    : `${locator}.json`;
  return ['/root', layout.root, ...dirs, name].join('/');
}

/** Append one history line naming `locator` to the member's session file (creating it). */
export async function writeNativeSession(docker: Docker, containerId: string, cli: CliKind, locator: string): Promise<string> {
  // A stand-in cannot write a SQLite session store; tests of OpenCode and Kilo run the real CLI
  // behind the live bridge (test/integration/cli-history/opencode.test.ts, kilo.test.ts).
  if (NATIVE_SESSION_LAYOUTS[cli].sqlite !== undefined) throw new Error(`writeNativeSession: ${cli} keeps its sessions in SQLite; run the real CLI`);
  const path = nativeSessionPath(cli, locator);
  const dir = path.slice(0, path.lastIndexOf('/'));
  const exec = await docker.getContainer(containerId).exec({
    Cmd: ['/bin/sh', '-c', 'mkdir -p "$1" && printf \'{"type":"user","sessionId":"%s"}\\n\' "$3" >> "$2"', 'sh', dir, path, locator],
    AttachStdout: true,
    AttachStderr: true,
  });
  const stream = await exec.start({});
  await new Promise<void>((resolve, reject) => {
    stream.on('end', () => resolve());
    stream.on('error', reject);
    stream.resume();
  });
  const { ExitCode } = await exec.inspect();
  if (ExitCode !== 0) throw new Error(`writing ${path} in ${containerId} exited ${ExitCode}`);
  return path;
}
