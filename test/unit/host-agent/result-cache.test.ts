// The agent's command-result cache (R-H6): a repeat of a command id gets the first answer, except an
// answer the caller says not to keep (a momentary refusal that did nothing), which is judged again.
import { describe, expect, it } from 'vitest';
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
