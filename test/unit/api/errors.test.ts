// Unit tests of src/api/errors.ts (R-I1): the single table from domain error categories to gRPC
// codes, store-adapter reasons recognised without importing the store, unknown errors answered as
// INTERNAL without leaking their text, and the ErrorDetail round trip through
// grpc-status-details-bin (server encoder → the runner SDK's decoder and the API's own reader).
import * as grpc from '@grpc/grpc-js';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { API_DOMAIN, ApiError, ERROR_DETAIL_TYPE_URL, STATUS_CODES, STATUS_DETAILS_KEY, readErrorDetail, statusDetailsBin, toMappedError, toServiceError } from '../../../src/api/errors.ts';
import { Conflict, Fenced, IdentityRefused, InvalidArgument, NoCapacity, NotFound, PreconditionFailed, Unavailable, type StatusName } from '../../../src/core/errors.ts';
import { RpcStatus } from '../../../src/gen/sandboxfleet/v1/common.ts';
import { errorDetailOf, toRunnerError } from '../../../src/runner-sdk/client.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

describe('status table', () => {
  it('maps every StatusName to its gRPC code', () => {
    const expected: Record<StatusName, grpc.status> = {
      INVALID_ARGUMENT: grpc.status.INVALID_ARGUMENT,
      FAILED_PRECONDITION: grpc.status.FAILED_PRECONDITION,
      ABORTED: grpc.status.ABORTED,
      NOT_FOUND: grpc.status.NOT_FOUND,
      UNAVAILABLE: grpc.status.UNAVAILABLE,
      RESOURCE_EXHAUSTED: grpc.status.RESOURCE_EXHAUSTED,
    };
    expect(STATUS_CODES).toEqual(expected);
  });

  it.each([
    [new InvalidArgument('value_too_long', 'too long', { details: { field: 'locator' } }), grpc.status.INVALID_ARGUMENT, 'value_too_long'],
    [new IdentityRefused('locator_mismatch', 'differs'), grpc.status.FAILED_PRECONDITION, 'locator_mismatch'],
    [new PreconditionFailed('invalid_transition', 'no'), grpc.status.FAILED_PRECONDITION, 'invalid_transition'],
    [new Fenced('stale_epoch', 'old'), grpc.status.FAILED_PRECONDITION, 'stale_epoch'],
    [new Conflict('cas_conflict', 'lost'), grpc.status.ABORTED, 'cas_conflict'],
    [new NotFound('group_not_found', 'none'), grpc.status.NOT_FOUND, 'group_not_found'],
    [new Unavailable('host_unreachable', 'later'), grpc.status.UNAVAILABLE, 'host_unreachable'],
    [new NoCapacity('no_capacity', 'full'), grpc.status.RESOURCE_EXHAUSTED, 'no_capacity'],
  ])('maps %s', (error, code, reason) => {
    const mapped = toMappedError(error);
    expect(mapped.code).toBe(code);
    expect(mapped.detail.reason).toBe(reason);
    expect(mapped.detail.domain).toBe(API_DOMAIN);
    expect(mapped.message).toBe(error.message);
  });

  it('stringifies and bounds details into metadata (no undefined values, at most 16 entries of 256 chars)', () => {
    const details: Record<string, string | number | boolean | undefined> = { field: 'x', n: 3, ok: true, gone: undefined, long: 'y'.repeat(1000) };
    for (let i = 0; i < 30; i++) details[`k${i}`] = i;
    const { detail } = toMappedError(new InvalidArgument('malformed', 'm', { details }));
    expect(detail.metadata.field).toBe('x');
    expect(detail.metadata.n).toBe('3');
    expect(detail.metadata.ok).toBe('true');
    expect('gone' in detail.metadata).toBe(false);
    expect(detail.metadata.long).toHaveLength(256);
    expect(Object.keys(detail.metadata).length).toBeLessThanOrEqual(16);
  });

  it('keeps an ApiError as raised', () => {
    const mapped = toMappedError(new ApiError(grpc.status.PERMISSION_DENIED, 'role_not_allowed', 'runner only', { role: 'host' }));
    expect(mapped).toMatchObject({ code: grpc.status.PERMISSION_DENIED, message: 'runner only' });
    expect(mapped.detail).toMatchObject({ reason: 'role_not_allowed', metadata: { role: 'host' }, domain: API_DOMAIN });
  });
});

describe('store-adapter and unknown errors', () => {
  it.each([
    ['cas_conflict', grpc.status.ABORTED],
    ['store_unavailable', grpc.status.UNAVAILABLE],
    ['record_too_large', grpc.status.INVALID_ARGUMENT],
    ['record_invalid', grpc.status.INVALID_ARGUMENT],
    ['invalid_key', grpc.status.INVALID_ARGUMENT],
  ])('recognises store reason %s by its reason, with a generic message', (reason, code) => {
    const err = Object.assign(new Error('bucket sf-groups key group.secret-ish rev 7'), { reason });
    const mapped = toMappedError(err);
    expect(mapped.code).toBe(code);
    expect(mapped.detail.reason).toBe(reason);
    expect(mapped.message).toBe(`state store: ${reason}`);
    expect(mapped.message).not.toContain('secret');
  });

  it('answers anything else as INTERNAL without its message, stack or reason', () => {
    const samples: unknown[] = [
      new Error('password=hunter2 at /srv/secret'),
      new TypeError("Cannot read properties of undefined (reading 'x')"),
      Object.assign(new Error('token abc'), { reason: 'some_internal_reason' }),
      'a string',
      42,
      null,
      undefined,
      { reason: 12 },
    ];
    for (const sample of samples) {
      const mapped = toMappedError(sample);
      expect(mapped.code).toBe(grpc.status.INTERNAL);
      expect(mapped.message).toBe('internal error');
      expect(mapped.detail).toMatchObject({ reason: 'internal', metadata: {}, domain: API_DOMAIN });
    }
  });
});

describe('ErrorDetail in grpc-status-details-bin', () => {
  it('round-trips through the server encoder and both decoders', () => {
    const mapped = toMappedError(new IdentityRefused('context_lost', 'member m1 context is LOST', { details: { memberId: 'm1', lostReason: 'turn_unconfirmed' } }));
    const serviceError = toServiceError(mapped);
    expect(serviceError.code).toBe(grpc.status.FAILED_PRECONDITION);
    expect(serviceError.details).toBe('member m1 context is LOST');
    const bin = serviceError.metadata.get(STATUS_DETAILS_KEY)[0];
    expect(Buffer.isBuffer(bin)).toBe(true);
    const status = RpcStatus.decode(bin as Buffer);
    expect(status.code).toBe(grpc.status.FAILED_PRECONDITION);
    expect(status.details[0]?.typeUrl).toBe(ERROR_DETAIL_TYPE_URL);
    expect(readErrorDetail(serviceError.metadata)).toEqual(mapped.detail);
    expect(errorDetailOf(serviceError.metadata)).toEqual(mapped.detail);
    const runnerError = toRunnerError({ code: serviceError.code, details: serviceError.details, metadata: serviceError.metadata });
    expect({ codeName: runnerError.codeName, reason: runnerError.reason, metadata: runnerError.metadata, domain: runnerError.domain }).toEqual({
      codeName: 'FAILED_PRECONDITION', reason: 'context_lost', metadata: { memberId: 'm1', lostReason: 'turn_unconfirmed' }, domain: API_DOMAIN,
    });
  });

  it('round-trips arbitrary reasons and metadata', () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 60 }), fc.dictionary(fc.string({ minLength: 1, maxLength: 20 }), fc.string({ maxLength: 100 }), { maxKeys: 8 }), (reason, metadata) => {
        const mapped = toMappedError(new ApiError(grpc.status.ABORTED, reason, 'm', metadata));
        const md = new grpc.Metadata();
        md.set(STATUS_DETAILS_KEY, statusDetailsBin(mapped));
        expect(readErrorDetail(md)).toEqual(mapped.detail);
      }),
      { numRuns: PROPERTY_RUNS },
    );
  });

  it('reads nothing from absent, non-binary or corrupt trailers', () => {
    expect(readErrorDetail(undefined)).toBeUndefined();
    expect(readErrorDetail(new grpc.Metadata())).toBeUndefined();
    const garbage = new grpc.Metadata();
    garbage.set(STATUS_DETAILS_KEY, Buffer.from([0xff, 0xff, 0xff, 0x0f, 0x01]));
    expect(readErrorDetail(garbage)).toBeUndefined();
    const otherType = new grpc.Metadata();
    otherType.set(STATUS_DETAILS_KEY, Buffer.from(RpcStatus.encode(RpcStatus.create({ code: 5, message: 'x', details: [{ typeUrl: 'type.googleapis.com/other.Thing', value: Buffer.from([1, 2]) }] })).finish()));
    expect(readErrorDetail(otherType)).toBeUndefined();
  });
});
