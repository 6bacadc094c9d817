// Wire-form turn-end evidence of a successful native turn (R-S5), shared by API tests and the
// turns benchmark; override fields for the failure variants.
import { TurnEndKind } from '../../src/gen/sandboxfleet/v1/common.ts';
import type { TurnEndEvidence } from '../../src/gen/sandboxfleet/v1/runner.ts';

export function successEvidence(overrides: Partial<TurnEndEvidence> = {}): TurnEndEvidence {
  return {
    kind: TurnEndKind.RESULT,
    nativeTurnEnded: true,
    succeeded: true,
    cleanupFinished: true,
    transportUsable: true,
    locatorUsable: true,
    processExited: false,
    exitConfirmed: false,
    nativeTurnId: '',
    errorMessage: '',
    ...overrides,
  };
}
