// Property tests of the detectors (R-S4, R-S5): sub-agent events never change Claude's root
// locator; events of other turn ids never end the current turn; transport events never produce a
// native turn end; arbitrary input never throws; line chunking does not change what is read.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  JsonLineDecoder,
  TRANSPORT_KINDS,
  createDetector,
  type CliKind,
  type TransportKind,
  type TurnEndDetector,
} from '../../../src/runner-sdk/detectors/index.ts';
import { fixtureEvents } from './fixtures.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

const idArb = fc.stringMatching(/^[A-Za-z0-9][A-Za-z0-9_-]{0,40}$/);
const transportArb = fc.constantFrom<TransportKind>(...TRANSPORT_KINDS);

/** Merges two sequences keeping each one's order; `picks` says which side goes next. */
function interleave<T>(a: readonly T[], b: readonly T[], picks: readonly boolean[]): T[] {
  const out: T[] = [];
  let i = 0;
  let j = 0;
  for (const pickA of picks) {
    if (pickA && i < a.length) out.push(a[i++] as T);
    else if (j < b.length) out.push(b[j++] as T);
  }
  return out.concat(a.slice(i), b.slice(j));
}

const subAgentEventArb = fc.record({
  type: fc.constantFrom('assistant', 'user', 'result', 'system'),
  subtype: fc.constantFrom('init', 'success', 'error_during_execution', undefined),
  is_error: fc.boolean(),
  parent_tool_use_id: fc.stringMatching(/^toolu_[A-Za-z0-9]{1,24}$/),
  session_id: fc.oneof(idArb, fc.uuid()),
  message: fc.constant({ role: 'assistant', content: [{ type: 'text', text: 'SUB' }] }),
});

describe('properties', () => {
  it('Claude: any interleaving of sub-agent events leaves the root locator and outcome unchanged', () => {
    fc.assert(
      fc.property(fc.uuid(), fc.boolean(), fc.array(subAgentEventArb, { maxLength: 30 }), fc.array(fc.boolean(), { maxLength: 40 }), (rootId, isError, subs, picks) => {
        const root: unknown[] = [
          { type: 'system', subtype: 'init', session_id: rootId },
          { type: 'assistant', parent_tool_use_id: null, session_id: rootId, message: { content: [{ type: 'text', text: 'root' }] } },
          { type: 'result', subtype: isError ? 'error_during_execution' : 'success', is_error: isError, session_id: rootId, result: 'root' },
        ];
        const d = createDetector('claude-code');
        // The root result is last, so every sub-agent event is seen while the turn is open.
        for (const e of [...interleave<unknown>(root.slice(0, 2), subs, picks), root[2]]) d.observe(e);
        const ev = d.result();
        expect(ev.observedLocator).toBe(rootId);
        expect(ev.locatorConflict).toBeUndefined();
        expect(ev).toMatchObject({ nativeTurnEnded: true, succeeded: !isError, assistantText: 'root' });
      }),
      { numRuns: PROPERTY_RUNS },
    );
  });

  it('Claude: sub-agent events alone never end the turn nor set the locator', () => {
    fc.assert(
      fc.property(fc.array(subAgentEventArb, { maxLength: 30 }), (subs) => {
        const d = createDetector('claude-code');
        for (const e of subs) d.observe(e);
        expect(d.nativeTurnEnded).toBe(false);
        expect(d.result().observedLocator).toBeUndefined();
      }),
      { numRuns: PROPERTY_RUNS },
    );
  });

  it('Codex: events of other turn ids never end the current turn', () => {
    const otherTurnEvent = (kind: number, other: string, status: string, thread: string): unknown => {
      switch (kind) {
        case 0:
          return { method: 'turn/completed', params: { threadId: thread, turn: { id: other, status } } };
        case 1:
          return { method: 'turn/started', params: { threadId: thread, turn: { id: other, status: 'inProgress' } } };
        case 2:
          return { method: 'item/completed', params: { threadId: thread, turnId: other, item: { type: 'agentMessage', id: 'i', text: 'OTHER' } } };
        default:
          return { id: 5, result: { turn: { id: other } } };
      }
    };
    const otherArb = fc.tuple(fc.integer({ min: 0, max: 3 }), idArb, fc.constantFrom('completed', 'failed', 'interrupted'), fc.constantFrom('thr-root', 'thr-child'));
    fc.assert(
      fc.property(idArb, fc.array(otherArb, { maxLength: 40 }), (current, others) => {
        const d = createDetector('codex', { turnId: current });
        d.observe({ method: 'thread/started', params: { thread: { id: 'thr-root' } } });
        for (const [kind, other, status, thread] of others) {
          if (other !== current) d.observe(otherTurnEvent(kind, other, status, thread));
        }
        expect(d.nativeTurnEnded).toBe(false);
        expect(d.result().assistantText).toBeUndefined();
        d.observe({ method: 'turn/completed', params: { threadId: 'thr-root', turn: { id: current, status: 'completed' } } });
        expect(d.result()).toMatchObject({ nativeTurnEnded: true, succeeded: true, nativeTurnId: current });
      }),
      { numRuns: PROPERTY_RUNS },
    );
  });

  it('OpenCode/Kilo: events of other bridge turns never end the current turn', () => {
    const events = fixtureEvents('opencode', 'interleaved-late-metadata.jsonl').concat(fixtureEvents('opencode', 'session-error.jsonl'));
    fc.assert(
      fc.property(fc.constantFrom<CliKind>('opencode', 'kilo'), fc.integer({ min: 0, max: 1000 }), fc.array(fc.integer({ min: 0, max: 1000 }), { maxLength: 10 }), (cli, current, otherTurns) => {
        const d = createDetector(cli, { turnId: current });
        for (const other of otherTurns) {
          if (other === current) continue;
          for (const e of events) d.observe({ ...(e as object), turnId: other });
        }
        expect(d.nativeTurnEnded).toBe(false);
        expect(d.result().assistantText).toBeUndefined();
        d.observe({ type: 'settled', turnId: current, properties: { sessionID: 'ses_x' } });
        expect(d.nativeTurnEnded).toBe(true);
      }),
      { numRuns: PROPERTY_RUNS },
    );
  });

  /** Non-terminal events per CLI: things a turn emits before it ends. */
  const nonTerminal: Record<CliKind, unknown[]> = {
    'claude-code': fixtureEvents('claude-code', 'disconnect-mid-turn.jsonl'),
    codex: fixtureEvents('codex', 'disconnect-mid-turn.jsonl'),
    pi: fixtureEvents('pi', 'disconnect-mid-turn.jsonl'),
    opencode: fixtureEvents('opencode', 'disconnect-mid-turn.jsonl'),
    kilo: fixtureEvents('opencode', 'disconnect-mid-turn.jsonl'),
  };
  const make = (cli: CliKind): TurnEndDetector => createDetector(cli, { turnId: 4 });

  it('transport events never produce a native turn end, in any order with non-terminal events', () => {
    fc.assert(
      fc.property(
        fc.constantFrom<CliKind>('claude-code', 'codex', 'pi', 'opencode', 'kilo'),
        fc.array(fc.tuple(transportArb, fc.option(fc.string({ maxLength: 20 }), { nil: undefined })), { minLength: 1, maxLength: 8 }),
        fc.array(fc.boolean(), { maxLength: 20 }),
        (cli, transports, picks) => {
          const d = make(cli);
          const steps = interleave<{ t: [TransportKind, string | undefined] } | { e: unknown }>(
            transports.map((t) => ({ t })),
            nonTerminal[cli].map((e) => ({ e })),
            picks,
          );
          for (const s of steps) {
            if ('t' in s) d.onTransport(s.t[0], s.t[1]);
            else d.observe(s.e);
          }
          const ev = d.result();
          expect(ev.nativeTurnEnded).toBe(false);
          expect(ev.succeeded).toBe(false);
          expect(ev.endKind).toBe(transports[0]?.[0]);
        },
      ),
      { numRuns: PROPERTY_RUNS },
    );
  });

  /** A successful native end of turn 4 per CLI. */
  const ends: Record<CliKind, unknown> = {
    'claude-code': { type: 'result', subtype: 'success', is_error: false, session_id: 's' },
    codex: { method: 'turn/completed', params: { turn: { id: '4', status: 'completed' } } },
    pi: { type: 'agent_end', messages: [{ role: 'assistant', content: [{ type: 'text', text: 'ok' }], stopReason: 'stop' }] },
    opencode: { type: 'settled', turnId: 4, properties: { sessionID: 'ses_a' } },
    kilo: { type: 'settled', turnId: 4, properties: { sessionID: 'ses_a' } },
  };

  it('transport events after a native end change neither the end nor its outcome', () => {
    fc.assert(
      fc.property(fc.constantFrom<CliKind>('claude-code', 'codex', 'pi', 'opencode', 'kilo'), fc.array(transportArb, { maxLength: 6 }), (cli, transports) => {
        const d = make(cli);
        d.observe(ends[cli]);
        const before = d.result();
        for (const t of transports) d.onTransport(t);
        const after = d.result();
        expect(after).toMatchObject({ nativeTurnEnded: true, succeeded: true, endKind: before.endKind });
      }),
      { numRuns: PROPERTY_RUNS },
    );
  });

  /**
   * The shapes that end a turn natively, per CLI (the detectors' documented end events, R-S5):
   * Claude's root `result` and `system/api_retry` (R-S6); Codex's `turn/completed`; Pi's
   * `agent_end` and a failed `auto_retry_end`; the live bridge's `settled`. Nothing else may.
   */
  const rec = (x: unknown): Record<string, unknown> | undefined => (typeof x === 'object' && x !== null && !Array.isArray(x) ? (x as Record<string, unknown>) : undefined);
  const endShape: Record<CliKind, (x: unknown) => boolean> = {
    'claude-code': (x) => (rec(x)?.type === 'result' && (rec(x)?.parent_tool_use_id ?? null) === null) || (rec(x)?.type === 'system' && rec(x)?.subtype === 'api_retry'),
    codex: (x) => rec(x)?.method === 'turn/completed',
    pi: (x) => rec(x)?.type === 'agent_end' || (rec(x)?.type === 'auto_retry_end' && rec(x)?.success === false),
    opencode: (x) => rec(x)?.type === 'settled',
    kilo: (x) => rec(x)?.type === 'settled',
  };
  /** Event names of every CLI (end events included; the filter above takes those out per CLI). */
  const eventName = fc.constantFrom(
    'result', 'system', 'assistant', 'user', 'session', 'response', 'message_end', 'auto_retry_start', 'auto_retry_end', 'agent_end',
    'message.updated', 'message.part.updated', 'message.part.delta', 'session.error', 'settled',
    'thread/started', 'turn/started', 'turn/completed', 'item/completed', 'item/agentMessage/delta', 'error',
  );
  /** Look-alikes of real events: known names with plausible fields of this turn (4), mixed at random. */
  const nearMiss = fc.record(
    {
      type: eventName,
      method: eventName,
      subtype: fc.constantFrom('api_retry', 'success', 'init', 'error_during_execution'),
      is_error: fc.boolean(),
      success: fc.boolean(),
      session_id: fc.constantFrom('s', 'other'),
      parent_tool_use_id: fc.constantFrom(null, 'toolu_1'),
      turnId: fc.constantFrom(4, '4', 5),
      params: fc.record({ threadId: fc.constantFrom('thr', 'other'), turnId: fc.constantFrom('4', '5'), turn: fc.record({ id: fc.constantFrom('4', 4, '5'), status: fc.constantFrom('completed', 'failed', 'inProgress') }) }, { requiredKeys: [] }),
      properties: fc.record({ turnId: fc.constantFrom(4, 5), sessionID: fc.constant('ses_a') }, { requiredKeys: [] }),
      messages: fc.constant([{ role: 'assistant', content: [{ type: 'text', text: 'x' }], stopReason: 'stop' }]),
      result: fc.anything(),
    },
    { requiredKeys: [] },
  );

  it('arbitrary input never throws and never ends a turn by accident of shape', () => {
    fc.assert(
      fc.property(fc.constantFrom<CliKind>('claude-code', 'codex', 'pi', 'opencode', 'kilo'), fc.array(fc.oneof(fc.anything(), nearMiss), { maxLength: 30 }), (cli, inputs) => {
        const shapes = inputs.filter((x) => !endShape[cli](x));
        const d = make(cli);
        for (const x of shapes) d.observe(x);
        const ev = d.result();
        expect(ev.stats.events).toBe(shapes.length);
        // The turn did not end: no native end, no success, no end kind.
        expect(d.nativeTurnEnded).toBe(false);
        expect(ev).toMatchObject({ nativeTurnEnded: false, succeeded: false, endKind: 'none' });
        // And the turn is still open to its real end: the noise neither ended nor wedged it.
        d.observe(ends[cli]);
        expect(d.nativeTurnEnded).toBe(true);
      }),
      { numRuns: PROPERTY_RUNS },
    );
  });

  it('JSON lines: how the bytes are chunked never changes the values read', () => {
    fc.assert(
      fc.property(fc.array(fc.jsonValue(), { maxLength: 15 }), fc.array(fc.integer({ min: 1, max: 64 }), { minLength: 1, maxLength: 50 }), (values, cuts) => {
        const bytes = Buffer.from(values.map((v) => JSON.stringify(v)).join('\n') + '\n');
        const d = new JsonLineDecoder();
        let at = 0;
        for (let k = 0; at < bytes.length; k += 1) {
          const n = cuts[k % cuts.length] ?? 1;
          d.push(bytes.subarray(at, at + n));
          at += n;
        }
        d.end();
        const out: unknown[] = [];
        for (let v = d.next(); v !== undefined; v = d.next()) out.push(v.value);
        expect(out).toEqual(values.map((v) => JSON.parse(JSON.stringify(v)) as unknown));
      }),
      { numRuns: PROPERTY_RUNS },
    );
  });
});
