// Pure parts of the Docker adapter: the stdout/stderr frame demultiplexer (with its output bound)
// and the mapping of engine errors to typed reasons.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { DockerRuntimeError, mapEngineError } from '../../../src/docker/errors.ts';
import { Demuxer, demux } from '../../../src/docker/stream.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

function frame(kind: 1 | 2, payload: string): Buffer {
  const body = Buffer.from(payload);
  const header = Buffer.alloc(8);
  header[0] = kind;
  header.writeUInt32BE(body.length, 4);
  return Buffer.concat([header, body]);
}

describe('demux', () => {
  it('splits stdout and stderr frames', () => {
    const buf = Buffer.concat([frame(1, 'a'), frame(2, 'err'), frame(1, 'b\n')]);
    expect(demux(buf, 1024)).toEqual({ stdout: 'ab\n', stderr: 'err', truncated: false });
  });

  it('gives the same result however the stream is chunked', () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(fc.constantFrom<1 | 2>(1, 2), fc.string({ maxLength: 20 })), { maxLength: 10 }), fc.array(fc.nat(40), { maxLength: 10 }), (frames, cuts) => {
        const buf = Buffer.concat(frames.map(([k, p]) => frame(k, p)));
        const d = new Demuxer(1 << 20);
        let at = 0;
        for (const c of cuts) {
          d.push(buf.subarray(at, Math.min(buf.length, at + c)));
          at = Math.min(buf.length, at + c);
        }
        d.push(buf.subarray(at));
        expect(d.result()).toEqual(demux(buf, 1 << 20));
        expect(d.result().stdout).toBe(frames.filter(([k]) => k === 1).map(([, p]) => p).join(''));
      }),
      { numRuns: PROPERTY_RUNS },
    );
  });

  it('keeps at most the limit per stream and says so', () => {
    const r = demux(Buffer.concat([frame(1, 'abcdef'), frame(1, 'gh'), frame(2, 'xy')]), 4);
    expect(r).toEqual({ stdout: 'abcd', stderr: 'xy', truncated: true });
  });
});

describe('mapEngineError', () => {
  const engine = (statusCode: number, message: string) => Object.assign(new Error(message), { statusCode, json: { message } });

  it('maps statuses and transport failures to reasons', () => {
    expect(mapEngineError(engine(404, 'No such container: x'), 'inspect').reason).toBe('container_not_found');
    expect(mapEngineError(engine(404, 'No such image: sha256:0'), 'create').reason).toBe('image_not_found');
    expect(mapEngineError(engine(409, 'is not running'), 'exec').reason).toBe('invalid_state');
    expect(mapEngineError(engine(400, 'bad'), 'create').reason).toBe('invalid_input');
    expect(mapEngineError(engine(500, 'boom'), 'create').reason).toBe('engine_error');
    expect(mapEngineError(Object.assign(new Error('x'), { code: 'ECONNREFUSED' }), 'ping').reason).toBe('engine_unavailable');
  });

  it('keeps an already typed error and the engine message', () => {
    const typed = new DockerRuntimeError('timeout', 't');
    expect(mapEngineError(typed, 'x')).toBe(typed);
    const mapped = mapEngineError(engine(500, 'disk full'), 'create sf-g-m-g1');
    expect(mapped.message).toBe('create sf-g-m-g1: disk full');
    expect(mapped.cause).toBeInstanceOf(Error);
  });
});
