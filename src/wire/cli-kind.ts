// CLI kind names ↔ the protobuf CliKind enum, shared by the host agent (container labels,
// manifests) and the control plane (commands). Labels and manifests spell kinds with a dash
// (`claude-code`); core's CliKind uses an underscore (`claude_code`): both are accepted.
import { CLI_KINDS, type CliKind as CoreCliKind } from '../core/turn-end-evidence.ts';
import { CliKind } from '../gen/sandboxfleet/v1/common.ts';

const KIND_NAMES: ReadonlyMap<CliKind, string> = new Map([
  [CliKind.CLAUDE_CODE, 'claude-code'],
  [CliKind.CODEX, 'codex'],
  [CliKind.PI, 'pi'],
  [CliKind.OPENCODE, 'opencode'],
  [CliKind.KILO, 'kilo'],
]);

/** Label/manifest name of a CLI kind; undefined for UNSPECIFIED/unknown values (refused by callers). */
export function cliKindName(kind: CliKind): string | undefined {
  return KIND_NAMES.get(kind);
}

/** Core's CliKind (underscore spelling) of an enum value; undefined for UNSPECIFIED/unknown values. */
export function coreCliKind(kind: CliKind): CoreCliKind | undefined {
  const core = KIND_NAMES.get(kind)?.replaceAll('-', '_');
  return CLI_KINDS.find((k) => k === core);
}

/** The enum value of a label/manifest name or a core CliKind; UNSPECIFIED when unknown. */
export function cliKindFromName(name: string): CliKind {
  const dashed = name.replaceAll('_', '-');
  for (const [kind, n] of KIND_NAMES) if (n === dashed) return kind;
  return CliKind.UNSPECIFIED;
}
