// A turn through the fleet's own turn API (RunTurn, R-I9) as the cli-history tests drive it for the
// CLIs the fleet runs itself (Claude Code, Pi): the runner holds only the gRPC address and its
// certificate; the fleet begins the turn, runs the CLI (a kept turn process or one per turn, per the
// operator's CLI profile), detects the end server-side and completes the turn.
import { expect } from 'vitest';
import type { BeginTurnResponse, RunTurnEnd, RunTurnResponse } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import type { RecordedRequest } from '../../support/fake-model-api.ts';
import type { HistoryFleet } from './history-fleet.ts';

export interface RanThroughFleet {
  readonly begun: BeginTurnResponse;
  readonly end: RunTurnEnd;
  /** The CLI's own event lines as the fleet streamed them. */
  readonly events: unknown[];
  readonly requests: RecordedRequest[];
}

export async function runTurnThroughFleet(h: HistoryFleet, groupId: string, memberId: string, prompt: string, options: { idempotencyKey?: string } = {}): Promise<RanThroughFleet> {
  const before = h.api.requests.length;
  let begun: BeginTurnResponse | undefined;
  let end: RunTurnEnd | undefined;
  const events: unknown[] = [];
  for await (const e of h.runner.runTurn({ groupId, memberId, prompt }, { timeoutMs: 120_000, ...options }) as AsyncIterable<RunTurnResponse>) {
    const ev = e.event;
    if (ev?.$case === 'begun') begun = ev.value;
    else if (ev?.$case === 'cliEvent') {
      try {
        events.push(JSON.parse(ev.value.toString('utf8')));
      } catch {
        events.push(ev.value.toString('utf8'));
      }
    } else if (ev?.$case === 'end') end = ev.value;
  }
  expect(begun, 'RunTurn began the turn').toBeDefined();
  expect(end, 'RunTurn reported the end').toBeDefined();
  return { begun: begun!, end: end!, events, requests: h.api.requests.slice(before) };
}

/** Wait until the fake model API received a request whose body carries `marker`. */
export async function modelCalledWith(h: HistoryFleet, marker: string, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!h.api.requests.some((r) => JSON.stringify(r.raw).includes(marker))) {
    if (Date.now() > deadline) throw new Error(`the CLI never called the model for ${marker}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}
