// Request-history regression with the PINNED OpenCode 1.18.33 (R-P1, R-S5, R-S7, R-G3, R-G5): the
// real binary runs as `opencode serve` behind the project's live bridge v4 in member containers,
// against the loopback fake Messages API; scenarios and contract checks in bridge-scenarios.ts.
import { bridgeHistoryScenarios } from './bridge-scenarios.ts';

bridgeHistoryScenarios('opencode');
