// The pinned Codex CLI for the request-history regression tests (R-P1): the statically linked
// linux-x64 (musl) binary from the npm registry, verified and cached (npm-binary.ts). It reaches the
// loopback fake's Responses API through a custom model provider in ~/.codex/config.toml.
import { npmPackedFile } from './npm-binary.ts';
import type { ExtraFile } from './sandbox-image.ts';

export const CODEX_VERSION = '0.171.0';
export const CODEX_PATH = '/usr/local/bin/codex';

export function codexImageFiles(): ExtraFile[] {
  const binary = npmPackedFile({
    spec: `@openai/codex@${CODEX_VERSION}-linux-x64`,
    integrity: 'sha512-l66NZkQgdk2C3pbcfULDz42yEUB581MVA6I+Y43Wp4OIqEy73HCdmZ0GTjeAHY2ycuH4N00d9VsLrwT1jxshTw==',
    member: 'package/vendor/x86_64-unknown-linux-musl/bin/codex',
    cacheName: `codex-linux-x64-${CODEX_VERSION}`,
  });
  return [{ path: CODEX_PATH, source: binary, mode: 0o755 }];
}

/** ~/.codex/config.toml pointing Codex at the fake (written into the member before its turn). */
export function codexConfigToml(apiUrl: string): string {
  return ['model = "fake-model"', 'model_provider = "fake"', '[model_providers.fake]', 'name = "fake"', `base_url = "${apiUrl}/v1"`, 'wire_api = "responses"', ''].join('\n');
}
