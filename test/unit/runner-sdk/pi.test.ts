// Pi `--mode json` / RPC fixtures through the detector (R-S5: agent_end; failure from the last
// assistant message's stopReason; a terminal API error is never an empty success).
import { describe, expect, it } from 'vitest';
import { createPiDetector } from '../../../src/runner-sdk/detectors/index.ts';
import { driveFixture } from './fixtures.ts';

const cli = 'pi';
const session = 'ccd569e0-4e1b-4c7d-a981-637ed4107310';

describe('Pi detector', () => {
  it('ends on agent_end; stopReason stop is a success; locator from the session header', async () => {
    const { evidence } = await driveFixture(cli, 'success.jsonl', createPiDetector());
    expect(evidence).toMatchObject({ cli, nativeTurnEnded: true, succeeded: true, endKind: 'agent_end', observedLocator: session, assistantText: '4' });
  });

  it('reads the LAST assistant message (toolUse earlier, stop last)', async () => {
    const { evidence } = await driveFixture(cli, 'tool-use.jsonl', createPiDetector());
    expect(evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true, assistantText: 'Two files: a.txt and b.txt.' });
  });

  it('a terminal API error is a failure, never an empty success', async () => {
    const { evidence } = await driveFixture(cli, 'terminal-api-error.jsonl', createPiDetector());
    expect(evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false, endKind: 'agent_end', observedLocator: session });
    expect(evidence.error).toMatch(/^error: 529 .*overloaded_error/);
    expect(evidence.assistantText).toBeUndefined();
  });

  it('an empty "stop" after a failed auto-retry is the API error, not an empty success', async () => {
    const { evidence } = await driveFixture(cli, 'empty-stop-after-failed-retry.jsonl', createPiDetector());
    expect(evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false, error: 'error: 401 invalid x-api-key' });
  });

  it('a failed attempt Pi retries is not the end (Pi 0.73.1 order: agent_end, then auto_retry_start): the retry decides', async () => {
    const { evidence } = await driveFixture(cli, 'retry-then-success.jsonl', createPiDetector());
    expect(evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true, endKind: 'agent_end', assistantText: '4' });
  });

  it('retries exhausted (agent_end, then auto_retry_end false) is a failure at the auto_retry_end', async () => {
    const { evidence, read } = await driveFixture(cli, 'retries-exhausted.jsonl', createPiDetector());
    expect(evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false, endKind: 'agent_end' });
    expect(evidence.error).toMatch(/^error: 500 .*\(retries exhausted\)$/);
    expect(read.outcome).toBe('stopped');
  });

  it('an error Pi does not retry ends the turn at once; a stream that ends while a retry is pending is no turn end', () => {
    const fatal = createPiDetector();
    fatal.observe({ type: 'agent_end', messages: [{ role: 'assistant', content: [], stopReason: 'error', errorMessage: '401 invalid x-api-key' }] });
    expect(fatal.result()).toMatchObject({ nativeTurnEnded: true, succeeded: false, error: 'error: 401 invalid x-api-key' });
    const pending = createPiDetector();
    pending.observe({ type: 'agent_end', messages: [{ role: 'assistant', content: [], stopReason: 'error', errorMessage: '503 service unavailable' }] });
    expect(pending.nativeTurnEnded).toBe(false);
    pending.onTransport('disconnect', 'stream ended before the turn ended');
    expect(pending.result()).toMatchObject({ nativeTurnEnded: false, endKind: 'disconnect' });
  });

  it('a retry cancelled in its backoff ends the turn as a failure; a context overflow (Pi compacts, never retries) ends it at once', () => {
    const cancelled = createPiDetector();
    cancelled.observe({ type: 'agent_end', messages: [{ role: 'assistant', content: [], stopReason: 'error', errorMessage: '503 service unavailable' }] });
    cancelled.observe({ type: 'auto_retry_start', attempt: 1, maxAttempts: 3, delayMs: 2000, errorMessage: '503 service unavailable' });
    expect(cancelled.nativeTurnEnded).toBe(false);
    cancelled.observe({ type: 'auto_retry_end', success: false, attempt: 1, finalError: 'Retry cancelled' });
    expect(cancelled.result()).toMatchObject({ nativeTurnEnded: true, succeeded: false, error: 'error: Retry cancelled' });
    const overflow = createPiDetector();
    overflow.observe({ type: 'agent_end', messages: [{ role: 'assistant', content: [], stopReason: 'error', errorMessage: 'prompt is too long: 208429 tokens > 200000 maximum' }] });
    expect(overflow.result()).toMatchObject({ nativeTurnEnded: true, succeeded: false });
  });

  it('aborted is a failure with the errorMessage', async () => {
    const { evidence } = await driveFixture(cli, 'aborted.jsonl', createPiDetector());
    expect(evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false, error: 'aborted: Request was aborted' });
  });

  it('a disconnect mid-turn is not a turn end', async () => {
    const { evidence } = await driveFixture(cli, 'disconnect-mid-turn.jsonl', createPiDetector());
    expect(evidence).toMatchObject({ nativeTurnEnded: false, endKind: 'disconnect', observedLocator: session });
  });

  it('an RPC prompt refusal is a rejection, never a turn end; get_state names the session', async () => {
    const { evidence } = await driveFixture(cli, 'rpc-rejected.jsonl', createPiDetector());
    expect(evidence).toMatchObject({ nativeTurnEnded: false, endKind: 'rejected', observedLocator: session });
    expect(evidence.error).toMatch(/^rejected: prompt: Agent is already processing/);
  });

  it('agent_end without any assistant message is a failure', () => {
    const d = createPiDetector();
    d.observe({ type: 'agent_end', messages: [{ role: 'user', content: 'hi' }] });
    expect(d.result()).toMatchObject({ nativeTurnEnded: true, succeeded: false, error: 'agent_end without an assistant message' });
  });

  it('a missing or unknown stopReason is never read as success', () => {
    const d = createPiDetector();
    d.observe({ type: 'agent_end', messages: [{ role: 'assistant', content: [{ type: 'text', text: 'x' }] }] });
    expect(d.result()).toMatchObject({ nativeTurnEnded: true, succeeded: false });
  });
});
