// The store's translation of the JetStream API errors nats-server answers while a stream or the meta
// group has no leader (a NATS node restarting, an election) into store_unavailable, which the runner
// API answers UNAVAILABLE and a runner retries. Before, they passed through as unknown errors and the
// API answered INTERNAL (found by the chaos workload over gRPC). The errors are nats.js's own class,
// built as its client builds them from a server's answer (code, err_code, description); the
// answers in a live cluster come and go with its elections, too briefly to provoke here on demand.
import { JetStreamApiError } from '@nats-io/jetstream';
import { describe, expect, it } from 'vitest';
import { CasConflictError, StoreUnavailableError, isDuplicateInProcess, translateReadError, translateWriteError } from '../../../src/store/errors.ts';

const apiError = (code: number, errCode: number, description: string): JetStreamApiError => new JetStreamApiError({ code, err_code: errCode, description });
const ctx = { bucket: 'sf_groups_0', key: 'g', expectedRevision: 3, sizeBytes: 10, limitBytes: 100 };

describe('JetStream answers of a leaderless stream are store_unavailable', () => {
  it('10008 "JetStream system temporarily unavailable" on a read (a KV get is a STREAM.MSG.GET)', () => {
    const err = translateReadError(apiError(503, 10008, 'JetStream system temporarily unavailable'), 'sf_groups_0/g');
    expect(err).toBeInstanceOf(StoreUnavailableError);
    expect((err as StoreUnavailableError).ambiguous).toBe(false);
  });

  it('10158 "duplicate message id is in process" on a write: ambiguous (the first publish may still land)', () => {
    const err = translateWriteError(apiError(409, 10158, 'duplicate message id is in process'), ctx);
    expect(err).toBeInstanceOf(StoreUnavailableError);
    expect((err as StoreUnavailableError).ambiguous).toBe(true);
    // Known as such (an event appended by two replicas at once is routine, logged at info).
    expect(isDuplicateInProcess(err)).toBe(true);
    expect(isDuplicateInProcess(translateWriteError(apiError(503, 10008, 'JetStream system temporarily unavailable'), ctx))).toBe(false);
  });

  it('other API errors keep their meaning: a wrong last sequence is a CAS conflict, a limit or a configuration error stays unknown', () => {
    expect(translateWriteError(apiError(400, 10071, 'wrong last sequence: 4'), ctx)).toBeInstanceOf(CasConflictError);
    for (const [code, errCode, text] of [[503, 10023, 'insufficient resources'], [503, 10039, 'jetstream not enabled for account']] as const) {
      const err = translateWriteError(apiError(code, errCode, text), ctx);
      expect(err).toBeInstanceOf(JetStreamApiError);
    }
  });
});
