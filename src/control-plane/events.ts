// Appends every control-plane transition to the audit log (R-R1, R-I7) with who and why. Event ids
// are derived from what happened (subject + transition + a version), so a new leader redoing a
// step (R-R3) re-appends the same id and the stream's duplicate window drops the repeat.
import { createHash } from 'node:crypto';
import type { Logger } from '../observability/logger.ts';
import type { EventLog, FleetEvent } from '../store/event-log.ts';
import { isDuplicateInProcess } from '../store/errors.ts';

export interface TransitionEvent {
  readonly subjectKind: 'host' | 'group' | 'checkpoint' | 'control_plane';
  readonly subjectId: string;
  readonly type: string;
  readonly fromState?: string | undefined;
  readonly toState?: string | undefined;
  readonly reason?: string | undefined;
  readonly detail?: Record<string, unknown> | undefined;
  /** Distinguishes repeats of the same transition (epoch, generation, activity version...). */
  readonly version: string | number;
}

/**
 * The subject token an event about `id` is filed under (and looked up by): one subject token, so
 * dots in host ids become '~' like agent subjects map them; ids past 128 characters (host ids may
 * have 253) are filed under a digest instead, marked with "_" — which no host id contains — so a
 * host cannot be named after another host's digest and share its audit trail.
 */
export function eventSubjectToken(id: string): string {
  const mapped = id.replace(/[^A-Za-z0-9_:=@+-]/g, '~');
  return /^[A-Za-z0-9]/.test(mapped) && mapped.length <= 128 ? mapped : `x_${createHash('sha256').update(id).digest('hex').slice(0, 40)}`;
}

/**
 * A failed append is appended again in the background, with the same id, until it lands: a caller
 * whose state change is already written (a group made LOST) may never redo its step, so without this
 * an append that failed in a NATS hiccup would leave the change without its event (a silent LOST).
 * Retries stay well inside the stream's duplicate window (10 min), so an append whose
 * acknowledgement was lost is dropped as a repeat, not recorded twice. Held in memory only: what a
 * replica that dies meanwhile still held is lost with it.
 */
const RETRY_FIRST_MS = 500;
const RETRY_MAX_MS = 15_000;
const RETRY_FOR_MS = 5 * 60_000;
const MAX_PENDING_RETRIES = 10_000;

export class EventRecorder {
  readonly #pending = new Map<string, { event: FleetEvent; firstFailedAtMs: number; delayMs: number }>();

  constructor(
    private readonly log: EventLog,
    private readonly actor: string,
    private readonly logger: Logger,
    private readonly now: () => number,
  ) {}

  /** Appends that failed and are being retried in the background. */
  get pendingRetries(): number {
    return this.#pending.size;
  }

  #retryLater(event: FleetEvent): void {
    if (this.#pending.has(event.id)) return;
    if (this.#pending.size >= MAX_PENDING_RETRIES) {
      this.logger.error({ event: event.type, subject: event.subjectId }, 'event append failed and the retry queue is full: event dropped');
      return;
    }
    this.#pending.set(event.id, { event, firstFailedAtMs: Date.now(), delayMs: RETRY_FIRST_MS });
    this.#schedule(event.id);
  }

  #schedule(id: string): void {
    const p = this.#pending.get(id);
    if (p === undefined) return;
    setTimeout(() => {
      this.log.append(p.event).then(() => {
        this.#pending.delete(id);
        this.logger.info({ event: p.event.type, subject: p.event.subjectId }, 'event appended on retry');
      }, (err: unknown) => {
        if (Date.now() - p.firstFailedAtMs >= RETRY_FOR_MS) {
          this.#pending.delete(id);
          this.logger.error({ err, event: p.event.type, subject: p.event.subjectId }, 'event append still failing after retries: event dropped');
          return;
        }
        p.delayMs = Math.min(RETRY_MAX_MS, p.delayMs * 2);
        this.#schedule(id);
      });
    }, p.delayMs).unref();
  }

  /**
   * Append one event. A failed append is logged and re-thrown: callers append after their CAS
   * write, and a reconcile loop that fails here retries the step, re-appending the same id.
   */
  async record(e: TransitionEvent): Promise<void> {
    const subjectId = eventSubjectToken(e.subjectId);
    const digest = createHash('sha256').update(`${e.subjectKind}|${e.subjectId}|${e.type}|${e.toState ?? ''}|${e.reason ?? ''}|${e.version}`).digest('hex').slice(0, 32);
    const event: FleetEvent = {
      id: `${e.subjectKind}-${digest}`,
      timeMs: this.now(),
      actor: this.actor,
      subjectKind: e.subjectKind,
      subjectId,
      type: e.type,
      ...(e.fromState !== undefined ? { fromState: e.fromState } : {}),
      ...(e.toState !== undefined ? { toState: e.toState } : {}),
      ...(e.reason !== undefined ? { reason: e.reason.slice(0, 128) } : {}),
      ...(e.detail !== undefined ? { detail: e.detail } : {}),
    };
    try {
      await this.log.append(event);
    } catch (err) {
      // Retried below, and dropped (an error) only after minutes; the same id being appended by the
      // other replica right now is routine (events of one fact get one id everywhere).
      const level = isDuplicateInProcess(err) ? 'info' : 'warn';
      this.logger[level]({ err, event: event.type, subject: event.subjectId }, 'event append failed; retrying in the background');
      this.#retryLater(event);
      throw err;
    }
    this.logger.info({ event: e.type, kind: e.subjectKind, subject: e.subjectId, from: e.fromState, to: e.toState, reason: e.reason }, 'transition');
  }
}
