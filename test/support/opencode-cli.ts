// The pinned OpenCode and Kilo CLIs for the request-history regression tests (R-P1, R-S5, R-S7).
// Both are Bun-compiled linux-x64 binaries (glibc: libc, libpthread, libdl, libm, ld-linux) that npm
// installs as the platform optionalDependency of their wrapper packages: `opencode-ai@1.18.33` →
// `opencode-linux-x64@1.18.33`, `@kilocode/cli@7.7.7` → `@kilocode/cli-linux-x64@7.7.7` (7.7.7 is
// the newest 7.x whose linux-x64 package the registry serves). The platform tarballs are fetched
// with `npm pack`, checked against their pinned integrity and cached (npm-binary.ts). In a member
// container they run behind the project's live bridge (bridge/live-bridge.ts) as `<cli> serve`,
// and reach the loopback fake Messages API through a custom provider in their config file
// (`@ai-sdk/anthropic`, which both bundle: no package is installed at run time).
import { realpathSync } from 'node:fs';
import { npmPackedFile } from './npm-binary.ts';
import type { ExtraFile } from './sandbox-image.ts';

export const OPENCODE_VERSION = '1.18.33';
export const KILO_VERSION = '7.7.7';
export const OPENCODE_PATH = '/usr/local/bin/opencode';
export const KILO_PATH = '/usr/local/bin/kilo';

/** The wrapper packages a user installs; their dist.integrity, for the record (`npm view <spec> dist.integrity`). */
export const WRAPPERS = {
  opencode: { spec: `opencode-ai@${OPENCODE_VERSION}`, integrity: 'sha512-58P1ffLRXiAY4QeoABqUjqf6DEzm1ihpovvn9Ad+oOLbLiwK/rf88wruT9IATJ7AtNjmi8iA7pC8tN4o5y799Q==' },
  kilo: { spec: `@kilocode/cli@${KILO_VERSION}`, integrity: 'sha512-19EnDYB64KuvPxY2/HfUJs40vO87xlV2UO/L8CqV9EWqHQtcT0ORgOcPLxGl+L77sH6NEv/fjDfOf2sxR0jJyw==' },
} as const;

/** The opencode binary on this machine (fetched once, verified, cached). */
export function openCodeBinary(): string {
  return npmPackedFile({
    spec: `opencode-linux-x64@${OPENCODE_VERSION}`,
    integrity: 'sha512-q/t/3p2CTxOT9y2kvjesb/LZab2+1eqlhhWA02Be6mjTtmYtNBcBsrI5yDo4Fw7ZSPBW2oyMIGMNRqiKQjiAWw==',
    member: 'package/bin/opencode',
    cacheName: `opencode-linux-x64-${OPENCODE_VERSION}`,
  });
}

/** The kilo binary on this machine (fetched once, verified, cached). */
export function kiloBinary(): string {
  return npmPackedFile({
    spec: `@kilocode/cli-linux-x64@${KILO_VERSION}`,
    integrity: 'sha512-QHb5D51imerjXjx/04lJz4APYtAsCI+Xehd8j5AniEJxwdmCkDML1xTkrCcIGpE6OFo7gI41LcwM03j93bqyjA==',
    member: 'package/bin/kilo',
    cacheName: `kilo-linux-x64-${KILO_VERSION}`,
  });
}

/** glibc pieces both binaries link (ldd), from this machine. */
function glibcFiles(): ExtraFile[] {
  const libs = ['libc.so.6', 'libpthread.so.0', 'libdl.so.2', 'libm.so.6'];
  return [
    { path: '/lib64/ld-linux-x86-64.so.2', source: realpathSync('/lib64/ld-linux-x86-64.so.2'), mode: 0o755 },
    ...libs.map((l) => ({ path: `/lib/x86_64-linux-gnu/${l}`, source: realpathSync(`/lib/x86_64-linux-gnu/${l}`), mode: 0o755 })),
  ];
}

export function openCodeImageFiles(): ExtraFile[] {
  return [{ path: OPENCODE_PATH, source: openCodeBinary(), mode: 0o755 }, ...glibcFiles()];
}

export function kiloImageFiles(): ExtraFile[] {
  return [{ path: KILO_PATH, source: kiloBinary(), mode: 0o755 }, ...glibcFiles()];
}

/**
 * The config (`~/.config/opencode/opencode.json`, `~/.config/kilo/kilo.json`) that points the CLI at
 * the fake: one provider `fake` speaking the Messages API, no sharing, no auto-update. `extra` adds
 * settings (e.g. `permission`).
 */
export function openCodeConfigJson(apiUrl: string, extra: Record<string, unknown> = {}): string {
  return JSON.stringify({
    provider: { fake: { npm: '@ai-sdk/anthropic', name: 'Fake', options: { baseURL: `${apiUrl}/v1`, apiKey: 'not-a-key' }, models: { 'fake-model': { name: 'Fake' } } } },
    model: 'fake/fake-model',
    autoupdate: false,
    share: 'disabled',
    ...extra,
  });
}

/** Environment that keeps each CLI off the network except the fake (no model catalogue fetch, telemetry or downloads). */
export const OPENCODE_ENV: Readonly<Record<string, string>> = {
  HOME: '/root',
  OPENCODE_DISABLE_MODELS_FETCH: '1',
  OPENCODE_DISABLE_AUTOUPDATE: '1',
  OPENCODE_DISABLE_SHARE: '1',
  OPENCODE_DISABLE_LSP_DOWNLOAD: '1',
  OPENCODE_DISABLE_CLAUDE_CODE: '1',
};

export const KILO_ENV: Readonly<Record<string, string>> = {
  HOME: '/root',
  KILO_DISABLE_MODELS_FETCH: '1',
  KILO_DISABLE_AUTOUPDATE: '1',
  KILO_DISABLE_SHARE: '1',
  KILO_DISABLE_LSP_DOWNLOAD: '1',
  KILO_DISABLE_CLAUDE_CODE: '1',
  KILO_DISABLE_SESSION_INGEST: '1',
  KILO_DISABLE_CODEBASE_INDEXING: '1',
  KILO_DISABLE_PRESENCE: '1',
  KILO_NO_DAEMON: '1',
  KILO_TELEMETRY_LEVEL: 'off',
};
