// What the full-text history checker (history-checker.ts) knows about each pinned CLI: the framing
// its requests carry besides the conversation, by name, as OBSERVED on the pinned versions against
// the loopback fake model API (texts after the checker's normalization rules). A part of a session's
// first request that none of these explains fails the check: that is how an injected prompt or a
// stray fragment in a fresh session is caught; later requests must repeat the frame exactly.
import type { AuxiliaryRequest, Entry, HistoryProfile } from './history-checker.ts';

/** Claude Code 2.1.220 (`claude -p … --output-format stream-json --verbose`). */
export const CLAUDE_CODE_HISTORY: HistoryProfile = {
  cli: 'claude-code 2.1.220',
  rules: [
    // Observed: a session's first process names its model "Opus 5 (1M context)" / `claude-opus-5[1m]`
    // in the system prompt, a resumed process "Opus 5" / `claude-opus-5`; the request's model is
    // `claude-opus-5` both times.
    { name: 'claude-1m-context-label', pattern: / \(1M context\)|\[1m\]/g, replacement: '' },
  ],
  framing: [
    { name: 'billing header', role: 'system', block: /^x-anthropic-billing-header: cc_version=2\.1\.220\.\d+; cc_entrypoint=sdk-cli;$/ },
    { name: 'agent SDK identity', role: 'system', block: /^You are a Claude agent, built on Anthropic's Claude Agent SDK\.$/ },
    { name: 'system prompt', role: 'system', block: /^\nYou are an interactive agent that helps users with software engineering tasks\./ },
    // Before the FIRST prompt of a session only; later prompts come bare.
    { name: 'current-date reminder', role: 'user', block: /^<system-reminder>\nAs you answer the user's questions, you can use the following context:\n# currentDate\nToday's date is <date>\.\n\n {6}IMPORTANT: this context may or may not be relevant to your tasks\. You should not respond to this context unless it is highly relevant to your task\.\n<\/system-reminder>\n\n$/ },
    // A `system` message right after the first prompt (beta mid-conversation-system), kept in place.
    { name: 'agent list', role: 'system', block: /^Available agent types for the Agent tool:\n/ },
  ],
  // Observed: after a turn that kept no answer, the next prompt joins the failed one's message, which
  // gets a newline at its end.
  mergesConsecutiveUser: { appendToPrevious: '\n' },
  reminders: [
    // Observed after some ten turns without task tools, right after the prompt, as a system message.
    { name: 'task tools reminder', role: 'system', block: /^The task tools haven't been used recently\. If you're working on tasks that would benefit from tracking progress, consider using TaskCreate/ },
  ],
};

/** Pi coding agent 0.73.1 (`--mode json -p`, Anthropic Messages provider). */
export const PI_HISTORY: HistoryProfile = {
  cli: 'pi 0.73.1',
  framing: [{ name: 'system prompt', role: 'system', block: /^You are an expert coding assistant operating inside pi, a coding agent harness\./ }],
};

/** Codex 0.171.0 (`codex exec --json`, Responses API). */
export const CODEX_HISTORY: HistoryProfile = {
  cli: 'codex 0.171.0',
  framing: [
    { name: 'base instructions', role: 'developer', block: /^You are a coding agent running in the Codex CLI, a terminal-based coding assistant\./ },
    { name: 'permissions instructions', role: 'developer', block: /^<permissions instructions>\n/ },
    { name: 'skills instructions', role: 'developer', block: /^<skills_instructions>\n/ },
    { name: 'environment context', role: 'user', block: /^<environment_context>\n {2}<cwd>\/<\/cwd>\n/ },
  ],
};

const TITLE_SYSTEM = /^You are a title generator\. You output ONLY a thread title\./;
const isTitle = (entries: readonly Entry[]): boolean => entries[0]?.role === 'system' && entries[0].blocks.length === 1 && TITLE_SYSTEM.test(entries[0].blocks[0] ?? '');

/** OpenCode makes a title request in a session's first turn: the title prompt, then the first prompt quoted. */
const OPENCODE_TITLE: AuxiliaryRequest = {
  name: 'opencode title',
  matches: isTitle,
  expected: (prompts, actual) => [actual[0]!, { role: 'user', blocks: ['Generate a title for this conversation:\n', prompts[0]!] }],
  firstTurnOnly: true,
};

/**
 * Kilo titles the task from the user messages it holds when the (background) title request is made,
 * oldest first, numbered: every prompt so far, or every one but the prompt being answered (observed
 * both, by timing).
 */
const KILO_TITLE: AuxiliaryRequest = {
  name: 'kilo title',
  matches: isTitle,
  expected: (prompts, actual) => [prompts, prompts.slice(0, -1)].filter((ps) => ps.length > 0).map((ps) => [actual[0]!, {
    role: 'user',
    blocks: [`Generate a title for this conversation:\n\nTitle the task, not the reference. When the context is only a link, an issue or ticket number, or a filename, describe the work in general terms instead of restating the reference. Use issue numbers, URLs, or tracker IDs only when the task is specifically about them.\n\nUser messages, oldest to newest:\n${ps.map((p, i) => `${i + 1}. ${p}`).join('\n')}`],
  }]),
  firstTurnOnly: false,
};

/** OpenCode 1.18.33 behind the live bridge (`opencode serve`, Anthropic Messages provider). */
export const OPENCODE_HISTORY: HistoryProfile = {
  cli: 'opencode 1.18.33',
  framing: [{ name: 'system prompt', role: 'system', block: /^You are opencode, an interactive CLI tool that helps users with software engineering tasks\./ }],
  auxiliary: [OPENCODE_TITLE],
  mergesConsecutiveUser: true,
};

/** Kilo CLI 7.7.7 behind the live bridge (`kilo serve`, Anthropic Messages provider). */
export const KILO_HISTORY: HistoryProfile = {
  cli: 'kilo 7.7.7',
  framing: [
    { name: 'system prompt', role: 'system', block: /^You are Kilo, a highly skilled software engineer/ },
    // After EVERY prompt, in the prompt's own message.
    { name: 'environment details', role: 'user', block: /^\n\n<environment_details>\nMessage time: <timestamp>\nWorking directory: \/\nWorkspace root folder: \/\n<\/environment_details>$/, everyPrompt: true },
  ],
  auxiliary: [KILO_TITLE],
  mergesConsecutiveUser: true,
};
