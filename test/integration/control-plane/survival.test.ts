// Survival of a host's death over real hosts (issue 14 item 5): 50 conversations on 3 real dockerd
// hosts (real agents as child processes, real nats-server, a leading ControlPlane) run seeded random
// turns that write their native session files like the CLI; the host holding the most groups dies.
// 1. Without warning (agent and dockerd SIGKILLed, data root deleted), with idle_stop_after 0, at a
//    random moment in the second half of the workload, in the very continuation of a CompleteTurn
//    answer for one of the host's groups: a completion answers only once its group is stopped
//    cleanly with a checkpoint, so that group, and every group not mid-turn (or whose completion
//    reported it could not protect it), is restored with its session (next turn RESTORED, same
//    locator, every completed turn in its history); every other group is LOST with its reason;
//    nothing restored is older than its last completed turn. Three of the conversations (on the host
//    that dies) run their turns with the real pinned Claude Code CLI through the fleet (RunTurn,
//    `claude -p` per turn) against the loopback fake Messages API (the named seam of the
//    request-history tests, test/support/fake-model-api.ts): the host dies right after one of their
//    answers while another one's turn is held at the fake model API. The held one is LOST with its
//    reason; each restored one resumes with the real CLI: RESTORED, same locator, and the model
//    receives every completed turn's messages, in order, before the new prompt.
// 2. With a 30 s spot notice and idle auto-stop off (every group running): the spot evacuation saves
//    every group of the host before the deadline, the host says so, and all are restored.
// The seed is printed; SURVIVAL_SEED replays it. bench/survival runs the same scenario at more settings.
import { describe, expect, it } from 'vitest';
import { runSurvival, type SurvivalResult } from '../../../bench/survival/scenario.ts';

const seed = Number(process.env.SURVIVAL_SEED ?? Math.floor(Math.random() * 2 ** 31));

function report(r: SurvivalResult): void {
  const by = (f: (o: SurvivalResult['outcomes'][number]) => boolean) => r.outcomes.filter(f).length;
  console.log(`survival ${r.mode} seed=${seed} idle=${String(r.idleStopAfterMs)}: ${r.victim} died after ${r.deathAfterMs} ms with ${r.groupsOnVictim} groups; `
    + `${by((o) => o.result === 'restored')} restored, ${by((o) => o.result === 'lost')} lost (${[...new Set(r.outcomes.map((o) => o.lostReason).filter(Boolean))].join(',')}), `
    + `${by((o) => o.midTurn)} mid-turn, ${r.unprotectedNotMidTurn} unprotected not mid-turn (${r.reportedUnprotected} reported); killed right after ${r.killedRightAfterTurnOf ?? '-'}'s answer; survived_fraction_not_mid_turn ${r.survivedFractionNotMidTurn.toFixed(3)}; turns ${r.turnsCompleted}`
    + (r.realClaudeGroups.length > 0 ? `; real Claude Code: ${r.realClaudeTurnsCompleted} turns (${r.realClaudeTurnMs.map((ms) => `${(ms / 1000).toFixed(1)} s`).join(', ')}), ${r.outcomes.filter((o) => o.realClaude === true).map((o) => `${o.groupId} ${o.result}${o.heldAtDeath === true ? ' (held)' : ''}${o.modelHistory !== undefined ? ` [${o.modelHistory.join(' ')}]` : ''}${o.lostReason !== undefined ? ` ${o.lostReason}` : ''}`).join('; ')}` : ''));
  if (r.realClaudeTurnFailures.length > 0) console.log('real Claude Code turns that failed before the death:', r.realClaudeTurnFailures.join('; '));
  if (Object.keys(r.unprotectedReports).length > 0) console.log('completions that could not protect their group:', JSON.stringify(r.unprotectedReports));
  if (r.violations.length > 0) console.log(r.violations.join('\n'));
}

describe('a host dies under a seeded workload of 50 conversations', () => {
  it('killed without warning (idle_stop_after 0), three conversations on the real Claude Code CLI and a fake model API: the protected are restored with their sessions, the rest LOST with a reason', async () => {
    const r = await runSurvival({ conversations: 50, idleStopAfterMs: 0, workloadMs: 30_000, meanGapMs: 8_000, turnMs: [100, 400], seed, mode: 'kill', deathRightAfterTurn: true, realClaude: 3, log: (l) => console.log(l) });
    report(r);
    expect(r.groupsOnVictim).toBeGreaterThanOrEqual(10);
    // The group whose CompleteTurn had just answered survives: holding the answer means protected.
    expect(r.killedRightAfterTurnOf).toBeDefined();
    const justAnswered = r.outcomes.find((o) => o.groupId === r.killedRightAfterTurnOf);
    expect(justAnswered).toMatchObject({ midTurn: false, protectedAtDeath: true, result: 'restored', nextTurnContext: 'RESTORED', sameLocator: true });
    // The real Claude Code conversations, all on the host that died: the death came right after one
    // of their answers (restored, resumed by the real CLI with its whole history); the one whose turn
    // was held at the model API was in flight, so LOST with a reason.
    const real = r.outcomes.filter((o) => o.realClaude === true);
    expect(real.map((o) => o.groupId).sort()).toEqual([...r.realClaudeGroups].sort());
    expect(r.realClaudeGroups).toContain(r.killedRightAfterTurnOf);
    expect(justAnswered).toMatchObject({ realClaude: true, historyCarried: true });
    expect(justAnswered!.modelHistory!.length).toBeGreaterThanOrEqual(3); // at least one earlier turn, then the new prompt
    const held = real.filter((o) => o.heldAtDeath === true);
    expect(held).toHaveLength(1);
    expect(held[0]).toMatchObject({ midTurn: true, protectedAtDeath: false, result: 'lost' });
    expect(held[0]!.lostReason).toBeDefined();
    for (const o of real) {
      if (o.result === 'restored') expect(o, o.groupId).toMatchObject({ sameLocator: true, historyCarried: true, restoredOlderThanLastTurn: false });
      else expect(o.lostReason, o.groupId).toBeDefined();
    }
    // No conversation outside a turn is exposed unless its completion said so (turn_end_unprotected).
    expect(r.unprotectedNotMidTurn).toBe(r.reportedUnprotected);
    expect(r.violations).toEqual([]);
    expect(r.restoredOlderThanLastTurn).toBe(0);
    for (const o of r.outcomes) {
      if (o.protectedAtDeath) expect(o.result, o.groupId).toBe('restored');
      if (o.result === 'lost') expect(o.lostReason, o.groupId).toBeDefined();
      if (o.result === 'restored' && o.completedTurns > 0) {
        expect(o.nextTurnContext).toBe('RESTORED');
        expect(o.sameLocator).toBe(true);
        if (o.realClaude !== true) expect(o.restoredHistoryLines).toBeGreaterThanOrEqual(o.completedTurns);
      }
    }
    // Idle groups are saved right after their turns: most of the host's conversations survive.
    expect(r.outcomes.filter((o) => o.result === 'restored').length).toBeGreaterThan(0);
  }, 420_000);

  it('a 30 s spot notice with idle auto-stop off: every group is saved before the deadline and restored', async () => {
    const r = await runSurvival({ conversations: 50, idleStopAfterMs: 'never', workloadMs: 50_000, meanGapMs: 1_500, turnMs: [100, 600], seed: seed + 1, mode: 'spot', spotNoticeMs: 30_000, log: (l) => console.log(l) });
    report(r);
    console.log('spot summary', JSON.stringify(r.spotSummary));
    expect(r.violations).toEqual([]);
    expect(r.spotSummary?.savedBeforeDeadline).toBe(r.groupsOnVictim);
    expect(r.outcomes.every((o) => o.result === 'restored')).toBe(true);
    expect(r.restoredOlderThanLastTurn).toBe(0);
  }, 420_000);
});
