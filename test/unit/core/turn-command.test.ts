// The command lines the fleet builds for native turns (R-I9): one process per turn, and the turn
// process kept between turns with the input each turn writes to it. Built from a typed request only:
// a prompt can never become a flag, another mode or another session; the kept process's identity
// leaves out the resumed locator (a RESTORED process is started the same way) but not the model.
import { describe, expect, it } from 'vitest';
import { buildTurnCommand, buildTurnProcessCommand, keepsTurnProcess, turnInput, type CliProfile } from '../../../src/core/index.ts';

const profile: CliProfile = { binary: '/usr/local/bin/claude', env: { ANTHROPIC_BASE_URL: 'http://127.0.0.1:1' } };
const LOC = '11111111-2222-4333-8444-555555555555';

describe('one process per turn', () => {
  it('puts the prompt after `--`, so a prompt that looks like a flag stays a prompt', () => {
    expect(buildTurnCommand('claude_code', profile, { prompt: '--resume x', locator: LOC, model: '' }).argv).toEqual(['/usr/local/bin/claude', '-p', '--output-format', 'stream-json', '--verbose', '--resume', LOC, '--', '--resume x']);
    expect(buildTurnCommand('pi', { binary: 'pi', env: {}, args: ['--provider', 'fake'] }, { prompt: 'hi', locator: undefined, model: 'm-1' }).argv).toEqual(['pi', '--provider', 'fake', '--mode', 'json', '-p', '--model', 'm-1', '--', 'hi']);
  });
});

describe('turn processes kept between turns', () => {
  it('starts Claude Code in stream-json input mode with eager flush, resuming the saved locator', () => {
    const c = buildTurnProcessCommand('claude_code', profile, { locator: LOC, model: 'claude-x' });
    expect(c.argv).toEqual(['/usr/local/bin/claude', '-p', '--input-format', 'stream-json', '--output-format', 'stream-json', '--verbose', '--model', 'claude-x', '--resume', LOC]);
    // The session must be on disk when the turn's `result` arrives (a stop may kill the process next).
    expect(c.env).toEqual({ ANTHROPIC_BASE_URL: 'http://127.0.0.1:1', CLAUDE_CODE_EAGER_FLUSH: '1' });
    expect(buildTurnProcessCommand('claude_code', { ...profile, env: { CLAUDE_CODE_EAGER_FLUSH: '0' } }, { locator: undefined, model: '' }).env.CLAUDE_CODE_EAGER_FLUSH).toBe('1');
  });

  it('starts Pi in RPC mode, resuming the saved session', () => {
    expect(buildTurnProcessCommand('pi', { binary: 'pi', env: {}, args: ['--provider', 'fake'] }, { locator: LOC, model: '' }).argv).toEqual(['pi', '--provider', 'fake', '--mode', 'rpc', '--session', LOC]);
  });

  it('identifies a process by its command without the locator: the same for NEW and RESTORED, another for another model or profile', () => {
    const id = (locator: string | undefined, model: string, p: CliProfile = profile) => buildTurnProcessCommand('claude_code', p, { locator, model }).identity;
    expect(id(undefined, '')).toBe(id(LOC, ''));
    expect(id(LOC, 'other-model')).not.toBe(id(LOC, ''));
    expect(id(LOC, '', { ...profile, env: { ANTHROPIC_BASE_URL: 'http://127.0.0.1:2' } })).not.toBe(id(LOC, ''));
    expect(buildTurnProcessCommand('pi', profile, { locator: undefined, model: '' }).identity).not.toBe(id(undefined, ''));
  });

  it('writes one turn as JSON lines: a Claude user message; Pi get_state, then the prompt, tagged with the turn', () => {
    const prompt = 'line one\n"quoted" \u2028 and more';
    const claude = turnInput('claude_code', prompt, 't-1');
    expect(claude.endsWith('\n')).toBe(true);
    expect(claude.slice(0, -1)).not.toContain('\n');
    expect(JSON.parse(claude)).toEqual({ type: 'user', message: { role: 'user', content: [{ type: 'text', text: prompt }] } });
    const pi = turnInput('pi', prompt, 't-1').split('\n');
    expect(pi).toHaveLength(3);
    expect(pi.slice(0, 2).map((l) => JSON.parse(l) as unknown)).toEqual([{ id: 't-1-state', type: 'get_state' }, { id: 't-1', type: 'prompt', message: prompt }]);
    expect(pi[2]).toBe('');
  });

  it('refuses CLIs it cannot keep, bad models and bad prompts; keepProcess: false turns it off', () => {
    expect(() => buildTurnProcessCommand('codex', profile, { locator: undefined, model: '' })).toThrow(expect.objectContaining({ reason: 'cli_unsupported' }));
    expect(() => buildTurnProcessCommand('claude_code', profile, { locator: undefined, model: 'gpt; rm -rf /' })).toThrow(expect.objectContaining({ reason: 'invalid_characters' }));
    expect(() => turnInput('claude_code', '', 't')).toThrow(expect.objectContaining({ reason: 'out_of_range' }));
    expect([keepsTurnProcess('claude_code', profile), keepsTurnProcess('pi', { ...profile, keepProcess: false }), keepsTurnProcess('codex', profile)]).toEqual([true, false, false]);
  });
});
