// One entry point that picks the detector for a member's CLI kind, so a runner driving a mixed
// group does not switch on the kind itself.

import type { CliKind } from '../evidence.ts';
import { createClaudeCodeDetector } from './claude-code.ts';
import { createCodexDetector, type CodexDetectorOptions } from './codex.ts';
import { DetectorOptionError, type DetectorOptions, type TurnEndDetector } from './detector.ts';
import { createKiloDetector, createOpenCodeDetector } from './live-bridge.ts';
import { createPiDetector } from './pi.ts';

/** Options for any CLI: `turnId` is required for OpenCode/Kilo (bridge turn) and optional for Codex. */
export interface AnyDetectorOptions extends DetectorOptions {
  readonly turnId?: string | number;
  readonly turnStartRequestId?: CodexDetectorOptions['turnStartRequestId'];
}

/** The detector for `cli`. Throws DetectorOptionError if a bridge CLI gets no turn id. */
export function createDetector(cli: CliKind, options: AnyDetectorOptions = {}): TurnEndDetector {
  switch (cli) {
    case 'claude-code':
      return createClaudeCodeDetector(options);
    case 'codex': {
      const { turnId, ...rest } = options;
      return createCodexDetector({ ...rest, ...(turnId !== undefined ? { turnId: String(turnId) } : {}) });
    }
    case 'pi':
      return createPiDetector(options);
    case 'opencode':
    case 'kilo': {
      const { turnId, ...rest } = options;
      if (turnId === undefined) throw new DetectorOptionError(`${cli} detector needs the bridge turnId`);
      return cli === 'opencode' ? createOpenCodeDetector({ ...rest, turnId }) : createKiloDetector({ ...rest, turnId });
    }
    default: {
      const never: never = cli;
      throw new DetectorOptionError(`unknown CLI kind ${String(never)}`);
    }
  }
}
