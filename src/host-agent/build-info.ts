// The agent's build identity (R-H1): the exact git SHA it was built from. An explicit
// SANDBOXFLEET_AGENT_SHA (tests, the local fleet) wins; then SANDBOXFLEET_BUILD_SHA, which release
// images bake in (Dockerfile); then a dev checkout's HEAD. Never a guess: with none of them the
// agent refuses to start (src/config/build-sha.ts) instead of registering as "unknown", which
// attestation would refuse (agent_sha_unknown) with the cause far away in the image build.
import { BUILD_SHA_ENV, resolveBuildSha, type BuildSha } from '../config/build-sha.ts';

export const AGENT_SHA_ENV = 'SANDBOXFLEET_AGENT_SHA';

export function agentBuildSha(env: NodeJS.ProcessEnv, checkoutDir: string, readCheckout?: (dir: string) => string | undefined): BuildSha {
  return resolveBuildSha(env, [AGENT_SHA_ENV, BUILD_SHA_ENV], checkoutDir, readCheckout);
}
