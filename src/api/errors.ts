// The one table from domain error categories to gRPC status codes (R-I1), and the encoding of the
// machine-readable reason as a google.rpc.Status ErrorDetail in `grpc-status-details-bin`.
// Why one table: the runner branches on (code, reason); if two code paths mapped the same error
// differently, a retry policy (retry ABORTED/UNAVAILABLE only) would silently change meaning.
// Unknown errors become INTERNAL with a generic message: stack traces and internals never leave.
import * as grpc from '@grpc/grpc-js';
import { isFleetError, type ApiReason, type StatusName, type StoreWireReason } from '../core/errors.ts';
import { ErrorDetail, RpcStatus } from '../gen/sandboxfleet/v1/common.ts';

export const ERROR_DETAIL_TYPE_URL = 'type.googleapis.com/sandboxfleet.v1.ErrorDetail';
export const STATUS_DETAILS_KEY = 'grpc-status-details-bin';
/** ErrorDetail.domain of errors raised by this process. */
export const API_DOMAIN = 'control-plane';

/** FleetError.status → gRPC code. The only place this mapping exists. */
export const STATUS_CODES: Readonly<Record<StatusName, grpc.status>> = {
  INVALID_ARGUMENT: grpc.status.INVALID_ARGUMENT,
  FAILED_PRECONDITION: grpc.status.FAILED_PRECONDITION,
  ABORTED: grpc.status.ABORTED,
  NOT_FOUND: grpc.status.NOT_FOUND,
  UNAVAILABLE: grpc.status.UNAVAILABLE,
  RESOURCE_EXHAUSTED: grpc.status.RESOURCE_EXHAUSTED,
};

/**
 * Store-adapter reasons (src/store/errors.ts). The api layer may not import the store, so its
 * errors are recognised by their stable `reason`; a CAS loss that escapes the control plane's own
 * retry loop is ABORTED, which the runner SDK retries with the same idempotency key.
 */
const STORE_REASON_STATUS: Readonly<Record<StoreWireReason, StatusName>> = {
  cas_conflict: 'ABORTED',
  store_unavailable: 'UNAVAILABLE',
  record_too_large: 'INVALID_ARGUMENT',
  record_invalid: 'INVALID_ARGUMENT',
  invalid_key: 'INVALID_ARGUMENT',
};

/** A status the API raises itself (authorization, cancellation), not from the domain. */
export class ApiError extends Error {
  readonly code: grpc.status;
  /** One of core's ApiReason in this codebase (test/unit/proto-reasons.test.ts checks every call). */
  readonly reason: string;
  readonly metadata: Readonly<Record<string, string>>;
  constructor(code: grpc.status, reason: string, message: string, metadata: Record<string, string> = {}) {
    super(message);
    this.name = 'ApiError';
    this.code = code;
    this.reason = reason;
    this.metadata = metadata;
  }
}

/** What a failed call answers: code, message safe to show, and the ErrorDetail. */
export interface MappedError {
  readonly code: grpc.status;
  readonly message: string;
  readonly detail: ErrorDetail;
}

const MAX_METADATA_ENTRIES = 16;
const MAX_METADATA_VALUE = 256;

function metadataOf(details: Readonly<Record<string, string | number | boolean | undefined>>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [key, value] of Object.entries(details).slice(0, MAX_METADATA_ENTRIES)) {
    if (value === undefined) continue;
    out[key] = String(value).slice(0, MAX_METADATA_VALUE);
  }
  return out;
}

function hasReason(value: unknown): value is { reason: string; message?: unknown } {
  return typeof value === 'object' && value !== null && typeof (value as { reason?: unknown }).reason === 'string';
}

/** Maps anything thrown by a handler or backend to the status the client sees. */
export function toMappedError(error: unknown): MappedError {
  if (error instanceof ApiError) {
    return { code: error.code, message: error.message, detail: ErrorDetail.create({ reason: error.reason, metadata: { ...error.metadata }, domain: API_DOMAIN }) };
  }
  if (isFleetError(error)) {
    return {
      code: STATUS_CODES[error.status],
      message: error.message,
      detail: ErrorDetail.create({ reason: error.reason, metadata: metadataOf(error.details), domain: API_DOMAIN }),
    };
  }
  if (hasReason(error)) {
    const status = (STORE_REASON_STATUS as Readonly<Record<string, StatusName | undefined>>)[error.reason];
    if (status !== undefined) {
      // Store messages name buckets and keys, not secrets; still, keep the text generic per code.
      return { code: STATUS_CODES[status], message: `state store: ${error.reason}`, detail: ErrorDetail.create({ reason: error.reason, metadata: {}, domain: API_DOMAIN }) };
    }
  }
  const internal: ApiReason = 'internal';
  return { code: grpc.status.INTERNAL, message: 'internal error', detail: ErrorDetail.create({ reason: internal, metadata: {}, domain: API_DOMAIN }) };
}

/** Encodes the ErrorDetail as google.rpc.Status for the `grpc-status-details-bin` trailer. */
export function statusDetailsBin(mapped: MappedError): Buffer {
  const status = RpcStatus.create({
    code: mapped.code,
    message: mapped.message,
    details: [{ typeUrl: ERROR_DETAIL_TYPE_URL, value: Buffer.from(ErrorDetail.encode(mapped.detail).finish()) }],
  });
  return Buffer.from(RpcStatus.encode(status).finish());
}

/** The grpc-js error object a handler passes to its callback (or emits on a stream). */
export function toServiceError(mapped: MappedError): Partial<grpc.StatusObject> & { code: grpc.status; details: string; metadata: grpc.Metadata } {
  const metadata = new grpc.Metadata();
  metadata.set(STATUS_DETAILS_KEY, statusDetailsBin(mapped));
  return { code: mapped.code, details: mapped.message, metadata };
}

/** Reads the ErrorDetail back from a status's trailers (used by tests and by any Node client). */
export function readErrorDetail(metadata: grpc.Metadata | undefined): ErrorDetail | undefined {
  const raw = metadata?.get(STATUS_DETAILS_KEY)[0];
  if (!Buffer.isBuffer(raw)) return undefined;
  try {
    const status = RpcStatus.decode(raw);
    const any = status.details.find((d) => d.typeUrl === ERROR_DETAIL_TYPE_URL);
    return any === undefined ? undefined : ErrorDetail.decode(any.value);
  } catch {
    return undefined;
  }
}
