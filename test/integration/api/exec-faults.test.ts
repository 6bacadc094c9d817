// Exec through the fleet when things go wrong (R-I9), with real parts: a real nats-server, a real
// dockerd host, the real host agent and the control plane's exec relay, into a member container.
// Covered: a caller that aborted before the start answered (the process is cancelled, not left
// holding a slot); cancel ends the exec's whole process group (a shell's pipeline); a caller that
// leaves gets its unread output credited back, so the process flushes on SIGINT and exits by itself;
// a host read SUSPECT once the start answered runs on, and ends it host_fenced once DEAD; the container incarnation
// fence; the SDK releasing a pending stdin write when the exec ends and dropping its abort listeners.
// Lost frames need a seam: the relay is given a lossy view of its NATS connection (`lossy`, named in
// each test) that drops chosen frames from the agent — the exit, output beyond the first frame, or
// everything after a cancel — and each exec must then end UNAVAILABLE exec_transport_lost instead
// of hanging (the agent's numbered keepalives, the relay's idle timeout, the bound after a cancel).
import { getEventListeners } from 'node:events';
import type { NatsConnection, Subscription, SubscriptionOptions } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiServer } from '../../../src/api/runner-server.ts';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { ExecRelay, type ExecRelayDeps } from '../../../src/control-plane/exec-relay.ts';
import type { HostRecord } from '../../../src/control-plane/records.ts';
import type { ExecEvent, ExecExitView, ExecSession, ExecStartInput } from '../../../src/core/exec-port.ts';
import { DockerRuntime } from '../../../src/docker/runtime.ts';
import { ExecAgentFrame } from '../../../src/gen/sandboxfleet/v1/agent.ts';
import { RunnerClient, RunnerError } from '../../../src/runner-sdk/index.ts';
import { createTestPki, type TestPki } from '../../support/certs.ts';
import { startFleet, type Fleet } from '../control-plane/fleet-harness.ts';

let fleet: Fleet;
let plane: ControlPlane;
let pki: TestPki;
let server: ApiServer;
let runner: RunnerClient;
let groupId = '';
let containerId = '';

beforeAll(async () => {
  [fleet, pki] = await Promise.all([startFleet(1), createTestPki()]);
  plane = await fleet.startPlane();
  await fleet.startAgentOn('host-a', 0);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
  server = await ApiServer.start({ runner: plane.runner, exec: plane.exec, address: '127.0.0.1:0', security: { mode: 'mtls', mtls: { ca: pki.ca, cert: pki.server.cert, key: pki.server.key } } });
  runner = new RunnerClient({ address: `127.0.0.1:${server.port}`, tls: { ca: pki.ca, cert: pki.runner.cert, key: pki.runner.key }, deadlineMs: 60_000 });
  const opened = await runner.openGroup({ conversationId: 'exec-faults-conv', members: [{ memberId: 'm1', cli: 'claude-code' }] });
  groupId = opened.group!.groupId;
  containerId = (await fleet.group(groupId)).members[0]!.containerId!;
}, 240_000);

afterAll(async () => {
  runner?.close();
  await server?.shutdown(1_000);
  await fleet?.cleanup();
  await pki?.cleanup();
});

function input(argv: string[], more: Partial<ExecStartInput> = {}): ExecStartInput {
  return { groupId, memberId: 'm1', argv, env: [], workingDir: '', stdin: false, timeoutMs: 0, outputLimitBytes: 0, expectedGeneration: 0, cancelGraceMs: 0, ...more };
}

/** Rejects if `p` has not settled within `ms` (the bug these tests catch is a hang). */
function within<T>(ms: number, p: Promise<T>, what: string): Promise<T> {
  return Promise.race([p, new Promise<never>((_r, reject) => setTimeout(() => reject(new Error(`${what}: nothing after ${ms} ms`)), ms).unref())]);
}

/** Read a session to its end, crediting what it read; its exit, or the error it ended with. */
async function drain(s: ExecSession, onEvent?: (e: ExecEvent) => void): Promise<{ exit: ExecExitView | undefined; error: unknown; stdout: number }> {
  let exit: ExecExitView | undefined;
  let stdout = 0;
  try {
    for await (const e of s.events()) {
      onEvent?.(e);
      if (e.kind === 'output') {
        if (e.stream === 'stdout') stdout += e.data.length;
        s.consumed(e.data.length);
      } else if (e.kind === 'exit') exit = e.exit;
    }
    return { exit, error: undefined, stdout };
  } catch (error) {
    return { exit, error, stdout };
  }
}

/** The processes in the member container whose command line starts with `command`. */
async function processes(command: string): Promise<string[]> {
  const ps = await new DockerRuntime(fleet.hosts[0]!.docker).exec(containerId, ['ps', '-o', 'pid,args']);
  return ps.stdout.split('\n').filter((l) => l.trim().replace(/^\d+\s+/, '').startsWith(command));
}

/**
 * SEAM: the relay's NATS connection with frames from the agent dropped where `drop` says so (every
 * other call goes to the real connection). Stands for frames lost between the agent and the relay.
 */
function lossy(nc: NatsConnection, drop: (f: ExecAgentFrame) => boolean): NatsConnection {
  return new Proxy(nc, {
    get(target, prop, receiver) {
      if (prop === 'subscribe') {
        return (subject: string, opts: SubscriptionOptions = {}): Subscription => target.subscribe(subject, {
          ...opts,
          callback: (err, msg) => {
            if (err === null && subject.endsWith('.out') && drop(ExecAgentFrame.decode(msg.data))) return;
            opts.callback?.(err, msg);
          },
        });
      }
      const v: unknown = Reflect.get(target, prop, receiver);
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
    },
  });
}

describe('Exec when things go wrong', () => {
  it('a caller that aborted while the start was in flight gets its process cancelled, not left running', async () => {
    const gone = new AbortController();
    gone.abort();
    // The relay as the API calls it, with a signal that aborted before the session existed.
    const s = await plane.exec.exec(input(['sleep', '617']), gone.signal);
    const r = await within(15_000, drain(s), 'exit of an exec whose caller left');
    expect(r.exit?.end).toBe('cancelled');
    expect(await processes('sleep 617')).toEqual([]);
  }, 60_000);

  it('cancel ends the exec\'s whole process group: a shell\'s pipeline does not survive it', async () => {
    const s = await plane.exec.exec(input(['/bin/sh', '-c', 'sleep 611 | sleep 612'], { cancelGraceMs: 500 }), new AbortController().signal);
    const done = drain(s);
    await fleet.waitFor('the pipeline runs', async () => ((await processes('sleep 61')).length === 2 ? true : undefined), 15_000);
    s.cancel();
    const r = await within(15_000, done, 'exit of a cancelled pipeline');
    expect(r.exit?.end).toBe('cancelled');
    expect(await processes('sleep 61')).toEqual([]);
  }, 60_000);

  it('a caller that leaves gets its unread output credited back: the process flushes on SIGINT and exits by itself', async () => {
    const leave = new AbortController();
    // 600 kB the caller never reads, then on SIGINT 3 MB more and exit code 7.
    const script = "trap 'head -c 3000000 /dev/zero; exit 7' INT; head -c 600000 /dev/zero; while :; do sleep 0.1; done";
    const s = await plane.exec.exec(input(['/bin/sh', '-c', script], { cancelGraceMs: 10_000 }), leave.signal);
    // Nothing is read or credited: the 600 kB sit in the relay's queue.
    await new Promise((r) => setTimeout(r, 2_000));
    leave.abort();
    const r = await within(15_000, drain(s), 'exit of an exec whose caller left');
    expect(r.error).toBeUndefined();
    expect(r.exit).toMatchObject({ end: 'cancelled', exitCode: 7 });
  }, 60_000);

  it('the container incarnation fence: the current run is taken, another one is refused stale_incarnation', async () => {
    const first = await runner.exec({ groupId, memberId: 'm1', argv: ['true'] });
    for await (const e of first.output()) void e;
    const same = await runner.exec({ groupId, memberId: 'm1', argv: ['true'], expectedIncarnation: first.started.incarnation });
    expect(same.started.incarnation).toBe(first.started.incarnation);
    for await (const e of same.output()) void e;
    const stale = await runner.exec({ groupId, memberId: 'm1', argv: ['sleep', '613'], expectedIncarnation: String(Number(first.started.incarnation) - 1000) }).then(() => undefined, (e: unknown) => e);
    expect(stale).toBeInstanceOf(RunnerError);
    expect(stale).toMatchObject({ reason: 'stale_incarnation', metadata: { incarnation: first.started.incarnation } });
    expect(await processes('sleep 613')).toEqual([]);
  }, 60_000);

  it('SDK: a pending stdin write is released when the exec ends; abort listeners go with their calls', async () => {
    const signal = new AbortController().signal;
    // `true` never reads stdin: the write waits for credit that never comes, until the exec ends.
    const h = await runner.exec({ groupId, memberId: 'm1', argv: ['true'], stdin: true }, { signal });
    const write = h.write(Buffer.alloc(3 * 1024 * 1024, 97)).then(() => undefined, (e: unknown) => e);
    for await (const e of h.output()) void e;
    const e = await within(10_000, write, 'a write pending when the exec ended');
    expect(e).toBeInstanceOf(RunnerError);
    expect((e as RunnerError).reason).toBe('exec_ended');
    await runner.getGroupState({ groupId }, { signal });
    await fleet.waitFor('the listeners are removed', async () => (getEventListeners(signal, 'abort').length === 0 ? true : undefined), 5_000);
  }, 60_000);

  it('lossy NATS seam: a lost exit frame ends the exec exec_transport_lost within the idle timeout', async () => {
    const relay = new ExecRelay(plane.ctx, lossy(fleet.nc, (f) => f.frame?.$case === 'exit'), { idleTimeoutMs: 3_000 });
    const s = await relay.exec(input(['true']), new AbortController().signal);
    const r = await within(15_000, drain(s), 'an exec whose exit frame was lost');
    expect(r.error).toMatchObject({ reason: 'exec_transport_lost' });
  }, 60_000);

  it('lossy NATS seam: output frames lost while the agent waits for credit show as a gap at its next keepalive', async () => {
    let outputs = 0;
    // Only the first output frame arrives: the relay never reaches its grant threshold, the agent
    // runs out of credit and waits; its next keepalive carries the next sequence number.
    const relay = new ExecRelay(plane.ctx, lossy(fleet.nc, (f) => f.frame?.$case === 'output' && ++outputs > 1), { idleTimeoutMs: 6_000 });
    const s = await relay.exec(input(['head', '-c', '4000000', '/dev/zero']), new AbortController().signal);
    const t0 = Date.now();
    const r = await within(15_000, drain(s), 'an exec whose output frames were lost');
    expect(r.error).toMatchObject({ reason: 'exec_transport_lost' });
    expect((r.error as Error).message).toMatch(/frame \d+ after \d+/);
    // The gap, not the idle timeout, ended it.
    expect(Date.now() - t0).toBeLessThan(6_000);
  }, 60_000);

  it('lossy NATS seam: a cancel that brings no exit ends exec_transport_lost after twice the grace and a margin', async () => {
    let silent = false;
    const relay = new ExecRelay(plane.ctx, lossy(fleet.nc, () => silent));
    const s = await relay.exec(input(['sleep', '614'], { cancelGraceMs: 200 }), new AbortController().signal);
    const done = drain(s);
    await new Promise((r) => setTimeout(r, 500));
    silent = true;
    const t0 = Date.now();
    s.cancel();
    const r = await within(20_000, done, 'an exec cancelled with its host silent');
    expect(r.error).toMatchObject({ reason: 'exec_transport_lost' });
    expect((r.error as Error).message).toContain('after the cancel');
    // 2 × 200 ms + 5 s, well before the 30 s idle timeout.
    expect(Date.now() - t0).toBeLessThan(12_000);
  }, 60_000);

  it('a host read SUSPECT (seam: the read model) does not end the exec; DEAD then ends it host_fenced and cancels it', async () => {
    let state: 'SUSPECT' | 'DEAD' | undefined;
    let hostChanged: ((key: string, before: HostRecord | undefined, after: HostRecord | undefined) => void) | undefined;
    const seen = (v: { value: HostRecord } | undefined) => (v === undefined || state === undefined ? v : { ...v, value: { ...v.value, lifecycle: { ...v.value.lifecycle, state } } as HostRecord });
    const deps: ExecRelayDeps = {
      ...plane.ctx,
      // SEAM: the read model reports the host SUSPECT (same epoch) once the start was sent — a
      // heartbeat lapse, as a control-plane or NATS stall makes of every host — and DEAD later, each
      // change told to the session's watch as the model would.
      fleet: new Proxy(plane.ctx.fleet, {
        get(target, prop, receiver) {
          if (prop === 'host') return (key: string) => seen(target.host(key));
          if (prop === 'onHostChange') {
            return (fn: NonNullable<typeof hostChanged>) => {
              hostChanged = fn;
              return target.onHostChange(fn);
            };
          }
          const v: unknown = Reflect.get(target, prop, receiver);
          return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
        },
      }),
      agents: {
        ...plane.ctx.agents,
        send: (async (...args: Parameters<typeof plane.ctx.agents.send>) => {
          const res = await plane.ctx.agents.send(...args);
          state = 'SUSPECT';
          return res;
        }) as typeof plane.ctx.agents.send,
      },
    };
    const relay = new ExecRelay(deps, fleet.nc);
    const s = await relay.exec(input(['sleep', '615'], { cancelGraceMs: 200 }), new AbortController().signal);
    let ended = false;
    const done = drain(s).finally(() => (ended = true));
    const key = 'host-a';
    const before = plane.ctx.fleet.host(key)?.value ?? (await fleet.host(key));
    hostChanged?.(key, before, seen({ value: before })!.value);
    await new Promise((r) => setTimeout(r, 1_500));
    expect(ended, 'an exec on a SUSPECT host runs on').toBe(false);
    expect(await processes('sleep 615')).toHaveLength(1);

    state = 'DEAD';
    hostChanged?.(key, before, seen({ value: before })!.value);
    const r = await within(10_000, done, 'an exec on a host that became DEAD');
    expect(r.error).toMatchObject({ reason: 'host_fenced' });
    await fleet.waitFor('the fenced exec\'s process ended', async () => ((await processes('sleep 615')).length === 0 ? true : undefined), 15_000);
  }, 60_000);
});
