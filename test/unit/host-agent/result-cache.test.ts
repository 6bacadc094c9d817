// The agent's command-result cache (R-H6): a repeat of a command id gets the first answer, except an
// answer the caller says not to keep (a momentary refusal that did nothing), which is judged again.
import { describe, expect, it } from 'vitest';
import { AgentCommand, AgentCommandResult, CommandOutcome } from '../../../src/gen/sandboxfleet/v1/agent.ts';
import { keepResult } from '../../../src/host-agent/command-handler.ts';
import { CommandResultCache } from '../../../src/host-agent/result-cache.ts';

describe('CommandResultCache', () => {
  it('answers a repeat from the first result without running the work again', async () => {
    const cache = new CommandResultCache<string>();
    let runs = 0;
    const work = async () => `answer-${++runs}`;
    expect(await cache.run('c1', work)).toEqual({ result: 'answer-1', repeat: false });
    expect(await cache.run('c1', work)).toEqual({ result: 'answer-1', repeat: true });
    expect(runs).toBe(1);
  });

  it('runs a command again after an answer it was told not to keep', async () => {
    const cache = new CommandResultCache<string>();
    const answers = ['full', 'created'];
    const keep = (r: string) => r !== 'full';
    expect(await cache.run('create-g1', async () => answers.shift()!, keep)).toEqual({ result: 'full', repeat: false });
    expect(await cache.run('create-g1', async () => answers.shift()!, keep)).toEqual({ result: 'created', repeat: false });
    expect(await cache.run('create-g1', async () => 'never', keep)).toEqual({ result: 'created', repeat: true });
    expect(cache.size).toBe(1);
  });
});

describe('which agent answers a repeat gets back (keepResult)', () => {
  const cmd = (command: AgentCommand['command']) => AgentCommand.fromPartial({ commandId: 'c', command });
  const result = (outcome: CommandOutcome, reason = '') => AgentCommandResult.fromPartial({ outcome, reason });
  const stop = cmd({ $case: 'stopGroup', value: { groupId: 'g', graceMs: 1000 } });
  const create = cmd({ $case: 'createGroup', value: { groupId: 'g', conversationId: 'c', members: [], imageRef: '', imageDigest: '' } });

  const start = cmd({ $case: 'startGroup', value: { groupId: 'g', memberIds: [] } });

  it('keeps what was done or refused for good, and a failure of a command not safe to run again', () => {
    expect(keepResult(stop, result(CommandOutcome.OK))).toBe(true);
    expect(keepResult(create, result(CommandOutcome.REFUSED, 'stale_generation'))).toBe(true);
    const restore = AgentCommand.fromPartial({ commandId: 'c', command: { $case: 'restore', value: { groupId: 'g' } } });
    expect(keepResult(restore, result(CommandOutcome.FAILED, 'restore_failed'))).toBe(true);
  });

  it('never keeps a momentary refusal, nor a failed stop (the control plane finishes a stop with the same id)', () => {
    expect(keepResult(create, result(CommandOutcome.REFUSED, 'no_capacity'))).toBe(false);
    expect(keepResult(create, result(CommandOutcome.REFUSED, 'deadline_exceeded'))).toBe(false);
    expect(keepResult(stop, result(CommandOutcome.FAILED, 'stop_failed'))).toBe(false);
  });

  it('never keeps a failed start (its id moves only when a start succeeds, so every retry sends it again)', () => {
    expect(keepResult(start, result(CommandOutcome.FAILED, 'docker_engine_unavailable'))).toBe(false);
    expect(keepResult(start, result(CommandOutcome.OK))).toBe(true);
    expect(keepResult(start, result(CommandOutcome.REFUSED, 'group_not_found'))).toBe(true);
  });

  it('never keeps a failed checkpoint (its id names the state it captures, so every retry sends it again)', () => {
    const checkpoint = cmd({ $case: 'checkpoint', value: { groupId: 'g', checkpointId: 'ck', activityVersion: 1, lastCompletedTurnId: '', members: [], maxManifestSchemaVersion: 2 } });
    expect(keepResult(checkpoint, result(CommandOutcome.FAILED, 'transfer_failed'))).toBe(false);
    expect(keepResult(checkpoint, result(CommandOutcome.REFUSED, 'session_files_missing'))).toBe(true);
    // A layer that breaks a rule breaks it again: kept, not captured and published again per retry.
    expect(keepResult(checkpoint, result(CommandOutcome.FAILED, 'layer_refused'))).toBe(true);
  });

  it('never keeps a failed create (a retry adopts what it made: same name, same identity)', () => {
    expect(keepResult(create, result(CommandOutcome.FAILED, 'docker_engine_unavailable'))).toBe(false);
  });
});
