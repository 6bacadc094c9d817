// Restore bounds and chunk cache in the host agent's configuration (host-agent/config.ts): read
// from SANDBOXFLEET_LAYER_* variables, validated, and turned into the limits restore enforces.
import { describe, expect, it } from 'vitest';
import { DEFAULT_LAYER_LIMITS } from '../../../src/core/layer-rules.ts';
import { DEFAULT_LAYER_RESTORE_SETTINGS, layerRestoreSettingsOf, loadHostAgentConfig } from '../../../src/host-agent/config.ts';

const BASE = { SANDBOXFLEET_HOST_ID: 'host-a', SANDBOXFLEET_NATS_URL: 'nats://127.0.0.1:4222', SANDBOXFLEET_IMAGE_REF: 'sandbox:1', SANDBOXFLEET_AGENT_SHA: 'a'.repeat(40) };

describe('layer restore settings', () => {
  it('default to the core limits and a 1 GiB cache under the temp dir', () => {
    const settings = layerRestoreSettingsOf(loadHostAgentConfig(BASE));
    expect(settings).toEqual(DEFAULT_LAYER_RESTORE_SETTINGS);
    expect(settings.limits).toEqual(DEFAULT_LAYER_LIMITS);
    expect(settings.cacheMaxBytes).toBe(1024 ** 3);
    expect(settings.cacheDir).toMatch(/sandboxfleet-chunk-cache$/);
  });

  it('come from SANDBOXFLEET_LAYER_* variables', () => {
    const config = loadHostAgentConfig({
      ...BASE,
      SANDBOXFLEET_LAYER_MAX_ENTRIES: '20000',
      SANDBOXFLEET_LAYER_MAX_BYTES: '1048576',
      SANDBOXFLEET_LAYER_MAX_NAME_BYTES_TOTAL: '65536',
      SANDBOXFLEET_LAYER_CACHE_DIR: '/var/cache/sf',
      SANDBOXFLEET_LAYER_CACHE_MAX_BYTES: '0',
    });
    const settings = layerRestoreSettingsOf(config);
    expect(settings.limits).toEqual({ ...DEFAULT_LAYER_LIMITS, maxEntries: 20_000, maxLayerBytes: 1_048_576, maxNameBytesTotal: 65_536 });
    expect(settings).toMatchObject({ cacheDir: '/var/cache/sf', cacheMaxBytes: 0 });
  });

  it('refuse nonsense, naming the setting', () => {
    expect(() => loadHostAgentConfig({ ...BASE, SANDBOXFLEET_LAYER_MAX_ENTRIES: '0' })).toThrow(/layerMaxEntries/);
    expect(() => loadHostAgentConfig({ ...BASE, SANDBOXFLEET_LAYER_MAX_ENTRIES: 'many' })).toThrow(/layerMaxEntries/);
    expect(() => loadHostAgentConfig({ ...BASE, SANDBOXFLEET_LAYER_MAX_BYTES: '1.5' })).toThrow(/layerMaxBytes/);
    expect(() => loadHostAgentConfig({ ...BASE, SANDBOXFLEET_LAYER_MAX_NAME_BYTES_TOTAL: '-1' })).toThrow(/layerMaxNameBytesTotal/);
    expect(() => loadHostAgentConfig({ ...BASE, SANDBOXFLEET_LAYER_CACHE_MAX_BYTES: '-1' })).toThrow(/layerCacheMaxBytes/);
  });
});
