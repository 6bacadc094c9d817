// The command line of native turns, built by the fleet from a typed request (R-I9): the runner
// names a prompt, maybe a model, and the member's saved locator is resumed; it never passes raw
// flags, so it cannot switch a CLI into another mode, point it at another session or run another
// binary. What RunTurn runs, per CLI, each form verified against the pinned CLI:
// - one process per turn: Claude Code `-p … --output-format stream-json --verbose [--resume]`,
//   Pi `--mode json -p [--session]`, Codex `exec --json` (NEW) and `exec resume --json -- <thread>`
//   (a saved locator), the prompt read from stdin (`-`; 0.171.0 sends it byte for byte), so no
//   prompt can become a flag or the `resume` subcommand and a long prompt is not bound by the
//   kernel's 128 KiB limit on one argument; `--skip-git-repo-check`: a member's working directory
//   need not be a git repository;
// - a turn process kept between turns (R-S1 LIVE; Claude Code and Pi only): Claude Code `-p
//   --input-format stream-json --output-format stream-json --verbose [--resume]` takes one user
//   message per JSON line on stdin and answers each with its own `system/init` … `result` (2.1.220:
//   two messages, one process, the second request carries the first exchange once); Pi `--mode rpc
//   [--session]` takes `get_state` (its answer names the session) and `prompt` commands, one
//   `agent_end` per prompt (0.73.1).
// Codex is run one process per turn only: its `app-server` also takes several turns in one process
// (codex-app-server.test.ts), but over a JSON-RPC handshake (initialize, thread/start or
// thread/resume, then turn/start by thread id) the fleet does not drive, so a Codex profile asking
// for keepProcess: true is refused `cli_unsupported`. OpenCode and Kilo need the live bridge
// (R-S7): refused `cli_unsupported`.
// Pure: the binary and its environment come from the operator's CLI profile.
import { InvalidArgument, PreconditionFailed } from './errors.ts';
import type { CliKind } from './turn-end-evidence.ts';

/** Operator-configured way to run one CLI in member containers. */
export interface CliProfile {
  /** The CLI binary inside the member container (absolute path or a name on its PATH). */
  readonly binary: string;
  /** Extra environment (e.g. the model gateway's base URL); values are the operator's. */
  readonly env: Readonly<Record<string, string>>;
  /**
   * Extra fixed arguments the operator adds (e.g. Pi's provider), placed right after the binary,
   * before the fleet's flags. Codex: options of `codex` itself, before `exec` (e.g. `-c key=value`),
   * so a new and a resumed turn take them alike.
   */
  readonly args?: readonly string[];
  /**
   * Keep the CLI running between turns (a turn process, LIVE next turn); default true for the CLIs
   * that can (TURN_PROCESS_CLIS). False: one process per turn (less memory held by idle members;
   * every turn after the first is RESTORED). Codex always runs one process per turn: true is refused.
   */
  readonly keepProcess?: boolean;
}

export interface TurnCommandInput {
  readonly prompt: string;
  /** The locator to resume (BeginTurn's); undefined for a NEW member. */
  readonly locator: string | undefined;
  /** The model flag; '' = the CLI's default. */
  readonly model: string;
}

/**
 * Claude Code and Pi take the prompt as one command-line argument, and Linux refuses an argument
 * of MAX_ARG_STRLEN (128 KiB) bytes or more, its terminating NUL included: a longer prompt would
 * pass validation and then fail to start ("Argument list too long"), so it is refused up front.
 */
export const MAX_PROMPT_BYTES = 128 * 1024 - 1;
const MODEL = /^[A-Za-z0-9._:/-]{1,128}$/;

/** CLIs whose turns the fleet can run itself (OpenCode and Kilo need the live bridge, R-S7). */
export const RUNNABLE_CLIS: readonly CliKind[] = ['claude_code', 'pi', 'codex'];

/** Why a Codex profile may not ask to keep its process (see the header). */
export const CODEX_KEEP_REFUSED = 'the fleet runs Codex one `codex exec` process per turn; its persistent form (the app-server\'s JSON-RPC) is not driven by the fleet: leave keepProcess out of the codex profile (or set it false)';

/** CLIs the fleet can keep running between turns (see the header). */
export const TURN_PROCESS_CLIS: readonly CliKind[] = ['claude_code', 'pi'];

/** Whether RunTurn keeps `cli`'s process between turns with this profile. */
export function keepsTurnProcess(cli: CliKind, profile: CliProfile): boolean {
  return TURN_PROCESS_CLIS.includes(cli) && profile.keepProcess !== false;
}

export function checkTurnRequest(input: TurnCommandInput): void {
  const bytes = new TextEncoder().encode(input.prompt).length;
  if (bytes === 0 || bytes > MAX_PROMPT_BYTES) throw new InvalidArgument('out_of_range', `prompt must be 1..${MAX_PROMPT_BYTES} bytes`, { details: { field: 'prompt' } });
  if (input.prompt.includes('\0')) throw new InvalidArgument('invalid_characters', 'prompt may not contain NUL', { details: { field: 'prompt' } });
  if (input.model !== '' && !MODEL.test(input.model)) throw new InvalidArgument('invalid_characters', 'model must be 1..128 of A-Za-z0-9._:/-', { details: { field: 'model' } });
}

/** One turn's process: its argv and env, and what to write to its stdin (then closed), if anything. */
export interface TurnCommand {
  readonly argv: string[];
  readonly env: Record<string, string>;
  /** The prompt, for a CLI that reads it from stdin (Codex); undefined: stdin is not attached. */
  readonly stdin?: string;
}

/** The argv and env of one turn of `cli`, exactly as the pinned CLI takes them. */
export function buildTurnCommand(cli: CliKind, profile: CliProfile, input: TurnCommandInput): TurnCommand {
  checkTurnRequest(input);
  const fixed = [...(profile.args ?? [])];
  const model = input.model !== '' ? ['--model', input.model] : [];
  switch (cli) {
    case 'claude_code':
      // `--` ends the options: a prompt that starts with "-" is never read as a flag.
      return {
        argv: [profile.binary, ...fixed, '-p', '--output-format', 'stream-json', '--verbose', ...model, ...(input.locator !== undefined ? ['--resume', input.locator] : []), '--', input.prompt],
        env: { ...profile.env },
      };
    case 'pi':
      return {
        argv: [profile.binary, ...fixed, '--mode', 'json', '-p', ...model, ...(input.locator !== undefined ? ['--session', input.locator] : []), '--', input.prompt],
        env: { ...profile.env },
      };
    case 'codex':
      if (profile.keepProcess === true) throw new PreconditionFailed('cli_unsupported', CODEX_KEEP_REFUSED, { details: { cli } });
      // `--` before the thread id: nothing after it is read as an option (a locator never starts
      // with "-" anyway, core ids.ts). `-`: the prompt is read from stdin, to its end.
      return {
        argv: [
          profile.binary, ...fixed, 'exec', ...(input.locator !== undefined ? ['resume'] : []), '--json', '--skip-git-repo-check', ...model,
          ...(input.locator !== undefined ? ['--', input.locator] : []), '-',
        ],
        env: { ...profile.env },
        stdin: input.prompt,
      };
    default:
      throw new PreconditionFailed('cli_unsupported', `the fleet cannot run ${cli} turns itself (drive it with Exec and the SDK's detector)`, { details: { cli } });
  }
}

/** A CLI started as a turn process: it reads its turns from stdin (turnInput). */
export interface TurnProcessCommand {
  readonly argv: string[];
  readonly env: Record<string, string>;
  /**
   * What makes two turn processes interchangeable: the command without the resumed locator (binary,
   * fixed arguments, model, environment). A kept process is reused only by a turn that would have
   * started the same one; another model or profile starts a new process (RESTORED).
   */
  readonly identity: string;
}

/** The argv and env that start `cli` as a turn process resuming `locator` (none for a NEW member). */
export function buildTurnProcessCommand(cli: CliKind, profile: CliProfile, input: { readonly locator: string | undefined; readonly model: string }): TurnProcessCommand {
  if (input.model !== '' && !MODEL.test(input.model)) throw new InvalidArgument('invalid_characters', 'model must be 1..128 of A-Za-z0-9._:/-', { details: { field: 'model' } });
  const fixed = [...(profile.args ?? [])];
  const model = input.model !== '' ? ['--model', input.model] : [];
  const env: Record<string, string> = { ...profile.env };
  let base: string[];
  let resume: string[];
  switch (cli) {
    case 'claude_code':
      base = [profile.binary, ...fixed, '-p', '--input-format', 'stream-json', '--output-format', 'stream-json', '--verbose', ...model];
      resume = input.locator !== undefined ? ['--resume', input.locator] : [];
      // R-S5 (b): a kept Claude writes a turn's messages to its session file some 100-300 ms AFTER
      // the `result` (2.1.220; `-p` flushes at exit), so a container stopped right after the turn (a
      // stop, a migration) lost the last answer. With eager flush it writes them before the `result`:
      // the CLI's own end then also means the turn is on disk. The fleet's setting wins.
      env.CLAUDE_CODE_EAGER_FLUSH = '1';
      break;
    case 'pi':
      base = [profile.binary, ...fixed, '--mode', 'rpc', ...model];
      resume = input.locator !== undefined ? ['--session', input.locator] : [];
      break;
    case 'codex':
      throw new PreconditionFailed('cli_unsupported', CODEX_KEEP_REFUSED, { details: { cli } });
    default:
      throw new PreconditionFailed('cli_unsupported', `the fleet cannot keep ${cli} running between turns`, { details: { cli } });
  }
  const identity = JSON.stringify({ cli, argv: base, env: Object.keys(env).sort().map((k) => [k, env[k]]) });
  return { argv: [...base, ...resume], env, identity };
}

/**
 * What one turn writes to a turn process's stdin: JSON lines, each ending in a newline (Claude Code:
 * one user message; Pi: `get_state`, whose answer names the session before the turn's end, then
 * `prompt`). `turnId` tags Pi's commands so their answers belong to this turn.
 */
export function turnInput(cli: CliKind, prompt: string, turnId: string): string {
  checkTurnRequest({ prompt, locator: undefined, model: '' });
  switch (cli) {
    case 'claude_code':
      return `${JSON.stringify({ type: 'user', message: { role: 'user', content: [{ type: 'text', text: prompt }] } })}\n`;
    case 'pi':
      return `${JSON.stringify({ id: `${turnId}-state`, type: 'get_state' })}\n${JSON.stringify({ id: turnId, type: 'prompt', message: prompt })}\n`;
    default:
      throw new PreconditionFailed('cli_unsupported', `the fleet cannot keep ${cli} running between turns`, { details: { cli } });
  }
}
