// The attestation probe (R-H1, R-H2) against a real engine and real images: the live-bridge
// version is read from the image label AND from running the image's helper, and the two must agree.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { probeAttestation } from '../../../src/docker/attestation-probe.ts';
import { DockerRuntime, LABELS } from '../../../src/docker/runtime.ts';
import { destroyAll, startDockerHost, type DockerHost } from '../../support/docker.ts';
import { provisionSandboxImage, type SandboxImage } from '../../support/sandbox-image.ts';

let host: DockerHost | undefined;
let rt: DockerRuntime;
let good: SandboxImage;
let old: SandboxImage;
let lying: SandboxImage;
let noHelper: SandboxImage;
let named: SandboxImage;
let chatty: SandboxImage;

beforeAll(async () => {
  host = await startDockerHost({ name: 'attest' });
  const docker = [host.docker];
  rt = new DockerRuntime(host.docker);
  // Sequential: each build imports on the same daemon.
  good = await provisionSandboxImage(docker, { bridgeVersion: 4 });
  old = await provisionSandboxImage(docker, { bridgeVersion: 3 });
  lying = await provisionSandboxImage(docker, { bridgeVersion: 4, helperVersion: 3 });
  noHelper = await provisionSandboxImage(docker, { bridgeVersion: 4, helperVersion: null });
  // The helper's documented form (R-H2, proto BridgeAttestation.helper_output).
  named = await provisionSandboxImage(docker, { bridgeVersion: 4, helperOutput: 'http-agent-live-bridge=4\n', tagSuffix: 'named' });
  // The right line followed by more text: not one line, so not a version.
  chatty = await provisionSandboxImage(docker, { bridgeVersion: 4, helperOutput: 'http-agent-live-bridge=4\nready\n', tagSuffix: 'chatty' });
});

afterAll(async () => {
  await destroyAll([host]);
});

describe('probeAttestation', () => {
  it('reports 4/4 agreeing on the current image, with engine facts and the image id', async () => {
    const p = await probeAttestation(rt, good.reference);
    expect(p).toMatchObject({ labelBridgeVersion: '4', helperBridgeVersion: '4', helperOutput: '4', agree: true, problems: [], imageId: good.imageId, storageDriver: 'overlay2' });
    expect(p.engineVersion).toMatch(/^\d+\.\d+/);
    expect(p.repoTags).toContain(good.reference);
  });

  it('reports 3/3 agreeing on the old helper image (agreement is not admission)', async () => {
    const p = await probeAttestation(rt, old.imageId);
    expect(p).toMatchObject({ labelBridgeVersion: '3', helperBridgeVersion: '3', agree: true, imageId: old.imageId });
  });

  it('catches an image whose label says 4 but whose helper prints 3', async () => {
    const p = await probeAttestation(rt, lying.reference);
    expect(p).toMatchObject({ labelBridgeVersion: '4', helperBridgeVersion: '3', agree: false });
  });

  it('accepts the helper printing `http-agent-live-bridge=4` and keeps that line as printed', async () => {
    const p = await probeAttestation(rt, named.reference);
    expect(p).toMatchObject({ labelBridgeVersion: '4', helperBridgeVersion: '4', helperOutput: 'http-agent-live-bridge=4', agree: true, problems: [] });
  });

  it('refuses a helper that prints more than the one version line, with its reason', async () => {
    const p = await probeAttestation(rt, chatty.reference);
    expect(p).toMatchObject({ labelBridgeVersion: '4', helperBridgeVersion: null, helperOutput: null, agree: false });
    expect(p.problems.map((x) => x.problem)).toEqual(['helper_output_malformed']);
    expect(p.problems[0]!.detail).toContain('ready');
  });

  it('reports a missing helper as a problem, not a version', async () => {
    const p = await probeAttestation(rt, noHelper.reference);
    expect(p.labelBridgeVersion).toBe('4');
    expect(p.helperBridgeVersion).toBeNull();
    expect(p.agree).toBe(false);
    expect(p.problems.map((x) => x.problem)).toEqual(['helper_failed']);
  });

  it('reports an absent image without throwing', async () => {
    const p = await probeAttestation(rt, 'sandboxfleet/sandbox:nope');
    expect(p).toMatchObject({ agree: false, labelBridgeVersion: null, helperBridgeVersion: null });
    expect(p.problems.map((x) => x.problem)).toEqual(['image_not_found']);
  });

  it('leaves no throwaway containers behind', async () => {
    expect(await host!.docker.listContainers({ all: true, filters: { label: [LABELS.oneshot] } })).toEqual([]);
  });
});
