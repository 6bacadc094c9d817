// The live-bridge helper's `--version` line (R-H2): `http-agent-live-bridge=<n>` (the form R-H2
// and the proto describe) or a bare `<n>`, on exactly one line of bounded length. Anything else is
// refused with a reason, never read as a version.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { MAX_HELPER_LINE, parseHelperVersionOutput } from '../../../src/docker/attestation-probe.ts';
import { parseBridgeVersion } from '../../../src/core/attestation.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

describe('parseHelperVersionOutput', () => {
  it('accepts both documented forms, with or without one trailing newline', () => {
    for (const out of ['http-agent-live-bridge=4\n', 'http-agent-live-bridge=4', 'http-agent-live-bridge=4\r\n']) {
      expect(parseHelperVersionOutput(out)).toEqual({ ok: true, version: '4', line: 'http-agent-live-bridge=4' });
    }
    expect(parseHelperVersionOutput('4\n')).toEqual({ ok: true, version: '4', line: '4' });
    expect(parseHelperVersionOutput('3')).toEqual({ ok: true, version: '3', line: '3' });
  });

  it('refuses everything else, saying why', () => {
    for (const out of [
      '', '\n', 'http-agent-live-bridge=', 'http-agent-live-bridge=4.0', 'http-agent-live-bridge = 4', 'live-bridge=4', 'HTTP-AGENT-LIVE-BRIDGE=4',
      'http-agent-live-bridge=4\nready\n', '4\n4\n', '4\n\n', ' 4', '4 ', 'v4', '4x', 'http-agent-live-bridge=http-agent-live-bridge=4', '1234567890',
      `http-agent-live-bridge=${'0'.repeat(MAX_HELPER_LINE)}4`,
    ]) {
      const r = parseHelperVersionOutput(out);
      expect(r.ok, JSON.stringify(out)).toBe(false);
      if (!r.ok) expect(r.detail.length).toBeGreaterThan(0);
    }
  });

  it('bounds the detail it reports however long the output', () => {
    const r = parseHelperVersionOutput(`http-agent-live-bridge=4${'x'.repeat(100_000)}`);
    expect(r.ok).toBe(false);
    if (!r.ok) expect(r.detail.length).toBeLessThan(400);
  });

  it('accepts only lines the control plane reads as the same version', () => {
    fc.assert(
      fc.property(fc.oneof(fc.string({ maxLength: 40 }), fc.nat(99_999).map((n) => `http-agent-live-bridge=${n}\n`), fc.nat(99_999).map(String)), (out) => {
        const r = parseHelperVersionOutput(out);
        if (r.ok) expect(parseBridgeVersion(r.line)).toBe(Number(r.version));
      }),
      { numRuns: PROPERTY_RUNS },
    );
  });
});
