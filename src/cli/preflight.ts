// The I/O half of `sandboxctl preflight` (R-P3): reads the gateway key from a file, calls
// `POST <gateway>/v1/messages` (stream: true) once per case with Node's built-in fetch, and feeds the
// SSE body to the pure reader and verdict rules of ./preflight-cases.ts.
//
// The key: read from a file only (never argv, never the environment), refused when the file has
// any group or other permission bits (like ssh with a private key; a Kubernetes Secret volume needs
// `defaultMode: 0400`), sent only as the `x-api-key` header, never with a redirect (redirects are not
// followed: the header would go along), and replaced by `<redacted>` in everything this command
// prints, before any excerpt is cut, so not even a prefix of it can show.
import { open } from 'node:fs/promises';
import { UsageError } from './connection.ts';
import {
  buildCases, callReport, caseName, judge, MessageStreamReader, summarize,
  type CallOutcome, type CallReport, type PreflightCase, type PreflightSummary,
} from './preflight-cases.ts';
import { table } from './output.ts';

export const ANTHROPIC_VERSION = '2023-06-01';
export const LIMITS = {
  repetitions: { min: 1, max: 10, default: 3 },
  maxTokens: { min: 16, max: 8192, default: 1024 },
  timeoutMs: { min: 1_000, max: 600_000, default: 60_000 },
  keyFileBytes: 4096,
  keyChars: { min: 8, max: 1024 },
  /** Bytes of one streamed answer before it is called malformed. */
  streamBytes: 4 * 1024 * 1024,
  /** Bytes of a non-200 body kept for the failure detail. */
  errorBodyBytes: 8 * 1024,
} as const;

export interface PreflightOptions {
  readonly gateway: URL;
  readonly model: string;
  readonly repetitions: number;
  readonly maxTokens: number;
  readonly timeoutMs: number;
}

export interface PreflightReport extends PreflightSummary {
  readonly gateway: string;
  readonly model: string;
  readonly repetitions: number;
  readonly calls: readonly CallReport[];
}

/** The shortest piece of the key redacted where a text was cut (start or end). */
const MIN_KEY_PIECE = 8;

/**
 * Replaces every occurrence of the key in `text`, and a piece of it (≥ 8 characters) where the text
 * was cut through it: a key prefix at the very end (a stream that broke off mid-echo), a key suffix
 * at the very start.
 */
export function redactor(key: string): (text: string) => string {
  return (text) => {
    if (key === '') return text;
    let t = text.split(key).join('<redacted>');
    for (let n = key.length - 1; n >= MIN_KEY_PIECE; n--) {
      if (t.endsWith(key.slice(0, n))) {
        t = `${t.slice(0, t.length - n)}<redacted>`;
        break;
      }
    }
    for (let n = key.length - 1; n >= MIN_KEY_PIECE; n--) {
      if (t.startsWith(key.slice(key.length - n))) {
        t = `<redacted>${t.slice(n)}`;
        break;
      }
    }
    return t;
  };
}

/**
 * The gateway base URL: http or https, no credentials, query or fragment (a secret must not ride in
 * argv that way either); a path prefix is kept (`https://gw.example/anthropic` → `…/anthropic/v1/messages`).
 * Error messages never repeat the URL: it could hold a credential.
 */
export function parseGateway(raw: string): URL {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new UsageError('--gateway must be an absolute http(s) URL');
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new UsageError('--gateway must be an http or https URL');
  if (url.username !== '' || url.password !== '') throw new UsageError('--gateway must not carry credentials (user:password@); the key is read from --key-file only');
  if (url.search !== '' || url.hash !== '') throw new UsageError('--gateway must not have a query or fragment');
  if (raw.length > 2048) throw new UsageError('--gateway is too long');
  return url;
}

export function messagesUrl(gateway: URL): string {
  return `${gateway.origin}${gateway.pathname.replace(/\/+$/, '')}/v1/messages`;
}

export function isLoopback(url: URL): boolean {
  const h = url.hostname.replace(/^\[|\]$/g, '');
  return h === 'localhost' || h === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(h);
}

/** Model ids as gateways name them (`claude-sonnet-4-5`, `anthropic/claude…`, `…@2025…`, `…:v1`). */
export function parseModel(raw: string): string {
  if (!/^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,199}$/.test(raw)) throw new UsageError('--model must be a model id (letters, digits and ._:/@-, at most 200 characters)');
  return raw;
}

/** An integer option within bounds, as a UsageError (exit 2) otherwise. */
export function boundedInt(raw: string, name: string, min: number, max: number): number {
  if (!/^\d{1,9}$/.test(raw.trim())) throw new UsageError(`${name} must be an integer from ${min} to ${max}`);
  const n = Number(raw.trim());
  if (n < min || n > max) throw new UsageError(`${name} must be an integer from ${min} to ${max}`);
  return n;
}

/**
 * Reads the API key from `path`: a regular file of at most 4 KiB, no group/other permission bits,
 * holding one line of printable ASCII (a header value) of 8..1024 characters. Checks are made on the
 * opened descriptor (no swap between check and read). No message contains the file's content, nor
 * its path (an operator who passes the key itself as --key-file must not see it echoed).
 */
export async function readKeyFile(path: string): Promise<string> {
  let handle;
  try {
    handle = await open(path, 'r');
  } catch (err) {
    throw new UsageError(`--key-file: cannot open the file: ${(err as NodeJS.ErrnoException).code ?? 'error'}`);
  }
  try {
    const st = await handle.stat();
    if (!st.isFile()) throw new UsageError(`--key-file: not a regular file`);
    if (process.platform !== 'win32' && (st.mode & 0o077) !== 0) {
      throw new UsageError(`--key-file: the file is accessible by group or others (mode ${(st.mode & 0o777).toString(8).padStart(4, '0')}); chmod 600 it (a Kubernetes Secret volume: defaultMode 0400)`);
    }
    if (st.size > LIMITS.keyFileBytes) throw new UsageError(`--key-file: the file is larger than ${LIMITS.keyFileBytes} bytes`);
    const buf = Buffer.alloc(LIMITS.keyFileBytes + 1);
    const { bytesRead } = await handle.read(buf, 0, buf.length, 0);
    if (bytesRead > LIMITS.keyFileBytes) throw new UsageError(`--key-file: the file is larger than ${LIMITS.keyFileBytes} bytes`);
    const key = buf.subarray(0, bytesRead).toString('latin1').trim();
    buf.fill(0);
    if (key === '') throw new UsageError(`--key-file: the file is empty`);
    if (!/^[\x21-\x7e]+$/.test(key)) throw new UsageError(`--key-file: the file must hold the key alone, on one line of printable ASCII without spaces`);
    if (key.length < LIMITS.keyChars.min || key.length > LIMITS.keyChars.max) throw new UsageError(`--key-file: the key must be ${LIMITS.keyChars.min} to ${LIMITS.keyChars.max} characters`);
    return key;
  } finally {
    await handle.close();
  }
}

/** Why fetch failed, without the error's own text when it might quote a header (it never should: the key is validated). */
function transportMessage(err: unknown): string {
  const e = err as { message?: string; cause?: { code?: string; message?: string } };
  const cause = e.cause;
  if (cause?.code !== undefined) return `${cause.code}${cause.message ? ` (${cause.message})` : ''}`;
  return cause?.message ?? e.message ?? String(err);
}

async function readBounded(body: ReadableStream<Uint8Array> | null, limit: number): Promise<string> {
  if (body === null) return '';
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let out = '';
  let bytes = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      bytes += value.byteLength;
      out += decoder.decode(value, { stream: true });
      if (bytes >= limit) break;
    }
  } finally {
    await reader.cancel().catch(() => undefined);
  }
  return out;
}

/** One model call: request, then the whole SSE body through the reader, under one deadline. */
export async function callModel(url: string, key: string, opts: PreflightOptions, c: PreflightCase, redact: (s: string) => string): Promise<CallOutcome> {
  const controller = new AbortController();
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    controller.abort();
  }, opts.timeoutMs);
  try {
    let res: Response;
    try {
      res = await fetch(url, {
        method: 'POST',
        redirect: 'manual',
        signal: controller.signal,
        headers: {
          'content-type': 'application/json',
          accept: 'text/event-stream',
          'anthropic-version': ANTHROPIC_VERSION,
          'x-api-key': key,
          'user-agent': 'sandboxctl-preflight',
        },
        body: JSON.stringify({ model: opts.model, max_tokens: opts.maxTokens, stream: true, messages: c.messages }),
      });
    } catch (err) {
      if (timedOut) return { kind: 'timeout', afterMs: opts.timeoutMs };
      return { kind: 'transport', message: redact(transportMessage(err)) };
    }
    if (res.status !== 200) {
      let body = '';
      try {
        body = await readBounded(res.body, LIMITS.errorBodyBytes);
      } catch {
        // the status says enough
      }
      if (timedOut) return { kind: 'timeout', afterMs: opts.timeoutMs };
      const where = res.status >= 300 && res.status < 400 ? ` (redirect to ${res.headers.get('location') ?? '?'} not followed: the key would go along)` : '';
      return { kind: 'http', status: res.status, body: redact(`${body}${where}`) };
    }
    const reader = new MessageStreamReader();
    const contentType = res.headers.get('content-type') ?? '';
    if (!/^text\/event-stream\b/i.test(contentType)) {
      await res.body?.cancel().catch(() => undefined);
      reader.fail(`content-type ${JSON.stringify(contentType.slice(0, 60))}, not text/event-stream`);
      return { kind: 'stream', stream: reader.result() };
    }
    if (res.body === null) return { kind: 'stream', stream: reader.result() };
    const body = res.body.getReader();
    const decoder = new TextDecoder();
    let bytes = 0;
    try {
      for (;;) {
        const { done, value } = await body.read();
        if (done) {
          reader.push(decoder.decode());
          break;
        }
        bytes += value.byteLength;
        if (bytes > LIMITS.streamBytes) {
          reader.fail(`the stream exceeds ${LIMITS.streamBytes} bytes`);
          break;
        }
        reader.push(decoder.decode(value, { stream: true }));
      }
    } catch (err) {
      if (timedOut) return { kind: 'timeout', afterMs: opts.timeoutMs };
      reader.interrupt(redact(transportMessage(err)));
    } finally {
      await body.cancel().catch(() => undefined);
    }
    // Whatever the gateway sent may quote the key (an echoing proxy): redact before any excerpt is cut.
    const stream = reader.result();
    const orNull = (v: string | null) => (v === null ? null : redact(v));
    return {
      kind: 'stream',
      stream: {
        ...stream, text: redact(stream.text), malformed: orNull(stream.malformed), interrupted: orNull(stream.interrupted),
        error: stream.error === null ? null : { type: redact(stream.error.type), message: redact(stream.error.message) },
      },
    };
  } finally {
    clearTimeout(timer);
  }
}

export interface PreflightDeps {
  readonly randomBytes: (n: number) => Uint8Array;
  readonly now: () => number;
  /** Called after each call (progress). */
  readonly onCall?: (c: PreflightCase, report: CallReport) => void;
}

/** Runs every case once, one call at a time (gentle on a gateway; 15 calls by default). */
export async function runPreflight(opts: PreflightOptions, key: string, deps: PreflightDeps): Promise<PreflightReport> {
  const redact = redactor(key);
  const cases = buildCases(opts.repetitions, deps.randomBytes);
  const url = messagesUrl(opts.gateway);
  const calls: CallReport[] = [];
  for (const c of cases) {
    const others = new Set(cases.filter((o) => o !== c).flatMap((o) => o.markers));
    const started = deps.now();
    const outcome = await callModel(url, key, opts, c, redact);
    const report = callReport(c, judge(c, outcome, others), deps.now() - started);
    calls.push(report);
    deps.onCall?.(c, report);
  }
  return { gateway: messagesUrl(opts.gateway), model: opts.model, repetitions: opts.repetitions, ...summarize(calls), calls };
}

const yesNo = (b: boolean): string => (b ? 'yes' : 'no');

export function renderPreflight(r: PreflightReport): string {
  const lines = [
    `gateway: ${r.gateway}`,
    `model:   ${r.model}`,
    '',
    table(['CASE', 'RESULT', 'REASON', 'HTTP', 'STOP', 'THINKING', 'LATENCY'], r.calls.map((c) => [
      caseName({ kind: c.case, repetition: c.repetition }),
      c.passed ? 'PASS' : 'FAIL',
      c.reason ?? '-',
      c.status === null ? '-' : String(c.status),
      c.stop_reason ?? '-',
      yesNo(c.thinking),
      `${c.latency_ms}ms`,
    ])),
  ];
  const failed = r.calls.filter((c) => !c.passed);
  if (failed.length > 0) {
    lines.push('');
    for (const c of failed) lines.push(`${caseName({ kind: c.case, repetition: c.repetition })}: ${c.reasons.join(',')}: ${c.detail}`);
  }
  lines.push(
    '',
    table(['CASE-KIND', 'PASSED', 'FAILED', 'REASONS'], r.cases.map((k) => [k.case, `${k.passed}/${k.calls}`, String(k.failed), k.reasons.join(',') || '-'])),
    '',
    `total:             ${r.total.passed}/${r.total.calls} calls passed, ${r.total.failed} failed`,
    `recall_passed:     ${r.recall_passed}`,
    `thinking_observed: ${r.thinking_observed} (informational)`,
    `preflight: ${r.ok ? 'OK' : 'FAILED'}`,
  );
  return lines.join('\n');
}
