// Survival benchmark (issue 14 item 6): how many conversations survive a host's death, by idle
// auto-stop setting, what idle_stop_after 0 costs a turn, and how many running groups a 30 s spot
// notice saves. Real nats-server, three real dockerd hosts, real host agents (child processes, so a
// host can be SIGKILLed), a real leading ControlPlane (bench/survival/scenario.ts).
//   1. The same seeded workload (conversations × random turns, each writing its native session file
//      like the CLI, idle gaps uniform in [0, 2 × gap]) once per setting: idleStopAfter 0, 0 with
//      protect_in_background (0-background), 1 min, 10 min and never; the host holding the most groups is killed without warning (agent and
//      dockerd SIGKILL, data root deleted) at a random moment. survived_fraction_not_mid_turn = groups
//      of that host restored with their session / its groups with no turn in flight at the death;
//      restored_older_than_last_turn counts restored sessions missing a completed turn (must be 0).
//      --real-claude of the conversations (default 3, 1 in a smoke run), placed on the host that
//      dies, run every turn with the real pinned Claude Code CLI through the fleet (RunTurn, `claude -p`
//      per turn) against the loopback fake Messages API of test/support/fake-model-api.ts; a restored
//      one must be resumed by the real CLI (RESTORED, same locator, the model receiving every
//      completed turn's messages before the new prompt), else the setting lists a violation.
//      Time is compressed (--compress, default 20): 1 min runs as 3 s, 10 min as 30 s, the gaps as
//      well, so an hour of conversation fits in a minute; the stop and checkpoint themselves are not
//      compressed (the figures for the short settings are pessimistic by that much).
//   2. Turn overhead of idleStopAfter 0: what the fleet's calls add to a turn, BeginTurn + CompleteTurn
//      per completed turn, in the 0 run (the begin restarts the stopped group: container start +
//      attach; the completion answers after the clean stop and the checkpoint) against the never run
//      (running groups, nothing stopped), p50 and p99; and each call's own p50/p99.
//   3. Spot capacity: --spot-groups RUNNING groups of --spot-mib MiB on one host, a --notice-ms
//      spot notice: spot_groups_saved_30s = clean-stopped and checkpointed off the host before the
//      deadline (what the host says, cross-checked against the checkpoints' creation times).
// Writes bench/results/survival.json (a --smoke run: tiny sizes, to --out or a temp dir).
//
//   node --import tsx bench/survival/run.ts [--conversations 50] [--real-claude 3] [--workload-ms 60000] [--compress 20] [--seed N]
//        [--spot-groups 100] [--spot-mib 20] [--notice-ms 30000] [--smoke] [--out DIR]
//   node --import tsx bench/survival/run.ts --spot-only [--spot-parallelism N] [--no-restore-wait]   (printed, not written)
import { cpus, loadavg } from 'node:os';
import { parseArgs } from 'node:util';
import type { IdleStopAfter } from '../../src/core/idle-stop.ts';
import { CLAUDE_CODE_VERSION } from '../../test/support/claude-code.ts';
import { BENCH_OPTIONS, startBench, writeResult } from '../common.ts';
import { runSpotCapacity, runSurvival, type SurvivalResult } from './scenario.ts';

const { values } = parseArgs({ options: {
  conversations: { type: 'string' }, 'real-claude': { type: 'string' }, 'workload-ms': { type: 'string' }, compress: { type: 'string' }, seed: { type: 'string' },
  'spot-groups': { type: 'string' }, 'spot-mib': { type: 'string' }, 'notice-ms': { type: 'string' }, 'spot-only': { type: 'boolean', default: false }, 'spot-parallelism': { type: 'string' }, 'no-restore-wait': { type: 'boolean', default: false }, ...BENCH_OPTIONS,
} });
const run = startBench('survival', values);
const sized = (flag: string | undefined, full: number, smoke: number): number => Number(flag ?? (run.smoke ? smoke : full));
const CONVERSATIONS = sized(values.conversations, 50, 9);
const REAL_CLAUDE = sized(values['real-claude'], 3, 1);
const WORKLOAD_MS = sized(values['workload-ms'], 60_000, 8_000);
// A smoke run compresses time further (gaps of 0-2 s) so that its few seconds of workload surely hold
// begins on stopped groups; with the full run's 0-18 s gaps a slow machine sometimes had none (no figure).
const COMPRESS = sized(values.compress, 20, 180);
const SEED = sized(values.seed, Math.floor(Math.random() * 2 ** 31), Math.floor(Math.random() * 2 ** 31));
const SPOT_GROUPS = sized(values['spot-groups'], 100, 4);
const SPOT_MIB = sized(values['spot-mib'], 20, 1);
const NOTICE_MS = sized(values['notice-ms'], 30_000, 10_000);
/** Think time between a conversation's turns, in real minutes before compression (uniform in [0, 2×]). */
const GAP_MIN = 3;

function percentile(xs: readonly number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))] ?? Number.NaN;
}

// A smoke run measures idle 0 only; its baseline is its own begins on running groups (first turns).
// `0-background`: idle 0 with every completion asking protect_in_background (the stop and checkpoint
// follow the answer): the turn costs the restart only, the conversation is unprotected meanwhile.
const SETTINGS: readonly { readonly name: string; readonly idle: IdleStopAfter; readonly background?: boolean }[] = run.smoke
  ? [{ name: '0', idle: 0 }, { name: '0-background', idle: 0, background: true }]
  : [{ name: '0', idle: 0 }, { name: '0-background', idle: 0, background: true }, { name: '1min', idle: 60_000 / COMPRESS }, { name: '10min', idle: 600_000 / COMPRESS }, { name: 'never', idle: 'never' }];

async function spotOnly(): Promise<void> {
  // A development aid: the spot capacity part alone, printed, never written as the bench's result.
  const spot = await runSpotCapacity({
    groups: SPOT_GROUPS, mibPerGroup: SPOT_MIB, noticeMs: NOTICE_MS, log: (l) => console.log(`[survival] ${l}`),
    ...(values['spot-parallelism'] !== undefined ? { parallelism: Number(values['spot-parallelism']) } : {}), waitRestores: values['no-restore-wait'] !== true,
  });
  console.log(JSON.stringify({ ...spot, loadAverage: loadavg() }, null, 2));
}

async function main(): Promise<void> {
  if (values['spot-only'] === true) return spotOnly();
  const log = (l: string) => console.log(`[survival] ${l}`);
  const runs: Record<string, SurvivalResult> = {};
  for (const s of SETTINGS) {
    log(`setting ${s.name}: ${CONVERSATIONS} conversations (${REAL_CLAUDE} on the real Claude Code), workload ${WORKLOAD_MS} ms, seed ${SEED}`);
    runs[s.name] = await runSurvival({
      conversations: CONVERSATIONS, idleStopAfterMs: s.idle, workloadMs: WORKLOAD_MS, meanGapMs: (GAP_MIN * 60_000) / COMPRESS, turnMs: [200, 1_500],
      seed: SEED, mode: 'kill', realClaude: REAL_CLAUDE, log, ...(s.background === true ? { protectInBackground: true } : {}),
    });
    const r = runs[s.name]!;
    log(`setting ${s.name}: ${r.victim} died with ${r.groupsOnVictim} groups; survived_fraction_not_mid_turn ${r.survivedFractionNotMidTurn.toFixed(3)}; violations ${r.violations.length}`);
  }
  log(`spot capacity: ${SPOT_GROUPS} groups × ${SPOT_MIB} MiB, notice ${NOTICE_MS} ms`);
  const loadAtSpot = loadavg();
  const spot = await runSpotCapacity({ groups: SPOT_GROUPS, mibPerGroup: SPOT_MIB, noticeMs: NOTICE_MS, log });

  const idle0 = runs['0']!;
  const never = runs.never;
  const begins0 = never === undefined ? idle0.beginStoppedMs : [...idle0.beginStoppedMs, ...idle0.beginRunningMs];
  const beginsNever = never?.beginRunningMs ?? idle0.beginRunningMs;
  // A smoke run has no never run: its baseline is the begin on running groups plus a completion that
  // stops nothing, which it cannot measure; it reports the begin part only.
  const calls0 = never === undefined ? begins0 : idle0.turnCallsMs;
  const callsNever = never === undefined ? beginsNever : never.turnCallsMs;
  const p50Over = percentile(calls0, 50) - percentile(callsNever, 50);
  const p99Over = percentile(calls0, 99) - percentile(callsNever, 99);
  const restartP50 = percentile(idle0.beginStoppedMs, 50);
  const restartP99 = percentile(idle0.beginStoppedMs, 99);
  // The same for idle 0 with the protection after the answer, against the same baseline.
  const bg = runs['0-background']!;
  const callsBg = never === undefined ? [...bg.beginStoppedMs, ...bg.beginRunningMs] : bg.turnCallsMs;
  const bgOverP50 = percentile(callsBg, 50) - percentile(callsNever, 50);
  const bgOverP99 = percentile(callsBg, 99) - percentile(callsNever, 99);
  const bgRestartP50 = percentile(bg.beginStoppedMs, 50);
  const fractions = Object.fromEntries(Object.entries(runs).map(([k, r]) => [k, r.survivedFractionNotMidTurn]));
  const perSetting = Object.fromEntries(Object.entries(runs).map(([k, r]) => {
    const by = (f: (o: SurvivalResult['outcomes'][number]) => boolean) => r.outcomes.filter(f).length;
    const reasons: Record<string, number> = {};
    for (const o of r.outcomes) if (o.lostReason !== undefined) reasons[o.lostReason] = (reasons[o.lostReason] ?? 0) + 1;
    return [k, {
      idle_stop_after_ms_compressed: r.idleStopAfterMs, victim: r.victim, groups_on_victim: r.groupsOnVictim, death_after_ms: r.deathAfterMs, turns_completed: r.turnsCompleted,
      mid_turn: by((o) => o.midTurn), protected_at_death: by((o) => o.protectedAtDeath), restored: by((o) => o.result === 'restored'), lost: by((o) => o.result === 'lost'),
      unsettled: by((o) => o.result === 'unsettled'), unprotected_not_mid_turn: r.unprotectedNotMidTurn, unprotected_reported: r.reportedUnprotected, unprotected_reports: r.unprotectedReports, lost_reasons: reasons,
      survived_fraction_not_mid_turn: r.survivedFractionNotMidTurn, restored_older_than_last_turn: r.restoredOlderThanLastTurn,
      real_claude: {
        conversations: r.realClaudeGroups.length, turns_completed: r.realClaudeTurnsCompleted, on_victim: by((o) => o.realClaude === true),
        restored_with_history: by((o) => o.realClaude === true && o.result === 'restored' && o.historyCarried === true), lost: by((o) => o.realClaude === true && o.result === 'lost'),
        turn_p50_ms: percentile(r.realClaudeTurnMs, 50), turn_failures: r.realClaudeTurnFailures,
      },
      violations: r.violations,
    }];
  }));
  const notes = [
    `workload: ${CONVERSATIONS} conversations (one Claude Code member each) on 3 dockerd hosts, seed ${SEED}; in ${CONVERSATIONS - REAL_CLAUDE} of them each turn writes one history line to the member's native session file (as the CLI does) and ends with an exit the runner saw (claude -p per turn), turns last 0.2-1.5 s; in ${REAL_CLAUDE} (placed on the host that dies) each turn runs the real Claude Code ${CLAUDE_CODE_VERSION} through RunTurn against a loopback fake Messages API (${Object.values(runs).reduce((n, r) => n + r.realClaudeTurnsCompleted, 0)} real turns over all settings; restored ones must be resumed by the CLI with every completed turn in the model's request); idle gaps uniform in [0, ${2 * GAP_MIN}] min, time compressed ${COMPRESS}x (so ${WORKLOAD_MS / 1000} s of wall time = ${Math.round((WORKLOAD_MS * COMPRESS) / 60_000)} min of conversation); the same seed for every setting.`,
    `death: the host holding the most groups, at a random moment in the second half of the workload: agent (child process) and dockerd SIGKILLed, data root deleted. A group survives when it was stopped cleanly with a checkpoint of its state: restored on another host, its next turn RESTORED with the same locator and every completed turn in its session file.`,
    `idle 0: CompleteTurn answers only once the group is stopped cleanly with a checkpoint of its state, so a conversation not mid-turn for its runner (it holds the answer of its last turn) is protected unless that completion reported it could not be (turn_end_unprotected): ${idle0.unprotectedNotMidTurn} of the dead host's ${idle0.groupsOnVictim} groups had no turn in flight and were unprotected at the death (${idle0.reportedUnprotected} of them reported), ${idle0.outcomes.filter((x) => x.midTurn).length} were mid-turn (a begin, the turn, or its completion's stop and checkpoint under way); survived_fraction_not_mid_turn_idle0 = ${idle0.survivedFractionNotMidTurn.toFixed(3)}.`,
    `turn overhead of idle 0 (BeginTurn + CompleteTurn per completed turn): p50 ${percentile(calls0, 50).toFixed(0)} ms / p99 ${percentile(calls0, 99).toFixed(0)} ms (idle 0, ${calls0.length} turns) vs ${percentile(callsNever, 50).toFixed(0)} / ${percentile(callsNever, 99).toFixed(0)} ms (${never === undefined ? 'this run\'s begins on running groups' : `never, ${callsNever.length} turns`}). CompleteTurn alone p50/p99 ${percentile(idle0.completeMs, 50).toFixed(0)}/${percentile(idle0.completeMs, 99).toFixed(0)} ms (idle 0: clean stop + checkpoint before the answer) vs ${never === undefined ? 'n/a' : `${percentile(never.completeMs, 50).toFixed(0)}/${percentile(never.completeMs, 99).toFixed(0)} ms (never)`}; BeginTurn p50/p99 ${percentile(begins0, 50).toFixed(0)}/${percentile(begins0, 99).toFixed(0)} ms (idle 0, ${idle0.beginStoppedMs.length} of ${begins0.length} on stopped groups: container start + attach, p50/p99 ${restartP50.toFixed(0)}/${restartP99.toFixed(0)} ms) vs ${percentile(beginsNever, 50).toFixed(0)}/${percentile(beginsNever, 99).toFixed(0)} ms (running groups). The CLI's own part of a turn is the same in both.`,
    `idle 0 with protect_in_background (setting 0-background: the completion answers first, the clean stop and checkpoint follow it): turn overhead p50 ${bgOverP50.toFixed(0)} ms / p99 ${bgOverP99.toFixed(0)} ms against a restart (BeginTurn on a stopped group) of p50 ${bgRestartP50.toFixed(0)} ms (${bg.beginStoppedMs.length} of ${bg.beginStoppedMs.length + bg.beginRunningMs.length} begins on stopped groups); CompleteTurn p50/p99 ${percentile(bg.completeMs, 50).toFixed(0)}/${percentile(bg.completeMs, 99).toFixed(0)} ms. The price: between an answer and its checkpoint the conversation is unprotected and a host lost then loses it (LOST, reported): ${bg.unprotectedNotMidTurn} of the dead host's ${bg.groupsOnVictim} groups had no turn in flight and were unprotected at the death; survived_fraction_not_mid_turn_idle0_background = ${bg.survivedFractionNotMidTurn.toFixed(3)}.`,
    `spot: ${spot.groups} running groups × ${spot.mibPerGroup} MiB on one host, notice ${spot.noticeMs / 1000} s: ${spot.savedBeforeDeadline} clean-stopped and checkpointed off the host before the deadline as the host reported it (${spot.checkpointedWithinNotice} checkpoints created within the notice), all saved after ${spot.allSavedMs === undefined ? 'n/a' : `${(spot.allSavedMs / 1000).toFixed(1)} s`}, all restored elsewhere after ${spot.allRestoredMs === undefined ? 'n/a' : `${(spot.allRestoredMs / 1000).toFixed(1)} s`}; load ${loadAtSpot.map((x) => x.toFixed(2)).join('/')} at its start. Where the time went (spot_profile, from the groups' events): waiting for a slot p50 ${spot.profile.queuedMs.p50} ms (max ${spot.profile.queuedMs.max}), clean stop p50 ${spot.profile.stopMs.p50} ms (p90 ${spot.profile.stopMs.p90}), checkpoint (capture of ${spot.mibPerGroup} MiB into the chunk store) p50 ${spot.profile.checkpointMs.p50} ms (p90 ${spot.profile.checkpointMs.p90}), at most ${spot.profile.maxConcurrentCheckpoints} checkpoints at once; checkpoints per 5 s after the notice: ${spot.profile.checkpointsPer5s.join(', ')}.`,
  ];
  const busiest = Math.max(run.loadAverageStart[0] ?? 0, loadAtSpot[0] ?? 0);
  if (busiest >= cpus().length) notes.push(`machine busy: 1-min load up to ${busiest.toFixed(2)} on ${cpus().length} cores (other sessions' tests count in it); timings are inflated accordingly.`);
  const result = {
    when: new Date().toISOString(),
    machine: { cpus: cpus().length },
    seed: SEED,
    conversations: CONVERSATIONS,
    real_claude_conversations: REAL_CLAUDE,
    time_compression: COMPRESS,
    survived_fraction_not_mid_turn: fractions,
    survived_fraction_not_mid_turn_idle0: idle0.survivedFractionNotMidTurn,
    survived_fraction_not_mid_turn_idle0_background: bg.survivedFractionNotMidTurn,
    restored_older_than_last_turn: Object.values(runs).reduce((n, r) => n + r.restoredOlderThanLastTurn, 0),
    turn_overhead_p50_ms_idle0: p50Over,
    turn_overhead_p99_ms_idle0: p99Over,
    turn_overhead_p50_ms_idle0_background: bgOverP50,
    turn_overhead_p99_ms_idle0_background: bgOverP99,
    restart_begin_p50_ms_idle0_background: bgRestartP50,
    complete_turn_p50_ms_idle0_background: percentile(bg.completeMs, 50),
    complete_turn_p99_ms_idle0_background: percentile(bg.completeMs, 99),
    turn_overhead_within_restart_idle0_background: bgOverP50 <= bgRestartP50,
    restart_begin_p50_ms: restartP50,
    restart_begin_p99_ms: restartP99,
    begin_p50_ms_idle0: percentile(begins0, 50),
    begin_p50_ms_never: percentile(beginsNever, 50),
    complete_turn_p50_ms_idle0: percentile(idle0.completeMs, 50),
    complete_turn_p99_ms_idle0: percentile(idle0.completeMs, 99),
    complete_turn_p50_ms_never: never === undefined ? null : percentile(never.completeMs, 50),
    complete_turn_p99_ms_never: never === undefined ? null : percentile(never.completeMs, 99),
    turn_calls_p50_ms_idle0: percentile(calls0, 50),
    turn_calls_p99_ms_idle0: percentile(calls0, 99),
    turn_calls_p50_ms_never: percentile(callsNever, 50),
    turn_calls_p99_ms_never: percentile(callsNever, 99),
    spot_groups_saved_30s: spot.savedBeforeDeadline,
    spot_groups: spot.groups,
    spot_mib_per_group: spot.mibPerGroup,
    spot_notice_s: spot.noticeMs / 1000,
    spot_checkpointed_within_notice: spot.checkpointedWithinNotice,
    spot_all_saved_s: spot.allSavedMs === undefined ? null : spot.allSavedMs / 1000,
    spot_all_restored_s: spot.allRestoredMs === undefined ? null : spot.allRestoredMs / 1000,
    spot_bytes_checkpointed: spot.bytesCheckpointed,
    spot_summary: spot.summary,
    spot_lost_reasons: spot.lostReasons,
    spot_profile: spot.profile,
    per_setting: perSetting,
    notes,
  };
  console.log(JSON.stringify(result, null, 2));
  await writeResult(run, result);
}

main().then(() => process.exit(0), (err: unknown) => {
  console.error(err);
  process.exit(1);
});
