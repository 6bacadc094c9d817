// `sandboxctl verify` (R-H7) over a loopback AdminService that answers what the control plane would:
// the table shows the EXACT agent and API SHAs (a 12-character prefix can hide a mismatch), the
// expected ones are printed in full, and any mismatch — agent SHA or API SHA — exits 1.
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from '../../../src/cli/commands.ts';
import { AdminServiceService, HostVerification, VerifyResponse, type AdminServiceServer } from '../../../src/gen/sandboxfleet/v1/admin.ts';
import { HostState } from '../../../src/gen/sandboxfleet/v1/common.ts';

// Allowed and running SHAs share their first 12 characters: only the exact values tell them apart.
const ALLOWED_AGENT = `${'a'.repeat(12)}${'b'.repeat(28)}`;
const RUNNING_AGENT = `${'a'.repeat(12)}${'c'.repeat(28)}`;
const API = `${'d'.repeat(12)}${'e'.repeat(52)}`;
const OTHER_API = `${'d'.repeat(12)}${'f'.repeat(52)}`;
const CP_BUILD = '0123456789abcdef0123456789abcdef01234567';
const IMAGE = `sha256:${'9'.repeat(64)}`;

function host(over: Partial<HostVerification>): HostVerification {
  return HostVerification.fromPartial({
    hostId: 'host-a', state: HostState.READY,
    agentBuildSha: ALLOWED_AGENT, agentBuildShaOk: true, apiSha: API, apiShaOk: true, imageDigest: IMAGE, imageDigestOk: true,
    bridgeVersion: 4, bridgeVersionOk: true, probe: { ok: true, roundTripMs: 3, callbackRoundTripMs: 1, answeredBy: 'cp-1', error: '' },
    heartbeatAgeMs: 500, heartbeatOk: true, ok: true, mismatches: [],
    ...over,
  });
}

let answer: VerifyResponse;
const server = new grpc.Server();
let port = 0;

beforeAll(async () => {
  const unimplemented = (_call: unknown, callback: grpc.sendUnaryData<never>): void => callback({ code: grpc.status.UNIMPLEMENTED });
  const impl: AdminServiceServer = {
    listHosts: unimplemented, getHost: unimplemented, drainHost: unimplemented, removeHost: unimplemented, listGroups: unimplemented,
    getGroup: unimplemented, migrateGroup: unimplemented, destroyGroup: unimplemented, listCheckpoints: unimplemented,
    verify: (_call, callback) => callback(null, answer),
    listEvents: (call) => call.end(),
  };
  server.addService(AdminServiceService, impl);
  port = await new Promise<number>((resolve, reject) => server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))));
});

afterAll(async () => {
  await new Promise<void>((resolve) => server.tryShutdown(() => resolve()));
});

async function verify(hosts: HostVerification[]): Promise<{ code: number; out: string; err: string }> {
  answer = VerifyResponse.fromPartial({
    allowedAgentBuildShas: [ALLOWED_AGENT], expectedApiSha: API, allowedImageDigests: [IMAGE], expectedBridgeVersion: 4,
    controlPlaneBuildSha: CP_BUILD, controlPlaneReplica: 'cp-1', hosts, ok: hosts.every((h) => h.ok),
  });
  let out = '';
  let err = '';
  const code = await runCli(['--insecure', '--server', `127.0.0.1:${port}`, 'verify'], { out: (t) => (out += `${t}\n`), err: (t) => (err += `${t}\n`) }, {});
  return { code, out, err };
}

/** The table row of a host, split on the column padding. */
function row(out: string, hostId: string): string[] {
  const line = out.split('\n').find((l) => l.startsWith(`${hostId} `));
  if (line === undefined) throw new Error(`no row for ${hostId} in:\n${out}`);
  return line.split(/\s{2,}/);
}

describe('sandboxctl verify', () => {
  it('passes on a matching fleet and prints every SHA in full', async () => {
    const r = await verify([host({})]);
    expect(r.err).toBe('');
    expect(r.code).toBe(0);
    expect(r.out).toContain(`build ${CP_BUILD}`);
    expect(r.out).toContain(`expected api sha:   ${API}`);
    expect(r.out).toContain(`allowed agent shas: ${ALLOWED_AGENT}`);
    expect(row(r.out, 'host-a').slice(2, 4)).toEqual([ALLOWED_AGENT, API]);
    expect(r.out).toContain('verify: OK');
  });

  it('exits 1 on an agent SHA mismatch, showing the exact running SHA next to the allowed one', async () => {
    const r = await verify([host({ agentBuildSha: RUNNING_AGENT, agentBuildShaOk: false, ok: false, mismatches: [`agent_sha: ${RUNNING_AGENT} not in the allowed set`] })]);
    expect(r.code).toBe(1);
    expect(row(r.out, 'host-a')[2]).toBe(`${RUNNING_AGENT} ✗`);
    expect(r.out).toContain(`allowed agent shas: ${ALLOWED_AGENT}`);
    expect(r.out).toContain('verify: MISMATCH');
  });

  it('exits 1 on an API SHA mismatch, showing the exact API SHA next to the expected one', async () => {
    const r = await verify([host({ hostId: 'host-b', apiSha: OTHER_API, apiShaOk: false, ok: false, mismatches: [`api_sha: ${OTHER_API}, expected ${API}`] }), host({})]);
    expect(r.code).toBe(1);
    expect(row(r.out, 'host-b')[3]).toBe(`${OTHER_API} ✗`);
    expect(row(r.out, 'host-a')[3]).toBe(API);
    expect(r.out).toContain(`host-b: api_sha: ${OTHER_API}, expected ${API}`);
    expect(r.out).toContain('verify: MISMATCH');
  });
});
