// Entry of a layer worker thread (started by layer-workers.ts): runs one restore pass at a time
// (restore.ts scanLayer / extractLayer) over chunks the main thread posts, acknowledging each chunk
// once the pass asks for the next one (so the main thread never has more than a few in flight),
// handing lent chunks back once the pass is done with them, and answers the pass's result or its
// error as plain data.
import { parentPort } from 'node:worker_threads';
import { serializeLayerError } from './errors.ts';
import type { FromWorker, ToWorker } from './layer-workers.ts';
import { extractLayer, scanLayer } from './restore.ts';

const port = parentPort;
if (port === null) throw new Error('layer-worker.ts runs only as a worker thread');
const post = (m: FromWorker, transfer: ArrayBuffer[] = []): void => port.postMessage(m, transfer);

/** Chunks of the current job as an async iterable; ends at 'end', fails at 'abort'. */
class ChunkQueue implements AsyncIterable<Uint8Array> {
  private readonly items: Uint8Array[] = [];
  private ended = false;
  private failure: Error | undefined;
  private wake: (() => void) | undefined;
  private taken = 0;
  private pushed = 0;
  /** Lent chunks not handed back yet, with their position in the source. */
  private readonly lent = new Map<Uint8Array, number>();

  constructor(private readonly id: number) {}

  push(data: Uint8Array, lent: boolean): void {
    if (lent) this.lent.set(data, this.pushed);
    this.pushed += 1;
    this.items.push(data);
    this.notify();
  }

  /** The pass no longer reads `data`: a lent chunk goes back to the main thread (moved when it can be). */
  giveBack(data: Uint8Array): void {
    const index = this.lent.get(data);
    if (index === undefined) return;
    this.lent.delete(data);
    // A lent chunk came by message, moved to this thread or copied for it: its buffer is this
    // thread's alone even when the chunk views part of it (sole-buffers.ts). Shared memory is not moved.
    const movable = !(data.buffer instanceof SharedArrayBuffer);
    post({ op: 'returned', id: this.id, index, data }, movable ? [data.buffer as ArrayBuffer] : []);
  }

  end(): void {
    this.ended = true;
    this.notify();
  }

  fail(err: Error): void {
    this.failure = err;
    this.notify();
  }

  private notify(): void {
    this.wake?.();
    this.wake = undefined;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
    for (;;) {
      if (this.failure !== undefined) throw this.failure;
      const next = this.items.shift();
      if (next !== undefined) {
        this.taken += 1;
        post({ op: 'consumed', id: this.id, count: this.taken });
        yield next;
        continue;
      }
      if (this.ended) return;
      await new Promise<void>((r) => (this.wake = r));
    }
  }
}

let current: { id: number; queue: ChunkQueue } | undefined;

port.on('message', (m: ToWorker) => {
  switch (m.op) {
    case 'job': {
      const queue = new ChunkQueue(m.id);
      current = { id: m.id, queue };
      const done = (data: Uint8Array): void => queue.giveBack(data);
      const run = m.kind === 'scan' ? scanLayer(queue, m.job, undefined, done) : extractLayer(queue, m.job, done);
      run.then(
        (value) => post({ op: 'result', id: m.id, value }),
        (err: unknown) => post({ op: 'error', id: m.id, error: serializeLayerError(err) }),
      ).finally(() => {
        if (current?.id === m.id) current = undefined;
      });
      return;
    }
    case 'chunk':
      if (current?.id === m.id) current.queue.push(m.data, m.lent === true);
      return;
    case 'end':
      if (current?.id === m.id) current.queue.end();
      return;
    case 'abort':
      if (current?.id === m.id) current.queue.fail(new Error('aborted: the layer could not be read'));
      return;
  }
});

post({ op: 'ready' });
