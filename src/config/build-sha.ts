// Which exact build this process is (R-H1, R-H7): the git SHA it was built from. Release images
// bake it in at build time as SANDBOXFLEET_BUILD_SHA (Dockerfile: `ARG` → `ENV`, plus the OCI
// label org.opencontainers.image.revision); a dev checkout uses its HEAD. Nothing else counts,
// and no guess is ever made: a process with no known build refuses to start. An agent reporting
// "unknown" would run but never become READY, and a control plane without its SHA would show
// nothing to compare in `sandboxctl verify` — both far from the cause. The Helm chart does not
// set it: a SHA written at deploy time says what the operator believes runs, not what was built.
import { execFileSync } from 'node:child_process';
import { parseGitSha } from '../core/ids.ts';

/** The variable release images bake the build SHA into (both the control plane and the agent). */
export const BUILD_SHA_ENV = 'SANDBOXFLEET_BUILD_SHA';

export interface BuildSha {
  readonly sha: string;
  /** Where it came from: an env variable's name, or `git HEAD`. */
  readonly source: string;
}

/** HEAD of the git checkout at `cwd`, when there is one (dev runs); undefined otherwise. */
export function devCheckoutSha(cwd: string): string | undefined {
  try {
    const sha = execFileSync('git', ['rev-parse', 'HEAD'], { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 5000 }).trim();
    return parseGitSha(sha).ok ? sha : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The build SHA from the first of `vars` that is set (non-empty), else the dev checkout's HEAD at
 * `checkoutDir`. A set variable must hold a full SHA (40 or 64 lowercase hex): a typo or
 * "unknown" is an error, never a fall-through to git. Throws with what to do when nothing is known.
 */
export function resolveBuildSha(
  env: NodeJS.ProcessEnv,
  vars: readonly string[],
  checkoutDir: string,
  readCheckout: (dir: string) => string | undefined = devCheckoutSha,
): BuildSha {
  for (const name of vars) {
    const value = env[name]?.trim();
    if (value === undefined || value === '') continue;
    if (!parseGitSha(value).ok) throw new Error(`${name} must be the exact git SHA of this build (40 or 64 lowercase hex), got ${JSON.stringify(value.slice(0, 80))}`);
    return { sha: value, source: name };
  }
  const head = readCheckout(checkoutDir);
  if (head !== undefined) return { sha: head, source: 'git HEAD' };
  throw new Error(
    `no build SHA: set ${vars.join(' or ')} — release images bake ${BUILD_SHA_ENV} in ` +
      `(docker build --build-arg ${BUILD_SHA_ENV}=$(git rev-parse HEAD)) — or run from a git checkout`,
  );
}
