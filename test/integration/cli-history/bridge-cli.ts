// What the OpenCode and Kilo history tests share: a sandbox image with the pinned CLI behind the
// project's live bridge v4 (bridge/live-bridge.ts: the image's /usr/local/bin/live-bridge, whose
// `--version` the attestation probe runs), member containers whose main process is
// `live-bridge serve --cli <cli>` (after writing the CLI's config that points it at the loopback
// fake), and a runner turn as the runner SDK drives it: BeginTurn, `live-bridge turn` through the
// fleet's Exec (no Docker socket), the SDK's live-bridge detector on its stdout, CompleteTurn.
import { expect } from 'vitest';
import type { BeginTurnResponse } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { createDetector, type TurnEndEvidence } from '../../../src/runner-sdk/index.ts';
import type { RecordedRequest } from '../../support/fake-model-api.ts';
import { liveBridgeImageContent } from '../../support/live-bridge-image.ts';
import { KILO_ENV, KILO_VERSION, OPENCODE_ENV, OPENCODE_VERSION, kiloImageFiles, openCodeConfigJson, openCodeImageFiles } from '../../support/opencode-cli.ts';
import type { ExtraFile, SandboxImageSpec } from '../../support/sandbox-image.ts';
import { completeWith, execAndDetect, type ExecTurnResult } from './exec-turn.ts';
import type { HistoryFleet } from './history-fleet.ts';

export type BridgeCli = 'opencode' | 'kilo';

export const BRIDGE_CLIS: Record<BridgeCli, { version: string; configPath: string; env: Readonly<Record<string, string>>; files: () => ExtraFile[] }> = {
  opencode: { version: OPENCODE_VERSION, configPath: '/root/.config/opencode/opencode.json', env: OPENCODE_ENV, files: openCodeImageFiles },
  kilo: { version: KILO_VERSION, configPath: '/root/.config/kilo/kilo.json', env: KILO_ENV, files: kiloImageFiles },
};

const unique = (files: readonly ExtraFile[]): ExtraFile[] => [...new Map(files.map((f) => [f.path, f])).values()];

/** The sandbox image: the CLI, node, and the real live bridge as the image's helper (label 4). */
export function bridgeImage(cli: BridgeCli): SandboxImageSpec {
  const bridge = liveBridgeImageContent();
  return { bridgeVersion: 4, helper: bridge.helper, extraFiles: unique([...BRIDGE_CLIS[cli].files(), ...bridge.files]), tagSuffix: `${cli}-${BRIDGE_CLIS[cli].version}-live-bridge` };
}

/**
 * The host agent's member command for `cli` (SANDBOXFLEET_MEMBER_COMMANDS): write the CLI's config,
 * then become `live-bridge serve`. `config` adds settings (e.g. `permission`).
 */
export function bridgeAgent(cli: BridgeCli, apiUrl: string, config: Record<string, unknown> = {}): Record<string, unknown> {
  const path = BRIDGE_CLIS[cli].configPath;
  const env = Object.entries(BRIDGE_CLIS[cli].env).map(([k, v]) => `${k}=${v}`).join(' ');
  return {
    memberCommands: {
      [cli]: ['/bin/sh', '-c', `mkdir -p "$(dirname ${path})" && printf '%s' "$1" > ${path} && exec env ${env} /usr/local/bin/live-bridge serve --cli ${cli}`, 'live-bridge', openCodeConfigJson(apiUrl, config)],
    },
  };
}

export interface BridgeTurn extends ExecTurnResult {
  readonly begun: BeginTurnResponse;
  readonly requests: RecordedRequest[];
}

/**
 * Begin a turn and run it through the bridge (`live-bridge turn` via Exec), resuming the locator the
 * fleet gave (`session: null`: no --session, as a driver that lost it). Not completed.
 */
export async function runBridgeTurn(h: HistoryFleet, groupId: string, cli: BridgeCli, prompt: string, options: { session?: string | null; cancelWhen?: (stdout: string) => boolean; memberId?: string } = {}): Promise<BridgeTurn> {
  const memberId = options.memberId ?? cli;
  const begun = await h.runner.beginTurn({ groupId, memberId });
  const before = h.api.requests.length;
  const session = options.session === null ? '' : (options.session ?? begun.locator);
  const argv = ['/usr/local/bin/live-bridge', 'turn', '--turn-id', begun.turnId, ...(session !== '' ? ['--session', session] : []), '--', prompt];
  const detector = createDetector(cli, { turnId: begun.turnId, ...(begun.locator !== '' ? { expectedLocator: begun.locator } : {}) });
  const r = await execAndDetect(h.runner, { groupId, memberId, argv, generation: begun.placementGeneration }, detector, options.cancelWhen !== undefined ? { cancelWhen: options.cancelWhen } : {});
  return { ...r, begun, requests: h.api.requests.slice(before) };
}

/** One turn as a runner drives the bridge: begin, run, detect, complete (the CLI keeps running: no exit). */
export async function bridgeTurn(h: HistoryFleet, groupId: string, cli: BridgeCli, prompt: string, memberId: string = cli): Promise<BridgeTurn> {
  const t = await runBridgeTurn(h, groupId, cli, prompt, { memberId });
  expect(t.evidence.nativeTurnEnded, `${t.stderr}\n${t.stdout.slice(-2000)}`).toBe(true);
  await completeWith(h.runner, groupId, memberId, t.begun, t, false);
  return t;
}

export type { TurnEndEvidence };
