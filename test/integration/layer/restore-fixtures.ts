// Shared by the restore-bounds tests: layers written straight into the chunk store as a source
// agent would (our own tar encoder, FastCDC chunks, put-if-absent), manifests for them, and a
// recording wrapper around GNU tar that tells whether an extraction ever started.
import { chmodSync, existsSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { createHash, randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execFileSync } from 'node:child_process';
import type { CheckpointManifest, LayerRef } from '../../../src/core/checkpoint-manifest.ts';
import type { CleanStopEvidence, CheckpointManifest as WireManifest } from '../../../src/gen/sandboxfleet/v1/agent.ts';
import { DEFAULT_CHUNKER_OPTIONS, FastCdcChunker } from '../../../src/host-agent/layer/fastcdc.ts';
import { END_OF_ARCHIVE, dataPadding, encodeHeader, type TarHeader } from '../../../src/host-agent/layer/tar-format.ts';
import type { ChunkStore } from '../../../src/store/chunk-store.ts';
import { toWireManifest } from '../../../src/wire/checkpoint-manifest.ts';

export const BRIDGE = 4;

export function header(name: string, type: TarHeader['type'], size = 0): TarHeader {
  return { name, type, mode: type === 'directory' ? 0o755 : 0o644, uid: 0, gid: 0, size, mtime: 1_700_000_000, devMajor: 0, devMinor: 0, xattrs: new Map() };
}

/** `bomb/f<i>` empty files, `entries` entries in all with the root and `bomb/`, then `tail` entries. */
export function* entryBomb(entries: number, tail: readonly TarHeader[] = []): Generator<Buffer> {
  yield encodeHeader(header('.', 'directory'));
  yield encodeHeader(header('bomb', 'directory'));
  const batch: Buffer[] = [];
  for (let i = 0; i < entries - 2; i++) {
    batch.push(encodeHeader(header(`bomb/f${String(i).padStart(7, '0')}`, 'file')));
    if (batch.length === 2048) yield Buffer.concat(batch.splice(0));
  }
  if (batch.length > 0) yield Buffer.concat(batch);
  for (const h of tail) yield encodeHeader(h);
  yield END_OF_ARCHIVE;
}

/** A small valid layer: `data/file-<i>.bin` of the given sizes (random bytes). */
export function* filesLayer(sizes: readonly number[]): Generator<Buffer> {
  yield encodeHeader(header('.', 'directory'));
  yield encodeHeader(header('data', 'directory'));
  for (const [i, size] of sizes.entries()) {
    yield encodeHeader(header(`data/file-${i}.bin`, 'file', size));
    yield randomBytes(size);
    yield dataPadding(size);
  }
  yield END_OF_ARCHIVE;
}

/** Chunk, store and digest a layer the way a source agent would. */
export async function storeLayerBytes(store: ChunkStore, parts: Iterable<Buffer>): Promise<LayerRef> {
  const chunker = new FastCdcChunker(DEFAULT_CHUNKER_OPTIONS);
  const writer = store.writer(16);
  const hash = createHash('sha256');
  const chunks = [];
  let size = 0;
  for (const part of parts) {
    hash.update(part);
    size += part.length;
    for (const c of chunker.push(part)) chunks.push(await writer.put(c));
  }
  const last = chunker.finish();
  if (last !== null) chunks.push(await writer.put(last));
  await writer.flush();
  return { digest: `sha256:${hash.digest('hex')}`, size, chunks };
}

/** The wire clean stop matching testManifest's core one (the agent compares sent and stored manifests). */
export const CLEAN_STOP: CleanStopEvidence = {
  clean: true,
  noTurnInFlight: true,
  graceMs: 1000,
  stoppedAtUnixMs: 1,
  members: [{ memberId: 'm1', exitCode: 0, exitedByItself: true, signal: 'SIGTERM', withinGrace: true, containerPresent: true, writableLayerPresent: true, stopDurationMs: 1, sigtermAtUnixMs: 1, exitedAtUnixMs: 1, killed: false, turnInFlight: false }],
};

/** A one-member checkpoint of `layer`, written by host `source-host` (another host than the target). */
export function testManifest(groupId: string, checkpointId: string, layer: LayerRef, imageId: string): CheckpointManifest {
  return {
    schemaVersion: 1,
    checkpointId,
    groupId,
    placementGeneration: 1,
    source: { hostId: 'source-host', epoch: 1 },
    createdAtMs: 1_700_000_000_000,
    cleanStop: { stoppedAtMs: 1, lastTurnCompletedAtMs: null, stateRevision: 1, members: [{ memberId: 'm1', exitCode: 0, exitedWithinGrace: true }] },
    members: [{ memberId: 'm1', cliKind: 'claude-code', savedLocator: null, nativeSessionPaths: [], layer }],
    baseImageDigest: imageId,
    bridgeVersion: String(BRIDGE),
  };
}

export function wireManifest(m: CheckpointManifest, imageRef: string): WireManifest {
  return toWireManifest(m, { baseImageRef: imageRef, activityVersion: 1, lastCompletedTurnId: '', cleanStop: CLEAN_STOP, sourceContainerIds: new Map(), entryCounts: new Map() });
}

/**
 * GNU tar behind a recording wrapper, first on PATH for this process and the threads and children it
 * starts from now on (a worker copies process.env when it starts): every invocation's arguments are
 * appended to a log, then the real tar runs. Not a fake: it only lets a test see whether an
 * extraction ever started.
 */
export function recordTarInvocations(): { extractions(): string[]; clear(): void } {
  const dir = mkdtempSync(join(tmpdir(), 'sf-tar-spy-'));
  const log = join(dir, 'invocations.log');
  const realTar = execFileSync('sh', ['-c', 'command -v tar'], { encoding: 'utf8' }).trim();
  writeFileSync(join(dir, 'tar'), `#!/bin/sh\nprintf '%s\\n' "$*" >> '${log}'\nexec '${realTar}' "$@"\n`);
  chmodSync(join(dir, 'tar'), 0o755);
  process.env.PATH = `${dir}:${process.env.PATH ?? ''}`;
  return {
    extractions: () => (existsSync(log) ? readFileSync(log, 'utf8').split('\n').filter((l) => l.includes('--extract')) : []),
    clear: () => writeFileSync(log, ''),
  };
}

/** Staging dirs (`.<dir>.restore-*`) anywhere in an engine's overlay2 store. */
export function stagingDirs(dataRoot: string): string[] {
  const root = join(dataRoot, 'overlay2');
  const out: string[] = [];
  for (const layer of existsSync(root) ? readdirSync(root) : []) {
    let names: string[] = [];
    try {
      names = readdirSync(join(root, layer));
    } catch {
      continue;
    }
    for (const n of names) if (n.includes('.restore-')) out.push(`${layer}/${n}`);
  }
  return out;
}
