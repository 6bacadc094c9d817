// What the agent attests at registration (R-H1, R-H2): build identity (agent SHA baked at build,
// API SHA generated from proto/), engine facts, the sandbox image reference AND the id actually
// present, and the live-bridge version proven two independent ways (the image helper's `--version`
// run in a throwaway container, and the image label). Disagreement is reported as such, never
// resolved here: the control plane recomputes agreement and decides (src/core/attestation.ts).
import { probeAttestation, type AttestationProbe } from '../docker/attestation-probe.ts';
import type { DockerRuntime } from '../docker/runtime.ts';
import { API_SHA } from '../gen/api-sha.ts';
import type { AttestationReport } from '../gen/sandboxfleet/v1/agent.ts';

export interface Attested {
  readonly report: AttestationReport;
  readonly probe: AttestationProbe;
  /** The bridge version both sources agree on; undefined when unproven. */
  readonly provenBridgeVersion: number | undefined;
}

const MAX_OUTPUT = 256;

export async function attest(runtime: DockerRuntime, imageRef: string, agentSha: string, nowMs: () => number): Promise<Attested> {
  const probe = await probeAttestation(runtime, imageRef);
  const helper = probe.helperBridgeVersion ?? '';
  const label = probe.labelBridgeVersion ?? '';
  const agree = probe.agree && helper === label && helper !== '';
  const report: AttestationReport = {
    agentBuildSha: agentSha,
    apiSha: API_SHA,
    engineVersion: probe.engineVersion,
    storageDriver: probe.storageDriver,
    imageRef,
    imageDigest: probe.imageId,
    bridge: {
      helperVersion: helper,
      labelVersion: label,
      agree,
      // The helper's line as printed (`http-agent-live-bridge=4` or `4`), only once the probe
      // validated it; the control plane parses it again itself (R-H2).
      helperOutput: (probe.helperOutput ?? '').slice(0, MAX_OUTPUT),
      // The agent claims only what it proved: nothing when the two sources disagree.
      claimedVersion: agree ? helper : '',
    },
    measuredAtUnixMs: nowMs(),
  };
  return { report, probe, provenBridgeVersion: agree ? Number(helper) : undefined };
}
