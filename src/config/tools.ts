// Locates the pinned external binaries (nats-server, nats, helm) that scripts/bootstrap builds
// into a reused cache directory, falling back to PATH. One lookup shared by product and tests.
import { accessSync, constants } from 'node:fs';
import { homedir } from 'node:os';
import { delimiter, join } from 'node:path';

export type ToolName = 'nats-server' | 'nats' | 'helm' | 'promtool' | 'dockerd' | 'docker' | 'etcd' | 'kube-apiserver';

/** Directory where scripts/bootstrap puts Go-built tools; overridable for CI caches. */
export function toolsDir(env: NodeJS.ProcessEnv = process.env): string {
  return env.SANDBOXFLEET_TOOLS ?? join(homedir(), '.cache', 'sandboxfleet', 'tools');
}

function isExecutable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** Absolute path of a tool, preferring the bootstrap cache. Throws with a fix-it hint when absent. */
export function toolPath(name: ToolName, env: NodeJS.ProcessEnv = process.env): string {
  const candidates = [join(toolsDir(env), 'bin', name), ...(env.PATH ?? '').split(delimiter).filter(Boolean).map((d) => join(d, name))];
  for (const candidate of candidates) if (isExecutable(candidate)) return candidate;
  throw new Error(`${name} not found in ${join(toolsDir(env), 'bin')} or PATH: run scripts/bootstrap`);
}
