// Host attestation probe (R-H1, R-H2): what the host agent reports about its engine and sandbox
// image, proven rather than asserted. The live-bridge version is read twice, independently: from
// the image label `http-agent-live-bridge` and by running the image's own helper
// (`/usr/local/bin/live-bridge --version`) in a throwaway container with no network. The control
// plane admits the host only if both agree and equal the required version; this module only
// gathers evidence and says whether the two sources agree. Every step is time-bounded.
import { DockerRuntimeError } from './errors.ts';
import type { DockerRuntime } from './runtime.ts';

export const LIVE_BRIDGE_LABEL = 'http-agent-live-bridge';
export const LIVE_BRIDGE_HELPER = '/usr/local/bin/live-bridge';
/** The label value: a bare version number. */
const VERSION_RE = /^[0-9]{1,9}$/;
/**
 * The helper's `--version` line: `http-agent-live-bridge=4` (the form R-H2 and the proto
 * describe) or a bare `4`. Nothing else: no second line, no other text, no surrounding spaces.
 */
const HELPER_LINE_RE = new RegExp(`^(?:${LIVE_BRIDGE_LABEL}=)?([0-9]{1,9})$`);
/** Longest accepted line; anything longer is refused before the pattern runs. */
export const MAX_HELPER_LINE = 64;

export type HelperVersionParse = { readonly ok: true; readonly version: string; readonly line: string } | { readonly ok: false; readonly detail: string };

/**
 * Read the version from the helper's stdout: exactly one line (one trailing newline allowed),
 * at most MAX_HELPER_LINE characters, in one of the two forms of HELPER_LINE_RE. A helper that
 * prints anything more is not trusted to have meant a version.
 */
export function parseHelperVersionOutput(stdout: string): HelperVersionParse {
  const line = stdout.endsWith('\r\n') ? stdout.slice(0, -2) : stdout.endsWith('\n') ? stdout.slice(0, -1) : stdout;
  const shown = JSON.stringify(stdout.slice(0, 200));
  if (line.length > MAX_HELPER_LINE) return { ok: false, detail: `${line.length} characters (at most ${MAX_HELPER_LINE}): ${shown}` };
  const m = HELPER_LINE_RE.exec(line);
  if (m === null) return { ok: false, detail: `not "${LIVE_BRIDGE_LABEL}=<n>" or "<n>" on one line: ${shown}` };
  return { ok: true, version: m[1]!, line };
}

/** Why a version source gave no value; machine-readable for refusals and metrics. */
export type ProbeProblem =
  | 'label_missing'
  | 'label_malformed'
  | 'helper_failed'
  | 'helper_timeout'
  | 'helper_output_malformed'
  | 'image_not_found';

export interface AttestationProbe {
  readonly engineVersion: string;
  readonly storageDriver: string;
  /** The image id (config digest, `sha256:…`) the probe ran against. */
  readonly imageId: string;
  readonly repoTags: readonly string[];
  /** Registry digests, when the image came from a registry (empty for loaded archives). */
  readonly repoDigests: readonly string[];
  /** Version from the image label; null when missing or malformed. */
  readonly labelBridgeVersion: string | null;
  /** Version printed by the image's helper; null when it could not be run or printed garbage. */
  readonly helperBridgeVersion: string | null;
  /** The helper's accepted output line as printed (e.g. `http-agent-live-bridge=4`); null with helperBridgeVersion. */
  readonly helperOutput: string | null;
  /** Both sources present and equal. */
  readonly agree: boolean;
  readonly problems: readonly { readonly problem: ProbeProblem; readonly detail: string }[];
}

export interface ProbeOptions {
  /** Bound on the helper run (create + start + wait + logs + remove). */
  readonly helperTimeoutMs?: number;
}

/** Probe an image on this engine. Throws only when the engine itself is unusable. */
export async function probeAttestation(runtime: DockerRuntime, imageRef: string, options: ProbeOptions = {}): Promise<AttestationProbe> {
  const problems: { problem: ProbeProblem; detail: string }[] = [];
  const engine = await runtime.engineInfo();
  let image;
  try {
    image = await runtime.imageInfo(imageRef);
  } catch (err) {
    if (err instanceof DockerRuntimeError && err.reason === 'image_not_found') {
      return {
        engineVersion: engine.version,
        storageDriver: engine.storageDriver,
        imageId: '',
        repoTags: [],
        repoDigests: [],
        labelBridgeVersion: null,
        helperBridgeVersion: null,
        helperOutput: null,
        agree: false,
        problems: [{ problem: 'image_not_found', detail: err.message }],
      };
    }
    throw err;
  }

  let labelBridgeVersion: string | null = null;
  const label = image.labels[LIVE_BRIDGE_LABEL];
  if (label === undefined) problems.push({ problem: 'label_missing', detail: `image ${image.id} has no ${LIVE_BRIDGE_LABEL} label` });
  else if (!VERSION_RE.test(label.trim())) problems.push({ problem: 'label_malformed', detail: `label ${LIVE_BRIDGE_LABEL}=${JSON.stringify(label)}` });
  else labelBridgeVersion = label.trim();

  let helperBridgeVersion: string | null = null;
  let helperOutput: string | null = null;
  try {
    // Run by pinned id, not by the reference: the helper must come from exactly the probed image.
    const run = await runtime.runOnce({
      imageId: image.id,
      cmd: [LIVE_BRIDGE_HELPER, '--version'],
      networkMode: 'none',
      timeoutMs: options.helperTimeoutMs ?? 20_000,
      maxOutputBytes: 4096,
    });
    const parsed = parseHelperVersionOutput(run.stdout);
    if (run.exitCode !== 0) problems.push({ problem: 'helper_failed', detail: `exit ${run.exitCode}: ${run.stderr.trim().slice(0, 200)}` });
    else if (!parsed.ok) problems.push({ problem: 'helper_output_malformed', detail: parsed.detail });
    else {
      helperBridgeVersion = parsed.version;
      helperOutput = parsed.line;
    }
  } catch (err) {
    if (!(err instanceof DockerRuntimeError) || err.reason === 'engine_unavailable') throw err;
    problems.push({ problem: err.reason === 'timeout' ? 'helper_timeout' : 'helper_failed', detail: err.message.slice(0, 300) });
  }

  return {
    engineVersion: engine.version,
    storageDriver: engine.storageDriver,
    imageId: image.id,
    repoTags: image.repoTags,
    repoDigests: image.repoDigests,
    labelBridgeVersion,
    helperBridgeVersion,
    helperOutput,
    agree: labelBridgeVersion !== null && labelBridgeVersion === helperBridgeVersion,
    problems,
  };
}
