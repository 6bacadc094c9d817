// The command line of one native turn, built by the fleet from a typed request (R-I9): the runner
// names a prompt, maybe a model, and the member's saved locator is resumed; it never passes raw
// flags, so it cannot switch a CLI into another mode, point it at another session or run another
// binary. One function per CLI, each the form verified against the pinned CLI (Claude Code
// `-p … --output-format stream-json --verbose [--resume]`, Pi `--mode json -p [--session]`).
// Pure: the binary and its environment come from the operator's CLI profile.
import { InvalidArgument, PreconditionFailed } from './errors.ts';
import type { CliKind } from './turn-end-evidence.ts';

/** Operator-configured way to run one CLI in member containers. */
export interface CliProfile {
  /** The CLI binary inside the member container (absolute path or a name on its PATH). */
  readonly binary: string;
  /** Extra environment (e.g. the model gateway's base URL); values are the operator's. */
  readonly env: Readonly<Record<string, string>>;
  /** Extra fixed arguments the operator adds (e.g. Pi's provider), placed before the prompt flags. */
  readonly args?: readonly string[];
}

export interface TurnCommandInput {
  readonly prompt: string;
  /** The locator to resume (BeginTurn's); undefined for a NEW member. */
  readonly locator: string | undefined;
  /** The model flag; '' = the CLI's default. */
  readonly model: string;
}

export const MAX_PROMPT_BYTES = 256 * 1024;
const MODEL = /^[A-Za-z0-9._:/-]{1,128}$/;

/** CLIs whose turns the fleet can run itself (OpenCode and Kilo need the live bridge, R-S7). */
export const RUNNABLE_CLIS: readonly CliKind[] = ['claude_code', 'pi'];

export function checkTurnRequest(input: TurnCommandInput): void {
  const bytes = new TextEncoder().encode(input.prompt).length;
  if (bytes === 0 || bytes > MAX_PROMPT_BYTES) throw new InvalidArgument('out_of_range', `prompt must be 1..${MAX_PROMPT_BYTES} bytes`, { details: { field: 'prompt' } });
  if (input.prompt.includes('\0')) throw new InvalidArgument('invalid_characters', 'prompt may not contain NUL', { details: { field: 'prompt' } });
  if (input.model !== '' && !MODEL.test(input.model)) throw new InvalidArgument('invalid_characters', 'model must be 1..128 of A-Za-z0-9._:/-', { details: { field: 'model' } });
}

/** The argv and env of one turn of `cli`, exactly as the pinned CLI takes them. */
export function buildTurnCommand(cli: CliKind, profile: CliProfile, input: TurnCommandInput): { argv: string[]; env: Record<string, string> } {
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
    default:
      throw new PreconditionFailed('cli_unsupported', `the fleet cannot run ${cli} turns itself (drive it with Exec and the SDK's detector)`, { details: { cli } });
  }
}
