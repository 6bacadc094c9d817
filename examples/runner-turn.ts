// The README's runner example, kept here so `npm run typecheck` compiles it against the real SDK;
// test/unit/readme-example.test.ts checks that the README shows exactly these lines.
import type { Readable } from 'node:stream';
/* README:start */
import { readFileSync } from 'node:fs';
import { RunnerClient, createDetector, driveDetector, completeTurnEvidence } from '../src/runner-sdk/index.ts';

const pem = (f: string) => readFileSync(f);
const fleet = new RunnerClient({ address: 'control-plane:7443', tls: { ca: pem('ca.pem'), cert: pem('runner.pem'), key: pem('runner-key.pem') } });
/* README:end */

export async function oneTurn(cliStdout: Readable): Promise<void> {
  /* README:start */
  const { group, created } = await fleet.openGroup({ conversationId: 'conv-42', members: [{ memberId: 'claude', cli: 'claude-code' }] });
  // created: conv-42 got a new group, every member starts NEW. A conversation whose group is LOST
  // throws RunnerError conversation_lost (metadata.lostReason), never an empty group in its place;
  // OpenGroupRequest.start_anew opens one when the user agrees to start over.
  if (created) console.log(`conv-42 starts in group ${group!.groupId}`);
  const turn = await fleet.beginTurn({ groupId: group!.groupId, memberId: 'claude' }); // NEW | LIVE | RESTORED, or throws (LOST)
  // run `claude -p … --output-format stream-json --verbose [--resume turn.locator]` in the member container:
  const { evidence } = await driveDetector(cliStdout, createDetector('claude-code', { expectedLocator: turn.locator }));
  await fleet.completeTurn({ groupId: group!.groupId, memberId: 'claude', turnId: turn.turnId, ...completeTurnEvidence(evidence, { cleanupFinished: true, exitConfirmed: true /* the exec returned */ }) });
  // turn.slotReclaimed: the container was restarted first (an earlier process's exit was never confirmed, R-S6)
  // refusals throw RunnerError with a machine-readable reason: locator_mismatch, turn_in_flight, context_lost, …
  /* README:end */
}
