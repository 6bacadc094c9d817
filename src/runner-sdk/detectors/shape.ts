// Defensive readers for untrusted CLI events (R-R4). Every detector input is `unknown`: these helpers
// read one field at a time, reject wrong types and over-long identifiers, and truncate free text, so
// a hostile or broken stream can neither crash a detector nor smuggle in an oversized locator.

export type Rec = Readonly<Record<string, unknown>>;

/** Longest identifier (session id, thread id, turn id) a detector accepts. */
export const MAX_ID_CHARS = 256;

/**
 * Session/thread/turn ids: letters, digits and `._:-`, 1..256 chars, starting alphanumeric. No
 * slash, space or control character: a locator ends up in file names and resume arguments.
 */
const ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,255}$/;

/** A plain JSON object (not null, not an array). */
export function isRec(v: unknown): v is Rec {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Field `key` of `v` when `v` is an object, else undefined. */
export function field(v: unknown, key: string): unknown {
  return isRec(v) ? v[key] : undefined;
}

/** Field `key` as an object, else undefined. */
export function rec(v: unknown, key: string): Rec | undefined {
  const f = field(v, key);
  return isRec(f) ? f : undefined;
}

/** Field `key` as a string, else undefined. */
export function str(v: unknown, key: string): string | undefined {
  const f = field(v, key);
  return typeof f === 'string' ? f : undefined;
}

/** Field `key` as a boolean, else undefined. */
export function bool(v: unknown, key: string): boolean | undefined {
  const f = field(v, key);
  return typeof f === 'boolean' ? f : undefined;
}

/** Field `key` as a finite number, else undefined. */
export function num(v: unknown, key: string): number | undefined {
  const f = field(v, key);
  return typeof f === 'number' && Number.isFinite(f) ? f : undefined;
}

/** True when `s` is an acceptable identifier. */
export function isId(s: unknown): s is string {
  return typeof s === 'string' && ID_PATTERN.test(s);
}

/**
 * Field `key` as an identifier: strings must match the id pattern, finite integers are accepted as
 * their decimal form (bridges number their turns). Anything else, including an over-long or
 * malformed id, is undefined.
 */
export function id(v: unknown, key: string): string | undefined {
  const f = field(v, key);
  if (typeof f === 'number' && Number.isSafeInteger(f) && f >= 0) return String(f);
  return isId(f) ? f : undefined;
}

/** `s` cut to at most `max` characters (without splitting a surrogate pair). */
export function clip(s: string, max: number): string {
  if (s.length <= max) return s;
  let end = max;
  const code = s.charCodeAt(end - 1);
  if (code >= 0xd800 && code <= 0xdbff) end -= 1;
  return s.slice(0, end);
}

/** A short printable rendering of an error-ish value (string, {message}, {name,data:{message}}). */
export function errorText(v: unknown, max: number): string | undefined {
  if (typeof v === 'string') return v.length > 0 ? clip(v, max) : undefined;
  if (!isRec(v)) return undefined;
  const message = str(v, 'message') ?? str(rec(v, 'data'), 'message') ?? str(v, 'error');
  const name = str(v, 'name') ?? str(v, 'type') ?? str(v, 'code');
  const text = message !== undefined && name !== undefined ? `${name}: ${message}` : message ?? name;
  return text === undefined || text.length === 0 ? undefined : clip(text, max);
}

/**
 * Appends pieces of text up to a bound; once the bound is hit further pieces are dropped and
 * `truncated` is set, so memory stays bounded whatever the CLI prints.
 */
export class BoundedText {
  private parts: string[] = [];
  private length = 0;
  truncated = false;

  constructor(private readonly max: number) {}

  append(piece: string): void {
    if (piece.length === 0) return;
    const room = this.max - this.length;
    if (room <= 0) {
      this.truncated = true;
      return;
    }
    const taken = clip(piece, room);
    if (taken.length < piece.length) this.truncated = true;
    this.parts.push(taken);
    this.length += taken.length;
  }

  get empty(): boolean {
    return this.length === 0;
  }

  toString(): string {
    return this.parts.join('');
  }
}
