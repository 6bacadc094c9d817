// The pinned Pi coding agent (@mariozechner/pi-coding-agent) for the request-history regression
// tests (R-P1): a Node.js CLI, installed once from the npm registry into a cache (npm checks
// every package against the registry's integrity) and put into a sandbox image with this machine's
// `node` and the libraries it links. It talks to the loopback fake Messages API through a custom
// provider in ~/.pi/agent/models.json (its documented way to reach a gateway).
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, realpathSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import type { ExtraFile, ExtraTree } from './sandbox-image.ts';

export const PI_VERSION = '0.73.1';
const PACKAGE = `@mariozechner/pi-coding-agent@${PI_VERSION}`;
export const PI_PATH = '/usr/local/bin/pi';
const INSTALL_PATH = '/opt/pi';

/** The installed package tree on this machine (cached; `npm install` once). */
export function piInstallDir(env: NodeJS.ProcessEnv = process.env): string {
  const dir = join(env.SANDBOXFLEET_CLI_CACHE ?? join(homedir(), '.cache', 'sandboxfleet', 'cli'), `pi-coding-agent-${PI_VERSION}`);
  if (existsSync(join(dir, 'node_modules', '@mariozechner', 'pi-coding-agent', 'dist', 'cli.js'))) return dir;
  const work = `${dir}.${process.pid}.tmp`;
  rmSync(work, { recursive: true, force: true });
  mkdirSync(work, { recursive: true });
  writeFileSync(join(work, 'package.json'), '{"name":"pi-cli-cache","private":true}\n');
  execFileSync('npm', ['install', '--no-audit', '--no-fund', '--loglevel=error', '--ignore-scripts', PACKAGE], { cwd: work, stdio: 'inherit' });
  rmSync(dir, { recursive: true, force: true });
  renameSync(work, dir);
  return dir;
}

/** Node, its libraries, the package tree and a `pi` launcher, as sandbox image content. */
export function piImageContent(launcherDir: string): { files: ExtraFile[]; trees: ExtraTree[] } {
  const libs = ['libdl.so.2', 'libstdc++.so.6', 'libm.so.6', 'libgcc_s.so.1', 'libpthread.so.0', 'libc.so.6'];
  const launcher = join(launcherDir, 'pi');
  writeFileSync(launcher, `#!/bin/sh\nexec /usr/local/bin/node ${INSTALL_PATH}/node_modules/@mariozechner/pi-coding-agent/dist/cli.js "$@"\n`, { mode: 0o755 });
  return {
    files: [
      { path: '/usr/local/bin/node', source: realpathSync(process.execPath), mode: 0o755 },
      { path: PI_PATH, source: launcher, mode: 0o755 },
      { path: '/lib64/ld-linux-x86-64.so.2', source: realpathSync('/lib64/ld-linux-x86-64.so.2'), mode: 0o755 },
      ...libs.map((l) => ({ path: `/lib/x86_64-linux-gnu/${l}`, source: realpathSync(`/lib/x86_64-linux-gnu/${l}`), mode: 0o755 })),
    ],
    trees: [{ path: INSTALL_PATH, source: piInstallDir() }],
  };
}

/** ~/.pi/agent/models.json pointing Pi at the fake (written into the member before its turn). */
export function piModelsJson(apiUrl: string): string {
  return JSON.stringify({ providers: { fake: { baseUrl: apiUrl, api: 'anthropic-messages', apiKey: 'not-a-key', models: [{ id: 'fake-model' }] } } });
}
