// Which chunk buffers this thread holds alone, so that moving (transferring) them to another thread
// detaches nothing anyone else reads. A buffer that is exactly its chunk (offset 0, whole length,
// not shared) is one. So is one a chunk arrived in by transfer from a worker, although the chunk
// views only part of it: the fetch worker moves the NATS message it assembled (its headers, then the
// chunk), not a copy of the chunk (chunk-fetch-worker.ts). Buffers that merely look alike (a slice of
// Node's shared Buffer pool, a view into a client's receive buffer) are never claimed.

const claimed = new WeakSet<ArrayBuffer>();

/** `data`'s buffer is this thread's alone (it came by transfer, or was made for it). */
export function claimBuffer(data: Uint8Array): void {
  if (!(data.buffer instanceof SharedArrayBuffer)) claimed.add(data.buffer);
}

/** Whether moving `data`'s buffer to another thread takes nothing from anyone else. */
export function holdsWholeBuffer(data: Uint8Array): boolean {
  if (data.buffer instanceof SharedArrayBuffer) return false;
  return (data.byteOffset === 0 && data.byteLength === data.buffer.byteLength) || claimed.has(data.buffer);
}
