// An event whose append failed is appended again in the background until it lands, exactly once
// (chaos CI seed 2025: a group made LOST during a NATS freeze had its LOST event's append time out;
// the step that wrote the LOST never runs again, so the loss stayed without its event). Real parts:
// a real nats-server, frozen with SIGSTOP while the append is made, then thawed.
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EventRecorder } from '../../../src/control-plane/events.ts';
import { connectNats, StateStore } from '../../../src/store/connection.ts';
import { createLogger } from '../../../src/observability/logger.ts';
import { startTestNats, type TestNats } from '../../support/nats.ts';

let nats: TestNats;

beforeAll(async () => {
  nats = await startTestNats();
});

afterAll(async () => {
  try {
    process.kill(nats.server.pid!, 'SIGCONT');
  } catch { /* gone */ }
  await nats?.cleanup();
});

describe('EventRecorder', () => {
  it('appends an event whose append failed once the store answers again, and only once', async () => {
    // A short request timeout, so the append fails while the server is frozen.
    const nc = await connectNats({ servers: nats.server.url, name: 'event-retry', timeoutMs: 1_000 });
    const store = await StateStore.open(nc, { timeoutMs: 1_000 });
    const recorder = new EventRecorder(store.events, 'control-plane/test', createLogger({ name: 'event-retry', level: 'silent' }), Date.now);
    const pid = nats.server.pid!;
    process.kill(pid, 'SIGSTOP');
    // kill() returns before the server has stopped: wait until the kernel says it is (state T).
    const stopped = (): boolean => / T /.test(readFileSync(`/proc/${pid}/stat`, 'utf8').replace(/^.*\)/, ')'));
    for (let i = 0; i < 100 && !stopped(); i++) await new Promise((r) => setTimeout(r, 10));
    expect(stopped()).toBe(true);
    let failed = false;
    try {
      await recorder.record({ subjectKind: 'group', subjectId: 'g-retry', type: 'group_lost', toState: 'LOST', reason: 'checkpoint_corrupt', version: '1:1:1:1:LOST' });
    } catch {
      failed = true;
    } finally {
      process.kill(pid, 'SIGCONT');
    }
    expect(failed).toBe(true);
    expect(recorder.pendingRetries).toBe(1);
    const reader = await StateStore.open(await nats.connect('event-retry-reader'));
    const deadline = Date.now() + 30_000;
    let found = 0;
    while (Date.now() < deadline) {
      found = (await reader.events.read({ subjectKind: 'group', subjectId: 'g-retry', limit: 10 })).events.length;
      if (found > 0 && recorder.pendingRetries === 0) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    expect({ found, pending: recorder.pendingRetries }).toEqual({ found: 1, pending: 0 });
    await nc.close();
  }, 60_000);
});
