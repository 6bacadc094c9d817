// Output of `sandboxctl` (R-I7): aligned tables for people by default, `-o json` / `-o yaml` for
// scripts. Structured output is the protobuf JSON mapping of the response (enum names, camelCase),
// so it matches what any other gRPC client would see.
import { stringify } from 'yaml';

export type OutputFormat = 'table' | 'json' | 'yaml';
export const OUTPUT_FORMATS: readonly OutputFormat[] = ['table', 'json', 'yaml'];

/** Plain aligned columns, like kubectl: a header row, then one row per item. */
export function table(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: readonly string[]) => cells.map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i] ?? 0))).join('   ').trimEnd();
  return [line(header), ...rows.map(line)].join('\n');
}

export function structured(value: unknown, format: 'json' | 'yaml'): string {
  return format === 'json' ? JSON.stringify(value, null, 2) : stringify(value).trimEnd();
}

/** One item of a stream: NDJSON for json (a line per event), a YAML document for yaml. */
export function streamed(value: unknown, format: 'json' | 'yaml'): string {
  return format === 'json' ? JSON.stringify(value) : `---\n${stringify(value).trimEnd()}`;
}

/** Human durations for ages and intervals: 850ms, 12s, 4m, 3h, 2d. */
export function age(ms: number): string {
  if (ms < 0) return '-';
  if (ms < 1_000) return `${Math.round(ms)}ms`;
  if (ms < 60_000) return `${Math.round(ms / 1_000)}s`;
  if (ms < 3_600_000) return `${Math.round(ms / 60_000)}m`;
  if (ms < 86_400_000) return `${Math.round(ms / 3_600_000)}h`;
  return `${Math.round(ms / 86_400_000)}d`;
}

export function bytes(n: number): string {
  if (n < 1024) return `${n}B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n / 1024;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return `${v.toFixed(v < 10 ? 1 : 0)}${units[u]}`;
}

/** Git SHAs and digests shortened for tables (full values are in -o json/yaml). */
export function short(sha: string, n = 12): string {
  const s = sha.startsWith('sha256:') ? sha.slice(7) : sha;
  return s === '' ? '-' : s.slice(0, n);
}

export function isoTime(unixMs: number): string {
  return unixMs > 0 ? new Date(unixMs).toISOString().replace(/\.\d{3}Z$/, 'Z') : '-';
}
