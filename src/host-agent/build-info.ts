// The agent's build identity (R-H1): the exact git SHA is baked in at build time
// (SANDBOXFLEET_AGENT_SHA); in a dev checkout it is the checkout's HEAD. Never a guess: when neither
// is available the agent reports "unknown", which attestation refuses (agent_sha_unknown).
import { execFileSync } from 'node:child_process';

export function devCheckoutSha(cwd: string): string | undefined {
  try {
    const sha = execFileSync('git', ['rev-parse', 'HEAD'], { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 5000 }).trim();
    return /^(?:[0-9a-f]{40}|[0-9a-f]{64})$/.test(sha) ? sha : undefined;
  } catch {
    return undefined;
  }
}
