// Typed errors of the Docker adapter. Every failure the engine reports is mapped once, here, to a
// stable machine-readable `reason` so callers (host agent, attestation) branch on reasons, never on
// message text or HTTP status codes.

export type DockerErrorReason =
  /** Input rejected before reaching the engine (bad id, unpinned image, out-of-range limit). */
  | 'invalid_input'
  /** The container (or exec) does not exist. */
  | 'container_not_found'
  /** The image id is not present on this engine (images are never pulled). */
  | 'image_not_found'
  /** A container with the deterministic name exists but belongs to another member/generation/image. */
  | 'name_conflict'
  /** The operation is not possible in the container's current state (e.g. exec in a stopped container). */
  | 'invalid_state'
  /** The storage driver is not overlay2, so there is no upper dir to capture or restore. */
  | 'unsupported_storage_driver'
  /** The engine did not answer in time (bounded operations). */
  | 'timeout'
  /** The engine socket is unreachable. */
  | 'engine_unavailable'
  /** Anything else the engine reported. */
  | 'engine_error';

export class DockerRuntimeError extends Error {
  override readonly name = 'DockerRuntimeError';
  constructor(
    readonly reason: DockerErrorReason,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

interface EngineErrorShape {
  statusCode?: number;
  code?: string;
  reason?: string;
  json?: { message?: string } | null;
  message?: string;
}

/** The engine's own message for an error from dockerode (`json.message`), else the error's message. */
export function engineMessage(err: unknown): string {
  const e = err as EngineErrorShape;
  return e?.json?.message ?? e?.message ?? String(err);
}

export function statusCodeOf(err: unknown): number | undefined {
  return (err as EngineErrorShape)?.statusCode;
}

/**
 * Map a dockerode error to a typed error. `notFound` says what a 404 means for this call
 * (the container or the image), since the engine uses 404 for both.
 */
export function mapEngineError(err: unknown, what: string, notFound: DockerErrorReason = 'container_not_found'): DockerRuntimeError {
  if (err instanceof DockerRuntimeError) return err;
  const status = statusCodeOf(err);
  const message = `${what}: ${engineMessage(err)}`;
  const code = (err as EngineErrorShape)?.code;
  if (code === 'ECONNREFUSED' || code === 'ENOENT' || code === 'EPIPE' || code === 'ECONNRESET') {
    return new DockerRuntimeError('engine_unavailable', message, { cause: err });
  }
  if (code === 'ETIMEDOUT' || code === 'ESOCKETTIMEDOUT') return new DockerRuntimeError('timeout', message, { cause: err });
  if (status === 404) {
    // A 404 on create names the missing image ("No such image: …").
    const reason = /no such image/i.test(message) ? 'image_not_found' : notFound;
    return new DockerRuntimeError(reason, message, { cause: err });
  }
  if (status === 409) return new DockerRuntimeError('invalid_state', message, { cause: err });
  if (status === 400) return new DockerRuntimeError('invalid_input', message, { cause: err });
  return new DockerRuntimeError('engine_error', message, { cause: err });
}
