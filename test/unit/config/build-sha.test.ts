// The build SHA a process reports (R-H1, R-H7): explicit or baked-in env first, then a dev
// checkout's HEAD, and otherwise a refusal to start with what to do — never "unknown".
import { describe, expect, it } from 'vitest';
import { BUILD_SHA_ENV, resolveBuildSha } from '../../../src/config/build-sha.ts';
import { AGENT_SHA_ENV, agentBuildSha } from '../../../src/host-agent/build-info.ts';

const BAKED = 'b'.repeat(40);
const EXPLICIT = 'e'.repeat(64);
const HEAD = 'a'.repeat(40);
const noCheckout = () => undefined;
const checkout = () => HEAD;

describe('resolveBuildSha', () => {
  it('takes the baked SANDBOXFLEET_BUILD_SHA over the checkout', () => {
    expect(resolveBuildSha({ [BUILD_SHA_ENV]: BAKED }, [BUILD_SHA_ENV], '/x', checkout)).toEqual({ sha: BAKED, source: BUILD_SHA_ENV });
  });

  it('falls back to the dev checkout only when no variable is set', () => {
    expect(resolveBuildSha({}, [BUILD_SHA_ENV], '/x', checkout)).toEqual({ sha: HEAD, source: 'git HEAD' });
    expect(resolveBuildSha({ [BUILD_SHA_ENV]: ' ' }, [BUILD_SHA_ENV], '/x', checkout)).toEqual({ sha: HEAD, source: 'git HEAD' });
  });

  it('refuses to start with no known build instead of reporting "unknown"', () => {
    expect(() => resolveBuildSha({}, [BUILD_SHA_ENV], '/x', noCheckout)).toThrow(/no build SHA: set SANDBOXFLEET_BUILD_SHA .*--build-arg SANDBOXFLEET_BUILD_SHA/);
  });

  it('refuses a set variable that is not a full SHA, without falling through to git', () => {
    for (const bad of ['unknown', 'dev', BAKED.slice(0, 12), BAKED.toUpperCase(), `${BAKED}\n${BAKED}`]) {
      expect(() => resolveBuildSha({ [BUILD_SHA_ENV]: bad }, [BUILD_SHA_ENV], '/x', checkout), bad).toThrow(/SANDBOXFLEET_BUILD_SHA must be the exact git SHA/);
    }
  });
});

describe('agentBuildSha', () => {
  it('prefers an explicit SANDBOXFLEET_AGENT_SHA, then the baked build SHA, then the checkout', () => {
    expect(agentBuildSha({ [AGENT_SHA_ENV]: EXPLICIT, [BUILD_SHA_ENV]: BAKED }, '/x', checkout)).toEqual({ sha: EXPLICIT, source: AGENT_SHA_ENV });
    expect(agentBuildSha({ [BUILD_SHA_ENV]: BAKED }, '/x', checkout)).toEqual({ sha: BAKED, source: BUILD_SHA_ENV });
    expect(agentBuildSha({}, '/x', checkout)).toEqual({ sha: HEAD, source: 'git HEAD' });
    expect(() => agentBuildSha({}, '/x', noCheckout)).toThrow(/set SANDBOXFLEET_AGENT_SHA or SANDBOXFLEET_BUILD_SHA/);
  });
});
