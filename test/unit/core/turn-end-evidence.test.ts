// R-S5 / R-S6: which native events end a turn, per CLI; interruptions are never turn ends.
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { CLI_KINDS, TURN_END_RULES, classifyTurnEnd, type CliKind, type NativeEndEvent, type TurnObservation } from '../../../src/core/index.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

const obs = (cli: CliKind, events: NativeEndEvent[], patch: Partial<TurnObservation> = {}): TurnObservation => ({
  cli, events, cleanupFinished: true, transportUsable: true, ...patch,
});

describe('turn-end evidence (R-S5)', () => {
  it('Claude: result decides by is_error; api_retry is a driver-ended failure whose process exits (R-S6)', () => {
    expect(classifyTurnEnd(obs('claude_code', [{ type: 'result', isError: false }]))).toEqual({ kind: 'ended', success: true, cleanupFinished: true, transportUsable: true, processExits: false });
    expect(classifyTurnEnd(obs('claude_code', [{ type: 'result', isError: true }]))).toMatchObject({ kind: 'ended', success: false, processExits: false });
    expect(classifyTurnEnd(obs('claude_code', [{ type: 'system/api_retry' }]))).toMatchObject({ kind: 'ended', success: false, processExits: true });
    expect(classifyTurnEnd(obs('claude_code', [{ type: 'assistant' }]))).toEqual({ kind: 'not_ended', cause: 'no_end_event' });
  });

  it('Codex: only turn/completed of the current native turn ends it; status decides', () => {
    expect(classifyTurnEnd(obs('codex', [{ type: 'turn/completed', turnId: 't0', status: 'completed' }], { currentTurnId: 't1' }))).toEqual({ kind: 'not_ended', cause: 'no_end_event' });
    expect(classifyTurnEnd(obs('codex', [{ type: 'turn/completed', turnId: 't1', status: 'completed' }], { currentTurnId: 't1' }))).toMatchObject({ kind: 'ended', success: true });
    expect(classifyTurnEnd(obs('codex', [{ type: 'turn/completed', turnId: 't1', status: 'failed' }], { currentTurnId: 't1' }))).toMatchObject({ kind: 'ended', success: false });
    expect(classifyTurnEnd(obs('codex', [{ type: 'turn/completed', turnId: 't1', status: 'completed' }]))).toMatchObject({ kind: 'not_ended' });
  });

  it('Pi: agent_end, failure read from stopReason; a terminal API error is never an empty success', () => {
    expect(classifyTurnEnd(obs('pi', [{ type: 'agent_end', stopReason: 'stop' }]))).toMatchObject({ kind: 'ended', success: true });
    expect(classifyTurnEnd(obs('pi', [{ type: 'agent_end', stopReason: 'error' }]))).toMatchObject({ kind: 'ended', success: false });
    expect(classifyTurnEnd(obs('pi', [{ type: 'agent_end' }]))).toMatchObject({ kind: 'ended', success: false });
  });

  it('OpenCode/Kilo: settled of the current bridge turn; events of earlier bridge turns are ignored', () => {
    for (const cli of ['opencode', 'kilo'] as const) {
      expect(classifyTurnEnd(obs(cli, [{ type: 'settled', turnId: 'b1', isError: false }], { currentTurnId: 'b2' }))).toMatchObject({ kind: 'not_ended' });
      expect(classifyTurnEnd(obs(cli, [{ type: 'settled', turnId: 'b1', isError: false }, { type: 'settled', turnId: 'b2', isError: true }], { currentTurnId: 'b2' })))
        .toMatchObject({ kind: 'ended', success: false });
      expect(classifyTurnEnd(obs(cli, [{ type: 'settled', turnId: 'b2' }], { currentTurnId: 'b2' }))).toMatchObject({ kind: 'ended', success: false });
    }
  });

  it('interruptions without an end event are reported with their cause', () => {
    for (const cause of ['command_rejected', 'transport_disconnect', 'timeout', 'cancelled'] as const) {
      expect(classifyTurnEnd(obs('claude_code', [], { interruption: cause }))).toEqual({ kind: 'not_ended', cause });
    }
  });

  it('property: a turn is ended iff an end event of that CLI (for the current turn where required) was seen', () => {
    const event = fc.record({
      type: fc.constantFrom('result', 'system/api_retry', 'turn/completed', 'agent_end', 'settled', 'assistant', 'system/init'),
      turnId: fc.option(fc.constantFrom('t1', 't2'), { nil: undefined }),
      isError: fc.option(fc.boolean(), { nil: undefined }),
      status: fc.option(fc.constantFrom('completed', 'failed', 'interrupted'), { nil: undefined }),
      stopReason: fc.option(fc.constantFrom('stop', 'error', 'aborted', 'length'), { nil: undefined }),
    });
    fc.assert(fc.property(
      fc.constantFrom(...CLI_KINDS), fc.array(event, { maxLength: 5 }), fc.option(fc.constantFrom('t1', 't2'), { nil: undefined }),
      fc.option(fc.constantFrom('transport_disconnect' as const, 'timeout' as const, 'cancelled' as const, 'command_rejected' as const), { nil: undefined }),
      (cli, events, currentTurnId, interruption) => {
        const rule = TURN_END_RULES[cli];
        const end = classifyTurnEnd(obs(cli, events, { currentTurnId, interruption }));
        const matching = events.filter((e) => rule.endEvents.includes(e.type) && (!rule.mustMatchCurrentTurn || (currentTurnId !== undefined && e.turnId === currentTurnId)));
        expect(end.kind === 'ended').toBe(matching.length > 0);
        if (end.kind === 'not_ended') expect(end.cause).toBe(interruption ?? 'no_end_event');
        if (end.kind === 'ended' && end.success) {
          const first = matching[0]!;
          const explicitSuccess = { claude_code: first.type === 'result' && first.isError === false, codex: first.status === 'completed', pi: first.stopReason === 'stop', opencode: first.isError === false, kilo: first.isError === false }[cli];
          expect(explicitSuccess).toBe(true);
        }
      },
    ), { numRuns: PROPERTY_RUNS });
  });
});
