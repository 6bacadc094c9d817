// Exec through the fleet (R-I9), end to end with real parts: the runner SDK over mTLS → the API
// server → the control plane's exec relay → NATS → the real host agent → dockerd, into a member
// container. The test's runner holds no Docker socket: every byte goes through the fleet.
// Covered: output and exit code; stdin with credit; cancel (SIGINT then SIGTERM/SIGKILL); timeout;
// output limit; a stale placement generation refused; the host fenced mid-stream (UNAVAILABLE);
// 100 MB of stdout streamed intact (sha256) to a slow reader with the control plane's memory bounded.
import { createHash } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiServer } from '../../../src/api/runner-server.ts';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { ExecEnd } from '../../../src/gen/sandboxfleet/v1/exec.ts';
import { RunnerClient, RunnerError, type ExecHandle, type ExecExit } from '../../../src/runner-sdk/index.ts';
import { createTestPki, type TestPki } from '../../support/certs.ts';
import { startFleet, type Fleet } from '../control-plane/fleet-harness.ts';

let fleet: Fleet;
let plane: ControlPlane;
let pki: TestPki;
let server: ApiServer;
let runner: RunnerClient;
let groupId = '';

beforeAll(async () => {
  [fleet, pki] = await Promise.all([startFleet(1), createTestPki()]);
  plane = await fleet.startPlane();
  await fleet.startAgentOn('host-a', 0);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
  server = await ApiServer.start({ runner: plane.runner, exec: plane.exec, address: '127.0.0.1:0', security: { mode: 'mtls', mtls: { ca: pki.ca, cert: pki.server.cert, key: pki.server.key } } });
  runner = new RunnerClient({ address: `127.0.0.1:${server.port}`, tls: { ca: pki.ca, cert: pki.runner.cert, key: pki.runner.key }, deadlineMs: 60_000 });
  const opened = await runner.openGroup({ conversationId: 'exec-conv', members: [{ memberId: 'm1', cli: 'claude-code' }] });
  groupId = opened.group!.groupId;
}, 240_000);

afterAll(async () => {
  runner?.close();
  await server?.shutdown(1_000);
  await fleet?.cleanup();
  await pki?.cleanup();
});

async function collect(h: ExecHandle): Promise<{ stdout: Buffer; stderr: Buffer; exit: ExecExit }> {
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  let exit: ExecExit | undefined;
  for await (const e of h.output()) {
    if (e.kind === 'exit') exit = e.exit;
    else if (e.kind === 'stdout') out.push(e.data);
    else err.push(e.data);
  }
  expect(exit, 'an exit frame ends every exec').toBeDefined();
  return { stdout: Buffer.concat(out), stderr: Buffer.concat(err), exit: exit! };
}

describe('Exec through the fleet', () => {
  it('runs a process in the member container on its current placement: output, stderr, exit code', async () => {
    const h = await runner.exec({ groupId, memberId: 'm1', argv: ['/bin/sh', '-c', 'echo hello; echo oops >&2; exit 3'] });
    expect(h.started).toMatchObject({ hostId: 'host-a', placementGeneration: 1 });
    expect(h.started.incarnation).toMatch(/^\d+$/);
    const r = await collect(h);
    expect(r.stdout.toString()).toBe('hello\n');
    expect(r.stderr.toString()).toBe('oops\n');
    expect(r.exit).toMatchObject({ end: ExecEnd.EXITED, exitCode: 3, stdoutBytes: 6, stderrBytes: 5 });
  });

  it('feeds stdin within the granted credit and closes it', async () => {
    const h = await runner.exec({ groupId, memberId: 'm1', argv: ['/bin/sh', '-c', 'cat | wc -c'], stdin: true });
    const done = collect(h);
    await h.write(Buffer.alloc(3 * 1024 * 1024, 97)); // three times the stdin window: credits must flow back
    h.closeStdin();
    const r = await done;
    expect(r.stdout.toString().trim()).toBe(String(3 * 1024 * 1024));
    expect(r.exit.exitCode).toBe(0);
  });

  it('cancels: SIGINT first, then SIGTERM and SIGKILL after the grace', async () => {
    // Ignores SIGINT and SIGTERM: only the SIGKILL after twice the grace ends it.
    const h = await runner.exec({ groupId, memberId: 'm1', argv: ['/bin/sh', '-c', "trap 'echo got-int' INT; trap 'echo got-term' TERM; while true; do sleep 0.1; done"], cancelGraceMs: 300 });
    const done = collect(h);
    await new Promise((r) => setTimeout(r, 300));
    const t0 = Date.now();
    h.cancel();
    const r = await done;
    expect(r.exit.end).toBe(ExecEnd.CANCELLED);
    expect(r.stdout.toString()).toContain('got-int');
    expect(r.stdout.toString()).toContain('got-term');
    expect(Date.now() - t0).toBeLessThan(5_000);
  });

  it('ends a process at its timeout, and at its output limit with the output cut there', async () => {
    const slow = await collect(await runner.exec({ groupId, memberId: 'm1', argv: ['sleep', '60'], timeoutMs: 500, cancelGraceMs: 200 }));
    expect(slow.exit.end).toBe(ExecEnd.DEADLINE);
    const chatty = await collect(await runner.exec({ groupId, memberId: 'm1', argv: ['/bin/sh', '-c', 'yes'], outputLimitBytes: 1024 * 1024, cancelGraceMs: 200 }));
    expect(chatty.exit.end).toBe(ExecEnd.OUTPUT_LIMIT);
    expect(chatty.stdout.length).toBe(1024 * 1024);
  });

  it('counts as activity on the group: its older checkpoints are stale and it is not idle', async () => {
    const before = (await fleet.group(groupId)).lifecycle;
    await collect(await runner.exec({ groupId, memberId: 'm1', argv: ['true'] }));
    const after = await fleet.waitFor('activity recorded', async () => {
      const lc = (await fleet.group(groupId)).lifecycle;
      return lc.activityVersion > before.activityVersion ? lc : undefined;
    }, 10_000);
    expect(after.lastActivityAtMs).toBeGreaterThanOrEqual(before.lastActivityAtMs);
  });

  it('refuses a placement generation that is not the current one', async () => {
    const e = await runner.exec({ groupId, memberId: 'm1', argv: ['true'], expectedGeneration: 7 }).then(() => undefined, (err: unknown) => err);
    expect(e).toBeInstanceOf(RunnerError);
    expect(e).toMatchObject({ reason: 'stale_generation' });
  });

  it('streams 100 MB of stdout intact to a slow reader, with the control plane\'s memory bounded', async () => {
    const total = 100 * 1024 * 1024;
    // A fixed pseudo-random file in the container, and its digest computed there.
    const prep = await collect(await runner.exec({ groupId, memberId: 'm1', argv: ['/bin/sh', '-c', `head -c ${total} /dev/urandom > /tmp/blob && sha256sum /tmp/blob`] }));
    const expected = prep.stdout.toString().split(' ')[0]!;
    const h = await runner.exec({ groupId, memberId: 'm1', argv: ['cat', '/tmp/blob'], outputLimitBytes: 2 * total });
    const hash = createHash('sha256');
    let got = 0;
    let exit: ExecExit | undefined;
    const rssBefore = process.memoryUsage().rss;
    let rssPeak = rssBefore;
    for await (const e of h.output()) {
      if (e.kind === 'exit') exit = e.exit;
      else if (e.kind === 'stdout') {
        hash.update(e.data);
        got += e.data.length;
        // A slow reader for the first 10 MB: the process must wait, nothing may pile up.
        if (got < 10 * 1024 * 1024) await new Promise((r) => setTimeout(r, 2));
        rssPeak = Math.max(rssPeak, process.memoryUsage().rss);
      }
    }
    expect(got).toBe(total);
    expect(hash.digest('hex')).toBe(expected);
    expect(exit).toMatchObject({ end: ExecEnd.EXITED, exitCode: 0, stdoutBytes: total });
    // The whole test process (control plane, API server, agent and client) holds far less than the stream.
    expect(rssPeak - rssBefore).toBeLessThan(64 * 1024 * 1024);
  }, 120_000);

  it('ends UNAVAILABLE host_fenced when the host\'s epoch changes mid-stream', async () => {
    const h = await runner.exec({ groupId, memberId: 'm1', argv: ['sleep', '120'] });
    const outcome = collect(h).then(() => undefined, (err: unknown) => err);
    await new Promise((r) => setTimeout(r, 300));
    // The host registers again (a restart, a zombie coming back): a new epoch fences the old one.
    await fleet.agents.get('host-a')!.agent.reregister();
    const e = await outcome;
    expect(e).toBeInstanceOf(RunnerError);
    expect(e).toMatchObject({ code: 14, reason: 'host_fenced' });
  }, 60_000);
});
