// The command lines the fleet builds for native turns (R-I9): one process per turn, and the turn
// process kept between turns with the input each turn writes to it. Built from a typed request only:
// a prompt can never become a flag, another mode or another session (Codex: the prompt goes to
// stdin, never into argv, so it cannot become the `resume` subcommand either); the kept process's
// identity leaves out the resumed locator (a RESTORED process is started the same way) but not the
// model. Codex runs one process per turn only.
import { execFileSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { MAX_PROMPT_BYTES, RUNNABLE_CLIS, buildTurnCommand, buildTurnProcessCommand, keepsTurnProcess, turnInput, type CliProfile } from '../../../src/core/index.ts';

const profile: CliProfile = { binary: '/usr/local/bin/claude', env: { ANTHROPIC_BASE_URL: 'http://127.0.0.1:1' } };
const LOC = '11111111-2222-4333-8444-555555555555';

describe('one process per turn', () => {
  it('puts the prompt after `--`, so a prompt that looks like a flag stays a prompt', () => {
    expect(buildTurnCommand('claude_code', profile, { prompt: '--resume x', locator: LOC, model: '' }).argv).toEqual(['/usr/local/bin/claude', '-p', '--output-format', 'stream-json', '--verbose', '--resume', LOC, '--', '--resume x']);
    expect(buildTurnCommand('pi', { binary: 'pi', env: {}, args: ['--provider', 'fake'] }, { prompt: 'hi', locator: undefined, model: 'm-1' }).argv).toEqual(['pi', '--provider', 'fake', '--mode', 'json', '-p', '--model', 'm-1', '--', 'hi']);
  });
});

describe('Codex, one `codex exec --json` process per turn', () => {
  const codex: CliProfile = { binary: '/usr/local/bin/codex', env: { HOME: '/root' }, args: ['-c', 'model_provider="fake"'] };

  it('starts a NEW thread with `exec --json`, the operator\'s options before `exec`, the prompt on stdin', () => {
    expect(buildTurnCommand('codex', codex, { prompt: 'resume', locator: undefined, model: '' })).toEqual({
      argv: ['/usr/local/bin/codex', '-c', 'model_provider="fake"', 'exec', '--json', '--skip-git-repo-check', '-'],
      env: { HOME: '/root' },
      stdin: 'resume',
    });
  });

  it('resumes the saved thread with `exec resume`, the thread id after `--`; a prompt that looks like a flag stays on stdin', () => {
    const c = buildTurnCommand('codex', codex, { prompt: '--dangerously-bypass-approvals-and-sandbox', locator: LOC, model: 'gpt-5.1' });
    expect(c.argv).toEqual(['/usr/local/bin/codex', '-c', 'model_provider="fake"', 'exec', 'resume', '--json', '--skip-git-repo-check', '--model', 'gpt-5.1', '--', LOC, '-']);
    expect(c.stdin).toBe('--dangerously-bypass-approvals-and-sandbox');
    expect(c.argv).not.toContain(c.stdin);
  });

  it('is runnable, never kept: keepProcess true is refused with the reason, a turn process is refused', () => {
    expect(RUNNABLE_CLIS).toContain('codex');
    expect(keepsTurnProcess('codex', codex)).toBe(false);
    expect(() => buildTurnCommand('codex', { ...codex, keepProcess: true }, { prompt: 'hi', locator: undefined, model: '' })).toThrow(expect.objectContaining({ reason: 'cli_unsupported', message: expect.stringContaining('one `codex exec` process per turn') }));
    expect(buildTurnCommand('codex', { ...codex, keepProcess: false }, { prompt: 'hi', locator: undefined, model: '' }).stdin).toBe('hi');
    expect(() => buildTurnProcessCommand('codex', codex, { locator: undefined, model: '' })).toThrow(expect.objectContaining({ reason: 'cli_unsupported' }));
    expect(() => turnInput('codex', 'hi', 't')).toThrow(expect.objectContaining({ reason: 'cli_unsupported' }));
  });

  it('checks the prompt and the model as for every CLI; Claude Code and Pi take no stdin', () => {
    expect(() => buildTurnCommand('codex', codex, { prompt: '', locator: undefined, model: '' })).toThrow(expect.objectContaining({ reason: 'out_of_range' }));
    expect(() => buildTurnCommand('codex', codex, { prompt: 'a\0b', locator: undefined, model: '' })).toThrow(expect.objectContaining({ reason: 'invalid_characters' }));
    expect(() => buildTurnCommand('codex', codex, { prompt: 'hi', locator: undefined, model: 'x y' })).toThrow(expect.objectContaining({ reason: 'invalid_characters' }));
    expect(buildTurnCommand('claude_code', profile, { prompt: 'hi', locator: undefined, model: '' }).stdin).toBeUndefined();
    expect(() => buildTurnCommand('opencode', profile, { prompt: 'hi', locator: undefined, model: '' })).toThrow(expect.objectContaining({ reason: 'cli_unsupported' }));
  });
});

describe('the longest prompt', () => {
  it('is one command-line argument Linux still takes (Claude Code and Pi get it in argv); one byte more is refused before anything starts', () => {
    const longest = 'p'.repeat(MAX_PROMPT_BYTES);
    const argv = buildTurnCommand('claude_code', profile, { prompt: longest, locator: undefined, model: '' }).argv;
    expect(argv.at(-1)).toBe(longest);
    // A real execve with that argument (the kernel's MAX_ARG_STRLEN, not a number restated here).
    expect(() => execFileSync('/bin/true', [argv.at(-1)!])).not.toThrow();
    expect(() => execFileSync('/bin/true', [`${longest}p`])).toThrow(/E2BIG|too long/);
    expect(() => buildTurnCommand('pi', profile, { prompt: `${longest}p`, locator: undefined, model: '' })).toThrow(expect.objectContaining({ reason: 'out_of_range' }));
    // Bytes, not characters: a multi-byte character counts for its bytes.
    expect(() => buildTurnCommand('pi', profile, { prompt: `${'p'.repeat(MAX_PROMPT_BYTES - 1)}é`, locator: undefined, model: '' })).toThrow(expect.objectContaining({ reason: 'out_of_range' }));
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
