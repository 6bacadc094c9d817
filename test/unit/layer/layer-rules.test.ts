// Pure layer-entry rules (R-R4): names, links, devices, bombs, whiteouts.
import { describe, expect, it } from 'vitest';
import {
  LayerRuleError,
  LayerValidator,
  layerLimits,
  normalizeEntryPath,
  parseWhiteout,
  symlinkStaysInside,
  whiteoutName,
  type LayerEntry,
  type LayerRefusalReason,
} from '../../../src/core/layer-rules.ts';

function reasonOf(fn: () => unknown): LayerRefusalReason | undefined {
  try {
    fn();
  } catch (err) {
    if (err instanceof LayerRuleError) return err.reason;
    throw err;
  }
  return undefined;
}

const file = (name: string, size = 0): LayerEntry => ({ name, type: 'file', size });
const dir = (name: string): LayerEntry => ({ name, type: 'directory', size: 0 });

describe('normalizeEntryPath', () => {
  it('normalizes ./, duplicate slashes and trailing slashes', () => {
    expect(normalizeEntryPath('./a//b/./c/')).toBe('a/b/c');
    expect(normalizeEntryPath('./')).toBe('.');
    expect(normalizeEntryPath('.')).toBe('.');
  });
  it('refuses traversal, absolute names, NUL, empty and oversize names', () => {
    expect(reasonOf(() => normalizeEntryPath('a/../../etc/passwd'))).toBe('path_traversal');
    expect(reasonOf(() => normalizeEntryPath('..'))).toBe('path_traversal');
    expect(reasonOf(() => normalizeEntryPath('/etc/passwd'))).toBe('absolute_path');
    expect(reasonOf(() => normalizeEntryPath('a\0b'))).toBe('invalid_name');
    expect(reasonOf(() => normalizeEntryPath(''))).toBe('invalid_name');
    expect(reasonOf(() => normalizeEntryPath('x'.repeat(256)))).toBe('name_too_long');
    expect(reasonOf(() => normalizeEntryPath('a/'.repeat(3000)))).toBe('name_too_long');
    expect(reasonOf(() => normalizeEntryPath('a/'.repeat(300), layerLimits({ maxNameBytes: 100_000 })))).toBe('name_too_long');
  });
});

describe('whiteout names', () => {
  it('round-trips names and recognizes the opaque marker', () => {
    expect(whiteoutName('foo')).toBe('.wh.foo');
    expect(parseWhiteout('.wh.foo')).toEqual({ kind: 'whiteout', target: 'foo' });
    expect(parseWhiteout('.wh..wh..opq')).toEqual({ kind: 'opaque' });
    expect(parseWhiteout('foo.wh.')).toBeNull();
    expect(() => whiteoutName('a/b')).toThrow(RangeError);
  });
  it('refuses unknown markers and whiteouts of nothing', () => {
    expect(reasonOf(() => parseWhiteout('.wh..wh.plnk'))).toBe('invalid_whiteout');
    expect(reasonOf(() => parseWhiteout('.wh.'))).toBe('invalid_whiteout');
    expect(reasonOf(() => parseWhiteout('.wh...'))).toBe('invalid_whiteout');
  });
});

describe('symlinkStaysInside', () => {
  it('resolves relative targets lexically from the link directory', () => {
    expect(symlinkStaysInside('a/b/link', '../c')).toBe(true);
    expect(symlinkStaysInside('a/b/link', '../../c')).toBe(true);
    expect(symlinkStaysInside('a/b/link', '../../../etc')).toBe(false);
    expect(symlinkStaysInside('link', '../x')).toBe(false);
    expect(symlinkStaysInside('link', '/etc/passwd')).toBe(true);
  });
});

describe('LayerValidator', () => {
  it('admits a normal layer and converts whiteouts', () => {
    const v = new LayerValidator();
    expect(v.admit(dir('./'))).toEqual({ kind: 'entry', path: '.' });
    expect(v.admit(dir('./d/'))).toEqual({ kind: 'entry', path: 'd' });
    expect(v.admit(file('./d/a', 3))).toEqual({ kind: 'entry', path: 'd/a' });
    expect(v.admit({ name: 'd/h', type: 'hardlink', size: 0, linkName: './d/a' })).toEqual({ kind: 'entry', path: 'd/h', linkTarget: 'd/a' });
    expect(v.admit({ name: 'd/s', type: 'symlink', size: 0, linkName: '/usr/bin/env' })).toEqual({ kind: 'entry', path: 'd/s' });
    expect(v.admit(file('d/.wh.gone'))).toEqual({ kind: 'whiteout', path: 'd/gone' });
    expect(v.admit(file('d/.wh..wh..opq'))).toEqual({ kind: 'opaque', dir: 'd' });
    expect(v.entryCount).toBe(7);
    expect(v.totalBytes).toBe(3);
  });

  it('refuses device nodes and fifos (whiteouts travel as .wh. files)', () => {
    for (const type of ['char-device', 'block-device', 'fifo'] as const) {
      expect(reasonOf(() => new LayerValidator().admit({ name: 'x', type, size: 0, devMajor: 0, devMinor: 0 }))).toBe('device_node');
    }
  });

  it('refuses link escapes', () => {
    expect(reasonOf(() => new LayerValidator().admit({ name: 'a', type: 'symlink', size: 0, linkName: '../../etc' }))).toBe('link_escape');
    expect(reasonOf(() => new LayerValidator().admit({ name: 'a', type: 'hardlink', size: 0, linkName: '/etc/shadow' }))).toBe('link_escape');
    expect(reasonOf(() => new LayerValidator().admit({ name: 'a', type: 'hardlink', size: 0, linkName: '../x' }))).toBe('link_escape');
    // A hard link must point to an EARLIER entry of this layer.
    const v = new LayerValidator();
    expect(reasonOf(() => v.admit({ name: 'a', type: 'hardlink', size: 0, linkName: 'b' }))).toBe('link_escape');
    // Writing through a symlink of the layer would land outside the staging dir.
    const w = new LayerValidator();
    w.admit({ name: 'evil', type: 'symlink', size: 0, linkName: '/etc' });
    expect(reasonOf(() => w.admit(file('evil/passwd', 1)))).toBe('link_escape');
    // Hard link to a whiteout is nonsense.
    const x = new LayerValidator();
    x.admit(file('.wh.w'));
    expect(reasonOf(() => x.admit({ name: 'l', type: 'hardlink', size: 0, linkName: 'w' }))).toBe('link_escape');
  });

  it('refuses duplicates, children of files and bad whiteouts', () => {
    const v = new LayerValidator();
    v.admit(file('a'));
    expect(reasonOf(() => v.admit(file('./a')))).toBe('duplicate_entry');
    expect(reasonOf(() => v.admit(file('a/b')))).toBe('parent_not_directory');
    v.admit(file('.wh.gone'));
    expect(reasonOf(() => v.admit(file('gone')))).toBe('duplicate_entry');
    expect(reasonOf(() => new LayerValidator().admit(file('.wh.big', 5)))).toBe('invalid_whiteout');
    expect(reasonOf(() => new LayerValidator().admit(dir('.wh.dir')))).toBe('invalid_whiteout');
    const o = new LayerValidator();
    o.admit(file('d/.wh..wh..opq'));
    expect(reasonOf(() => o.admit(file('d/.wh..wh..opq')))).toBe('duplicate_entry');
    expect(reasonOf(() => new LayerValidator().admit(file('.')))).toBe('invalid_name');
  });

  it('refuses overlay xattrs from a layer and too many xattrs', () => {
    expect(reasonOf(() => new LayerValidator().admit({ ...dir('d'), xattrNames: ['trusted.overlay.redirect'] }))).toBe('forbidden_xattr');
    expect(reasonOf(() => new LayerValidator(layerLimits({ maxXattrsPerEntry: 2 })).admit({ ...file('f'), xattrNames: ['user.a', 'user.b', 'user.c'] }))).toBe('too_many_xattrs');
    expect(new LayerValidator().admit({ ...file('f'), xattrNames: ['user.a', 'security.capability'] })).toEqual({ kind: 'entry', path: 'f' });
  });

  it('refuses entry-count and size bombs', () => {
    const v = new LayerValidator(layerLimits({ maxEntries: 3 }));
    v.admit(file('a'));
    v.admit(file('b'));
    v.admit(file('c'));
    expect(reasonOf(() => v.admit(file('d')))).toBe('too_many_entries');
    const s = new LayerValidator(layerLimits({ maxLayerBytes: 1000 }));
    s.admit(file('a', 600));
    expect(reasonOf(() => s.admit(file('b', 600)))).toBe('layer_too_large');
    expect(reasonOf(() => new LayerValidator().admit({ name: 'd', type: 'directory', size: 10 }))).toBe('malformed_tar');
  });

  it('checks PAX header sizes before they are buffered', () => {
    const v = new LayerValidator(layerLimits({ maxPaxHeaderBytes: 1024 }));
    expect(() => v.checkPaxHeaderSize(1024)).not.toThrow();
    expect(reasonOf(() => v.checkPaxHeaderSize(1025))).toBe('pax_header_too_large');
  });

  it('rejects nonsense limits', () => {
    expect(() => layerLimits({ maxEntries: 0 })).toThrow(RangeError);
    expect(() => layerLimits({ maxLayerBytes: 1.5 })).toThrow(RangeError);
  });
});
