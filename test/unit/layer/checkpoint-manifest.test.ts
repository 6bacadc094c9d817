// Checkpoint manifest parsing (R-G3, R-R4) and compatibility (R-G4); both schema versions (issue #17:
// version 2's layer digest covers the chunk list).
import { describe, expect, it } from 'vitest';
import {
  ManifestError,
  assertManifestCompatible,
  checkManifestCompatible,
  chunkListDigest,
  chunkListText,
  layerDigestKind,
  parseCheckpointManifest,
  serializeCheckpointManifest,
  type CheckpointManifest,
  type ManifestRefusalReason,
} from '../../../src/core/checkpoint-manifest.ts';

const D = (c: string): string => `sha256:${c.repeat(64)}`;

function sampleManifest(overrides: Partial<CheckpointManifest> = {}): CheckpointManifest {
  return {
    schemaVersion: 1,
    checkpointId: 'cp-1',
    groupId: 'g-1',
    placementGeneration: 3,
    source: { hostId: 'host-a', epoch: 7 },
    createdAtMs: 2_000,
    cleanStop: { stoppedAtMs: 1_000, lastTurnCompletedAtMs: 900, stateRevision: 42, members: [{ memberId: 'm1', exitCode: 0, exitedWithinGrace: true }] },
    members: [
      {
        memberId: 'm1',
        cliKind: 'claude-code',
        savedLocator: 'session-123',
        nativeSessionPaths: ['/root/.claude/projects/-work/session-123.jsonl'],
        layer: { digest: D('a'), size: 300, chunks: [{ digest: D('b'), size: 100 }, { digest: D('c'), size: 200 }] },
      },
    ],
    baseImageDigest: D('d'),
    bridgeVersion: '1.2.3',
    ...overrides,
  };
}

function reasonOf(fn: () => unknown): ManifestRefusalReason | undefined {
  try {
    fn();
  } catch (err) {
    if (err instanceof ManifestError) return err.reason;
    throw err;
  }
  return undefined;
}

describe('checkpoint manifest', () => {
  it('round-trips through serialize/parse', () => {
    const m = sampleManifest();
    expect(parseCheckpointManifest(serializeCheckpointManifest(m))).toEqual(m);
    expect(parseCheckpointManifest(JSON.stringify(m))).toEqual(m);
  });

  it('refuses an oversize manifest before parsing it', () => {
    const big = JSON.stringify({ ...sampleManifest(), pad: 'x'.repeat(2 * 1024 * 1024) });
    expect(reasonOf(() => parseCheckpointManifest(big))).toBe('manifest_too_large');
    expect(reasonOf(() => parseCheckpointManifest(JSON.stringify(sampleManifest()), 100))).toBe('manifest_too_large');
  });

  it('refuses bad shapes with manifest_invalid', () => {
    const m = sampleManifest();
    const bad: unknown[] = [
      'not json',
      '[]',
      { ...m, extra: 1 },
      { ...m, groupId: 'bad group/id' },
      { ...m, placementGeneration: -1 },
      { ...m, baseImageDigest: 'sha256:XYZ' },
      { ...m, members: [] },
      { ...m, members: [m.members[0], m.members[0]] },
      { ...m, members: [{ ...m.members[0]!, layer: { ...m.members[0]!.layer, size: 301 } }] },
      { ...m, members: [{ ...m.members[0]!, nativeSessionPaths: ['relative/path'] }] },
      { ...m, members: [{ ...m.members[0]!, nativeSessionPaths: ['/a/../etc'] }] },
      { ...m, members: [{ ...m.members[0]!, layer: { ...m.members[0]!.layer, chunks: [{ digest: D('b'), size: 300 + 2 * 1024 * 1024 }] } }] },
      { ...m, cleanStop: { ...m.cleanStop, members: [{ memberId: 'm1', exitCode: 0, exitedWithinGrace: false }] } },
      { ...m, cleanStop: { ...m.cleanStop, members: [{ memberId: 'other', exitCode: 0, exitedWithinGrace: true }] } },
      { ...m, cleanStop: { ...m.cleanStop, stoppedAtMs: 5_000 } },
    ];
    for (const value of bad) {
      expect(reasonOf(() => parseCheckpointManifest(typeof value === 'string' ? value : JSON.stringify(value)))).toBe('manifest_invalid');
    }
    expect(reasonOf(() => parseCheckpointManifest(new Uint8Array([0xff, 0xfe])))).toBe('manifest_invalid');
    for (const v of [0, 3, '2', null]) expect(reasonOf(() => parseCheckpointManifest(JSON.stringify({ ...m, schemaVersion: v })))).toBe('manifest_unsupported_version');
  });

  it('reads version 1 (tar digest, any value) and version 2 (digest of the chunk list, checked on parse)', () => {
    const v1 = sampleManifest();
    expect(layerDigestKind(1)).toBe('tar');
    expect(layerDigestKind(2)).toBe('chunk-list');
    const chunks = v1.members[0]!.layer.chunks;
    expect(chunkListText(chunks)).toBe(`${D('b')} 100\n${D('c')} 200\n`);
    const layer = { ...v1.members[0]!.layer, digest: chunkListDigest(chunks) };
    const v2 = sampleManifest({ schemaVersion: 2, members: [{ ...v1.members[0]!, layer }] });
    expect(parseCheckpointManifest(serializeCheckpointManifest(v2))).toEqual(v2);
    expect(parseCheckpointManifest(serializeCheckpointManifest(v1))).toEqual(v1);
    // A version-2 digest that is not the list's: refused before any chunk is fetched.
    expect(reasonOf(() => parseCheckpointManifest(JSON.stringify({ ...v1, schemaVersion: 2 })))).toBe('manifest_invalid');
    const reordered = { ...layer, chunks: [chunks[1]!, chunks[0]!] };
    expect(reasonOf(() => parseCheckpointManifest(JSON.stringify(sampleManifest({ schemaVersion: 2, members: [{ ...v1.members[0]!, layer: reordered }] }))))).toBe('manifest_invalid');
  });

  it('checks the base image digest and bridge version of the target', () => {
    const m = sampleManifest();
    expect(checkManifestCompatible(m, { baseImageDigest: m.baseImageDigest, bridgeVersion: '1.2.3' })).toEqual({ ok: true });
    expect(checkManifestCompatible(m, { baseImageDigest: D('e'), bridgeVersion: '1.2.3' })).toMatchObject({ ok: false, reason: 'base_image_mismatch' });
    expect(checkManifestCompatible(m, { baseImageDigest: m.baseImageDigest, bridgeVersion: '1.2.4' })).toMatchObject({ ok: false, reason: 'bridge_version_mismatch' });
    expect(reasonOf(() => assertManifestCompatible(m, { baseImageDigest: D('e'), bridgeVersion: '1.2.3' }))).toBe('base_image_mismatch');
  });
});
