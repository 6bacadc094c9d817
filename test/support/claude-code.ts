// The pinned Claude Code CLI (R-S6: 2.1.220) for the request-history regression tests (R-P1);
// it talks to the loopback fake Messages API of fake-model-api.ts (no credentials, no cost).
// The CLI is the real linux-x64 binary from the npm registry, checked against its pinned integrity
// and cached; it is put into a sandbox image with the glibc libraries it links, taken from this
// machine (docs/measured-facts.md: librt, libc, libpthread, libdl, libm, ld-linux-x86-64).
import { realpathSync } from 'node:fs';
import { npmPackedFile } from './npm-binary.ts';
import type { ExtraFile } from './sandbox-image.ts';

export const CLAUDE_CODE_VERSION = '2.1.220';
const PACKAGE = `@anthropic-ai/claude-code-linux-x64@${CLAUDE_CODE_VERSION}`;
/** npm's dist.integrity of the package tarball (`npm view <package> dist.integrity`). */
const INTEGRITY = 'sha512-3CGFCnI0gpgsqNeJruFALBDGJaKXOuok3alQEg56ty2yOPpIrOx/r2Y0+T4uhJl7kP5Hzw4IFkxo4DZKWvzQ7Q==';
export const CLAUDE_PATH = '/usr/local/bin/claude';

/** The CLI binary on this machine: fetched once with `npm pack`, verified, unpacked into the cache. */
export function claudeCodeBinary(): string {
  return npmPackedFile({ spec: PACKAGE, integrity: INTEGRITY, member: 'package/claude', cacheName: `claude-code-linux-x64-${CLAUDE_CODE_VERSION}` });
}

/** The binary and the libraries it links, as sandbox image files. */
export function claudeCodeImageFiles(): ExtraFile[] {
  const libs = ['librt.so.1', 'libc.so.6', 'libpthread.so.0', 'libdl.so.2', 'libm.so.6'];
  return [
    { path: CLAUDE_PATH, source: claudeCodeBinary(), mode: 0o755 },
    { path: '/lib64/ld-linux-x86-64.so.2', source: realpathSync('/lib64/ld-linux-x86-64.so.2'), mode: 0o755 },
    ...libs.map((l) => ({ path: `/lib/x86_64-linux-gnu/${l}`, source: realpathSync(`/lib/x86_64-linux-gnu/${l}`), mode: 0o755 })),
  ];
}

/** What the CLI needs to talk to the fake only, and nothing else (docs/measured-facts.md). */
export function claudeCodeEnv(apiUrl: string): Record<string, string> {
  return {
    ANTHROPIC_BASE_URL: apiUrl,
    ANTHROPIC_API_KEY: 'sk-ant-test-not-a-key',
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
    DISABLE_TELEMETRY: '1',
    DISABLE_AUTOUPDATER: '1',
    DISABLE_ERROR_REPORTING: '1',
    HOME: '/root',
  };
}

