// Runs one turn's JSON-lines stream through a detector (R-S5): reads until the native turn end, then
// stops without destroying the stream (a LIVE process keeps it for the next turn). A stream that
// ends, closes or fails first is a disconnect; an abort is a timeout or a cancellation. None of these
// is ever a native turn end.

import type { Readable } from 'node:stream';
import type { TurnEndEvidence } from '../evidence.ts';
import type { TurnEndDetector } from './detector.ts';
import { readJsonLines, type JsonLineDecoder, type ReadJsonLinesResult } from './json-lines.ts';

export interface DriveOptions {
  /** The stream's decoder, kept by the driver across turns of one process. */
  readonly decoder?: JsonLineDecoder;
  readonly maxLineChars?: number;
  /** Abort to give up on the turn: a `TimeoutError` reason (AbortSignal.timeout) reads as `timeout`, anything else as `cancelled`. */
  readonly signal?: AbortSignal;
}

export interface DriveResult {
  readonly evidence: TurnEndEvidence;
  readonly read: ReadJsonLinesResult;
}

/** Feeds `source` to `detector` until the turn ends natively or the transport gives out. */
export async function driveDetector(source: Readable, detector: TurnEndDetector, options: DriveOptions = {}): Promise<DriveResult> {
  const read = await readJsonLines(source, (value) => detector.observe(value), {
    stopWhen: () => detector.nativeTurnEnded,
    ...(options.decoder !== undefined ? { decoder: options.decoder } : {}),
    ...(options.maxLineChars !== undefined ? { maxLineChars: options.maxLineChars } : {}),
    ...(options.signal !== undefined ? { signal: options.signal } : {}),
  });
  if (!detector.nativeTurnEnded) {
    switch (read.outcome) {
      case 'aborted': {
        const reason: unknown = options.signal?.reason;
        const name = typeof reason === 'object' && reason !== null ? (reason as { name?: unknown }).name : undefined;
        const message = typeof reason === 'object' && reason !== null ? (reason as { message?: unknown }).message : reason;
        detector.onTransport(name === 'TimeoutError' ? 'timeout' : 'cancelled', typeof message === 'string' ? message : undefined);
        break;
      }
      case 'error':
        detector.onTransport('disconnect', read.error ?? 'stream error');
        break;
      case 'ended':
      case 'closed':
        detector.onTransport('disconnect', `stream ${read.outcome} before the turn ended`);
        break;
      case 'stopped':
        break;
    }
  }
  return { evidence: detector.result(), read };
}
