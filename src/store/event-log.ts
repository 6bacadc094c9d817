// The append-only audit/event log (R-A3, R-R1: LOST is never silent, R-I7 `sandboxctl
// events [-f]`): one JetStream stream, subjects sf.events.<subjectKind>.<subjectId>. The stream
// sequence is the total order of events. Appends are deduplicated by event id through
// Nats-Msg-Id within the stream's duplicate window, so a retried append (e.g. after an
// ambiguous timeout, or a new leader redoing a step, R-R3) does not record the event twice as
// long as the retry reuses the id.
import { DeliverPolicy, type JetStreamClient, type JetStreamManager, type JsMsg, type MsgRequest, type NextMsgRequest } from '@nats-io/jetstream';
import { z } from 'zod';
import { RecordInvalidError, translateReadError, translateWriteError } from './errors.ts';
import { jsonRecordCodec, type RecordCodec } from './record-codec.ts';

export const EVENTS_SUBJECT_PREFIX = 'sf.events';

/**
 * One subject token: no dots, wildcards or whitespace, so the subject hierarchy stays intact. "~"
 * is admitted because host ids (Kubernetes node names) carry dots, which become "~" in every NATS
 * subject token of a host (core agent-subjects.ts), events included (control-plane events.ts).
 */
const subjectToken = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_:=@+~-]{0,127}$/, 'must be 1-128 of A-Za-z0-9_:=@+~- and start alphanumeric');
const shortText = (max: number) => z.string().min(1).max(max);

/** An audit event. `id` must be unique and stable across retries of the same logical event. */
export const FleetEventSchema = z.object({
  id: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/, 'must be 1-128 of A-Za-z0-9_.:- and start alphanumeric'),
  timeMs: z.number().int().nonnegative(),
  actor: shortText(128),
  subjectKind: z.string().regex(/^[a-z][a-z0-9_-]{0,31}$/, 'must be a lowercase word of at most 32 characters'),
  subjectId: subjectToken,
  type: shortText(64),
  fromState: shortText(64).optional(),
  toState: shortText(64).optional(),
  reason: shortText(128).optional(),
  detail: z.record(z.string().max(64), z.unknown()).optional(),
});
export type FleetEvent = z.infer<typeof FleetEventSchema>;

/** An event as stored: its position in the total order. */
export interface SequencedEvent {
  readonly seq: number;
  readonly event: FleetEvent;
}

/** A stored message that is not a valid event (cannot come from append(); reported, not thrown). */
export interface InvalidStoredEvent {
  readonly seq: number;
  readonly subject: string;
  readonly error: RecordInvalidError;
}

export interface EventFilter {
  readonly subjectKind?: string;
  readonly subjectId?: string;
}

export interface ReadOptions extends EventFilter {
  /** First stream sequence to consider; default 1. */
  readonly fromSeq?: number;
  /** Default 100, at most MAX_READ_LIMIT. */
  readonly limit?: number;
}

export interface FollowOptions extends EventFilter {
  /** Start at this sequence; omit to get only events appended from now on. */
  readonly fromSeq?: number;
  readonly signal?: AbortSignal;
}

export const MAX_READ_LIMIT = 1000;
/** Default bound on one encoded event. */
export const DEFAULT_MAX_EVENT_BYTES = 16 * 1024;

export function eventSubject(e: Pick<FleetEvent, 'subjectKind' | 'subjectId'>): string {
  return `${EVENTS_SUBJECT_PREFIX}.${e.subjectKind}.${e.subjectId}`;
}

/** Subject filter for a kind and/or id; validates both so no wildcard can be smuggled in. */
export function eventFilterSubject(f: EventFilter): string {
  if (f.subjectKind !== undefined) FleetEventSchema.shape.subjectKind.parse(f.subjectKind);
  if (f.subjectId !== undefined) subjectToken.parse(f.subjectId);
  if (f.subjectKind === undefined && f.subjectId === undefined) return `${EVENTS_SUBJECT_PREFIX}.>`;
  return `${EVENTS_SUBJECT_PREFIX}.${f.subjectKind ?? '*'}.${f.subjectId ?? '*'}`;
}

export interface EventLogOptions {
  readonly js: JetStreamClient;
  readonly jsm: JetStreamManager;
  /** Stream name (created by StateStore with explicit settings). */
  readonly stream: string;
  readonly maxEventBytes?: number;
}

export class EventLog {
  readonly stream: string;
  readonly #js: JetStreamClient;
  readonly #jsm: JetStreamManager;
  readonly #codec: RecordCodec<FleetEvent>;

  constructor(opts: EventLogOptions) {
    this.#js = opts.js;
    this.#jsm = opts.jsm;
    this.stream = opts.stream;
    this.#codec = jsonRecordCodec(FleetEventSchema, opts.maxEventBytes ?? DEFAULT_MAX_EVENT_BYTES);
  }

  /**
   * Append an event; returns its stream sequence. `duplicate` is true when an event with the
   * same id was already appended within the duplicate window (then `seq` is the original's).
   */
  async append(event: FleetEvent): Promise<{ seq: number; duplicate: boolean }> {
    const where = `${this.stream}/${event.id}`;
    const bytes = this.#codec.encode(event, where);
    try {
      const ack = await this.#js.publish(eventSubject(event), bytes, { msgID: event.id, expect: { streamName: this.stream } });
      return { seq: ack.seq, duplicate: ack.duplicate };
    } catch (err) {
      throw translateWriteError(err, { bucket: this.stream, key: event.id, expectedRevision: 0, sizeBytes: bytes.length, limitBytes: this.#codec.maxBytes });
    }
  }

  /**
   * Events with sequence ≥ fromSeq matching the filter, in stream order, at most `limit`.
   * Reads go to the stream leader (not direct gets), so an acknowledged append is always seen.
   * `nextSeq` is where to continue; corrupt stored messages are listed in `invalid`.
   */
  async read(opts: ReadOptions = {}): Promise<{ events: SequencedEvent[]; invalid: InvalidStoredEvent[]; nextSeq: number }> {
    const limit = opts.limit ?? 100;
    if (!Number.isInteger(limit) || limit < 1 || limit > MAX_READ_LIMIT) throw new RangeError(`limit must be an integer in 1..${MAX_READ_LIMIT}, got ${limit}`);
    let seq = opts.fromSeq ?? 1;
    if (!Number.isSafeInteger(seq) || seq < 1) throw new RangeError(`fromSeq must be a positive integer, got ${seq}`);
    const filter = eventFilterSubject(opts);
    const events: SequencedEvent[] = [];
    const invalid: InvalidStoredEvent[] = [];
    while (events.length + invalid.length < limit) {
      let sm;
      try {
        // The server's MSG.GET takes next_by_subj (first match at or after seq); the client's
        // type for this call omits it, though it forwards the request unchanged.
        const query: NextMsgRequest = { seq, next_by_subj: filter };
        sm = await this.#jsm.streams.getMessage(this.stream, query as unknown as MsgRequest);
      } catch (err) {
        throw translateReadError(err, `${this.stream}@${seq}`);
      }
      if (!sm) break;
      const decoded = this.#decode(sm.seq, sm.subject, sm.data);
      if ('event' in decoded) events.push(decoded);
      else invalid.push(decoded);
      seq = sm.seq + 1;
    }
    return { events, invalid, nextSeq: seq };
  }

  /**
   * Follow the log (for `sandboxctl events -f`): yields events in stream order as they are
   * appended, until the loop breaks or `signal` aborts. Corrupt messages are skipped (use read()
   * to see them). Backed by an ordered consumer, which resumes by itself after a reconnect.
   */
  async *follow(opts: FollowOptions = {}): AsyncGenerator<SequencedEvent> {
    const filter = eventFilterSubject(opts);
    if (opts.fromSeq !== undefined && (!Number.isSafeInteger(opts.fromSeq) || opts.fromSeq < 1)) {
      throw new RangeError(`fromSeq must be a positive integer, got ${opts.fromSeq}`);
    }
    let messages;
    try {
      const consumer = await this.#js.consumers.get(this.stream, {
        filter_subjects: filter,
        ...(opts.fromSeq === undefined ? { deliver_policy: DeliverPolicy.New } : { deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: opts.fromSeq }),
      });
      messages = await consumer.consume();
    } catch (err) {
      throw translateReadError(err, `${this.stream} follow`);
    }
    const onAbort = (): void => messages.stop();
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      if (opts.signal?.aborted) return;
      for await (const m of messages as AsyncIterable<JsMsg>) {
        const decoded = this.#decode(m.seq, m.subject, m.data);
        if ('event' in decoded) yield decoded;
      }
    } finally {
      opts.signal?.removeEventListener('abort', onAbort);
      messages.stop();
    }
  }

  #decode(seq: number, subject: string, data: Uint8Array): SequencedEvent | InvalidStoredEvent {
    try {
      const event = this.#codec.decode(data, `${this.stream}@${seq}`);
      if (eventSubject(event) !== subject) {
        // The subject is what filters select on: an event filed under another subject is corrupt.
        throw new RecordInvalidError(`${this.stream}@${seq}`, [`stored on ${subject} but describes ${eventSubject(event)}`]);
      }
      return { seq, event };
    } catch (err) {
      if (err instanceof RecordInvalidError) return { seq, subject, error: err };
      throw err;
    }
  }
}
