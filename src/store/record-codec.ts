// JSON record codec shared by KV repositories and the event log: validates with a zod schema and
// bounds the encoded size on the way in (R-R4), and treats stored bytes as untrusted on the way
// out, so a corrupt or hand-written value surfaces as a typed record_invalid error, never as a
// crash or as an unvalidated object flowing into the control plane.
import type { z } from 'zod';
import { RecordInvalidError, RecordTooLargeError } from './errors.ts';

export interface RecordCodec<T> {
  /** Validate and encode; throws RecordInvalidError / RecordTooLargeError. */
  encode(value: T, where: string): Uint8Array;
  /** Decode and validate stored bytes; throws RecordInvalidError. */
  decode(bytes: Uint8Array, where: string): T;
  readonly maxBytes: number;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder('utf-8', { fatal: true });

function issuesOf(error: z.ZodError): string[] {
  return error.issues.slice(0, 5).map((i) => `${i.path.length ? i.path.join('.') : '(root)'}: ${i.message}`.slice(0, 200));
}

/**
 * A codec for records of schema `schema`, at most `maxBytes` once encoded. Schemas should be
 * plain data (no transforms): the parsed output is what gets stored and re-parsed on read.
 */
export function jsonRecordCodec<T>(schema: z.ZodType<T>, maxBytes: number): RecordCodec<T> {
  if (!Number.isInteger(maxBytes) || maxBytes <= 0) throw new Error(`maxBytes must be a positive integer, got ${maxBytes}`);
  return {
    maxBytes,
    encode(value, where) {
      const parsed = schema.safeParse(value);
      if (!parsed.success) throw new RecordInvalidError(where, issuesOf(parsed.error));
      let text: string;
      try {
        text = JSON.stringify(parsed.data);
      } catch (err) {
        throw new RecordInvalidError(where, [`not serialisable: ${(err as Error).message}`], { cause: err });
      }
      const bytes = encoder.encode(text);
      if (bytes.length > maxBytes) throw new RecordTooLargeError(where, bytes.length, maxBytes);
      return bytes;
    },
    decode(bytes, where) {
      // Oversized stored bytes can only come from outside this codec: report them as corrupt.
      if (bytes.length > maxBytes) throw new RecordInvalidError(where, [`stored value is ${bytes.length} bytes, limit ${maxBytes}`]);
      let doc: unknown;
      try {
        doc = JSON.parse(decoder.decode(bytes));
      } catch (err) {
        throw new RecordInvalidError(where, [`not valid UTF-8 JSON: ${(err as Error).message.slice(0, 120)}`], { cause: err });
      }
      const parsed = schema.safeParse(doc);
      if (!parsed.success) throw new RecordInvalidError(where, issuesOf(parsed.error));
      return parsed.data;
    },
  };
}
