// The JSON-lines reader (R-R4): bounded lines, malformed lines counted and skipped, no crash, and
// a read that stops at the turn end leaves the stream and the next turn's lines intact.
import { PassThrough, Readable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import {
  JsonLineDecoder,
  createClaudeCodeDetector,
  createPiDetector,
  driveDetector,
  readJsonLines,
} from '../../../src/runner-sdk/detectors/index.ts';

function drainAll(d: JsonLineDecoder): unknown[] {
  const out: unknown[] = [];
  for (let v = d.next(); v !== undefined; v = d.next()) out.push(v.value);
  return out;
}

describe('JsonLineDecoder', () => {
  it('joins multi-byte characters split across chunks and handles CRLF and a last line without newline', () => {
    const d = new JsonLineDecoder();
    const bytes = Buffer.from('{"t":"héllo ✓ 🎉"}\r\n\n{"n":2}');
    for (const b of bytes) d.push(Buffer.from([b]));
    d.end();
    expect(drainAll(d)).toEqual([{ t: 'héllo ✓ 🎉' }, { n: 2 }]);
    expect(d.stats).toEqual({ lines: 2, values: 2, malformed: 0, oversized: 0 });
  });

  it('drops oversized lines whole (inside one chunk and across chunks) and keeps going', () => {
    const d = new JsonLineDecoder({ maxLineChars: 16 });
    d.push(`{"a":1}\n"${'x'.repeat(40)}"\n{"b":2}\n"${'y'.repeat(10)}`);
    d.push(`${'y'.repeat(30)}"\n{"c":3}\n`);
    expect(drainAll(d)).toEqual([{ a: 1 }, { b: 2 }, { c: 3 }]);
    expect(d.stats).toMatchObject({ values: 3, oversized: 2 });
  });

  it('counts malformed lines and non-text chunks, never throws', () => {
    const d = new JsonLineDecoder();
    d.push('{"ok":true}\nnot json\n{"unterminated":\n[[[[\n');
    d.push({ objectMode: true });
    d.push(`${'['.repeat(100_000)}\n`);
    expect(drainAll(d)).toEqual([{ ok: true }]);
    expect(d.stats.malformed).toBe(5);
  });
});

describe('readJsonLines', () => {
  it('stops at the turn end, pauses without destroying, and hands the rest to the next read', async () => {
    const stream = new PassThrough();
    const decoder = new JsonLineDecoder();
    stream.write('{"type":"result","subtype":"success","is_error":false,"session_id":"s1"}\n{"type":"system","subtype":"init","session_id":"s1"}\n');
    const first = createClaudeCodeDetector();
    const r1 = await driveDetector(stream, first, { decoder });
    expect(r1.read.outcome).toBe('stopped');
    expect(r1.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true });
    expect(stream.destroyed).toBe(false);
    expect(stream.isPaused()).toBe(true);

    // Next turn on the same LIVE process: the buffered init line is not lost.
    const second = createClaudeCodeDetector();
    const next = driveDetector(stream, second, { decoder });
    stream.write('{"type":"result","subtype":"success","is_error":false,"session_id":"s1","result":"again"}\n');
    const r2 = await next;
    expect(r2.evidence).toMatchObject({ nativeTurnEnded: true, observedLocator: 's1', assistantText: 'again' });
    expect(r2.evidence.stats.events).toBe(2);
  });

  it('a stream error resolves with outcome error and is a disconnect, not a turn end', async () => {
    const stream = new PassThrough();
    const run = driveDetector(stream, createPiDetector());
    stream.write('{"type":"agent_start"}\n');
    stream.destroy(new Error('EPIPE'));
    const { evidence, read } = await run;
    expect(read).toMatchObject({ outcome: 'error', error: 'EPIPE' });
    expect(evidence).toMatchObject({ nativeTurnEnded: false, endKind: 'disconnect', error: 'disconnect: EPIPE' });
  });

  it('an already ended or destroyed stream resolves at once', async () => {
    const ended = Readable.from(['{"a":1}\n']);
    const values: unknown[] = [];
    const r = await readJsonLines(ended, (v) => values.push(v));
    expect(r.outcome).toBe('ended');
    expect(values).toEqual([{ a: 1 }]);
    expect(await readJsonLines(ended, () => {})).toMatchObject({ outcome: 'ended' });
    const destroyed = new PassThrough();
    destroyed.destroy();
    expect((await readJsonLines(destroyed, () => {})).outcome).toBe('closed');
  });

  it('a timeout signal is a timeout, an abort is a cancellation; neither is a turn end', async () => {
    const slow = new PassThrough();
    const t = await driveDetector(slow, createPiDetector(), { signal: AbortSignal.timeout(20) });
    expect(t.read.outcome).toBe('aborted');
    expect(t.evidence).toMatchObject({ nativeTurnEnded: false, endKind: 'timeout', transportUsable: true });

    const controller = new AbortController();
    const run = driveDetector(slow, createPiDetector(), { signal: controller.signal });
    controller.abort(new Error('user stop'));
    const c = await run;
    expect(c.evidence).toMatchObject({ nativeTurnEnded: false, endKind: 'cancelled', error: 'cancelled: user stop' });
    expect(slow.destroyed).toBe(false);
  });

  it('an onValue that throws ends the read with an error outcome instead of crashing', async () => {
    const r = await readJsonLines(Readable.from(['{"a":1}\n{"b":2}\n']), () => {
      throw new Error('boom');
    });
    expect(r).toMatchObject({ outcome: 'error', error: 'onValue threw: boom' });
  });
});
