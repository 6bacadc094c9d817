// The project's live-bridge v4 helper (bridge/live-bridge.ts) as sandbox image content: the
// TypeScript source transpiled to plain JavaScript with TypeScript's own transpileModule (no
// bundler; the bridge imports only node: modules), this machine's `node` with the libraries it
// links, and the launcher at /usr/local/bin/live-bridge that the attestation probe runs with
// `--version` (R-H2) and member containers run as `live-bridge serve --cli <cli>`.
import { mkdirSync, readFileSync, realpathSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { createHash } from 'node:crypto';
import ts from 'typescript';
import { HELPER_PATH, type ExtraFile } from './sandbox-image.ts';

const SOURCE = new URL('../../bridge/live-bridge.ts', import.meta.url);
export const BRIDGE_SCRIPT_PATH = '/opt/live-bridge/live-bridge.mjs';
export const NODE_PATH = '/usr/local/bin/node';

/** The bridge as JavaScript, written to a content-addressed cache file; returns its path. */
export function transpiledBridge(): string {
  const source = readFileSync(SOURCE, 'utf8');
  const js = ts.transpileModule(source, {
    compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022, sourceMap: false, removeComments: false },
    fileName: 'live-bridge.ts',
    reportDiagnostics: false,
  }).outputText;
  const dir = join(process.env.SANDBOXFLEET_IMAGE_CACHE ?? join(homedir(), '.cache', 'sandboxfleet', 'images'), 'live-bridge');
  mkdirSync(dir, { recursive: true });
  const path = join(dir, `live-bridge-${createHash('sha256').update(js).digest('hex').slice(0, 16)}.mjs`);
  writeFileSync(path, js);
  return path;
}

/** Node and the glibc/libstdc++ pieces it links, from this machine. */
export function nodeImageFiles(): ExtraFile[] {
  const libs = ['libdl.so.2', 'libstdc++.so.6', 'libm.so.6', 'libgcc_s.so.1', 'libpthread.so.0', 'libc.so.6'];
  return [
    { path: NODE_PATH, source: realpathSync(process.execPath), mode: 0o755 },
    { path: '/lib64/ld-linux-x86-64.so.2', source: realpathSync('/lib64/ld-linux-x86-64.so.2'), mode: 0o755 },
    ...libs.map((l) => ({ path: `/lib/x86_64-linux-gnu/${l}`, source: realpathSync(`/lib/x86_64-linux-gnu/${l}`), mode: 0o755 })),
  ];
}

/** The launcher (the image's helper) and the files it needs. */
export function liveBridgeImageContent(): { helper: ExtraFile; files: ExtraFile[] } {
  const script = transpiledBridge();
  const launcher = `${script}.launcher`;
  writeFileSync(launcher, `#!/bin/sh\nexec ${NODE_PATH} ${BRIDGE_SCRIPT_PATH} "$@"\n`, { mode: 0o755 });
  return {
    helper: { path: HELPER_PATH, source: launcher, mode: 0o755 },
    files: [...nodeImageFiles(), { path: BRIDGE_SCRIPT_PATH, source: script, mode: 0o644 }],
  };
}
