// The I/O half of `sandboxctl preflight` (R-P3): reads the gateway key from a file, calls
// `POST <gateway>/v1/messages` (stream: true) once per case with node:http/https (directly, or through
// an HTTP proxy: CONNECT for an https gateway, absolute-form for http), and feeds the SSE body to the
// pure reader and verdict rules of ./preflight-cases.ts.
//
// What it asks for: by default the pinned Claude Code's own thinking setting (2.1.220 sends
// `thinking: {type: "adaptive"}`, `output_config: {effort: "high"}` with the `effort-2025-11-24`
// beta): a gateway that routes or rejects that differently fails here, not in a conversation.
// What it prints for every call: the verdict, the answer's excerpt and the gateway's request id
// (`request-id`, else `x-request-id`) — never the key, nor any request or auth header.
//
// The key: read from a file only (never argv, never the environment), refused when the file has
// any group or other permission bits (like ssh with a private key; a Kubernetes Secret volume needs
// `defaultMode: 0400`), sent only as the `x-api-key` header, never with a redirect (redirects are not
// followed: the header would go along), and replaced by `<redacted>` in everything this command
// prints, before any excerpt is cut, so not even a prefix of it can show.
import { open } from 'node:fs/promises';
import { request as httpRequest, type IncomingHttpHeaders, type IncomingMessage } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { connect as tlsConnect } from 'node:tls';
import { UsageError } from './connection.ts';
import {
  buildCases, callReport, caseName, judge, MessageStreamReader, summarize,
  type CallOutcome, type CallReport, type PreflightCase, type PreflightSummary,
} from './preflight-cases.ts';
import { table } from './output.ts';

export const ANTHROPIC_VERSION = '2023-06-01';
/** The thinking setting the pinned Claude Code (2.1.220) sends on every request, and the beta it needs. */
export const NATIVE_THINKING = { body: { thinking: { type: 'adaptive' }, output_config: { effort: 'high' } }, beta: 'effort-2025-11-24' } as const;
export type ThinkingSetting = 'adaptive-high' | 'off';
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
  /** Ask for the native adaptive/high thinking (default) or send no thinking setting. */
  readonly thinking?: ThinkingSetting;
  /** An HTTP proxy to reach the gateway through (see proxyFor). */
  readonly proxy?: URL;
}

export interface PreflightReport extends PreflightSummary {
  readonly gateway: string;
  readonly model: string;
  readonly repetitions: number;
  /** What was asked for: `adaptive (effort high)` or `none`. */
  readonly thinking: string;
  /** The proxy used, without credentials; null when none. */
  readonly proxy: string | null;
  readonly calls: readonly CallReport[];
}

/**
 * The HTTP proxy for `gateway`: `--proxy <url>` (`none`: no proxy even if the environment names
 * one), else HTTPS_PROXY/https_proxy (an https gateway) or HTTP_PROXY/http_proxy (an http one),
 * unless the gateway is on loopback or NO_PROXY/no_proxy names its host (`*`, the host, or a domain
 * suffix). Only http://
 * proxies (the tunnel to an https gateway is TLS end to end through CONNECT); credentials in the
 * proxy URL go in Proxy-Authorization and are never printed. Errors never repeat the URL.
 */
export function proxyFor(gateway: URL, flag: string | undefined, env: NodeJS.ProcessEnv): URL | undefined {
  let raw = flag;
  if (raw === 'none') return undefined;
  if (raw === undefined) {
    raw = gateway.protocol === 'https:' ? (env.HTTPS_PROXY ?? env.https_proxy) : (env.HTTP_PROXY ?? env.http_proxy);
    // As Go's ProxyFromEnvironment: a loopback gateway is never reached through an environment proxy.
    if (raw === undefined || raw === '' || isLoopback(gateway)) return undefined;
    const noProxy = (env.NO_PROXY ?? env.no_proxy ?? '').split(',').map((x) => x.trim().toLowerCase()).filter(Boolean);
    const host = gateway.hostname.toLowerCase();
    if (noProxy.some((n) => n === '*' || host === n.replace(/^\./, '') || host.endsWith(n.startsWith('.') ? n : `.${n}`))) return undefined;
  }
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new UsageError('the proxy must be an absolute http:// URL (from --proxy or HTTPS_PROXY/HTTP_PROXY)');
  }
  if (url.protocol !== 'http:') throw new UsageError('the proxy must be an http:// URL (an https gateway is reached through a CONNECT tunnel)');
  if (url.pathname !== '/' || url.search !== '' || url.hash !== '') throw new UsageError('the proxy URL must be scheme://[user:password@]host:port only');
  return url;
}

/** The proxy as it may be printed: no credentials. */
export function shownProxy(proxy: URL | undefined): string | null {
  return proxy === undefined ? null : `${proxy.protocol}//${proxy.host}`;
}

function proxyAuthorization(proxy: URL): Record<string, string> {
  if (proxy.username === '' && proxy.password === '') return {};
  const creds = `${decodeURIComponent(proxy.username)}:${decodeURIComponent(proxy.password)}`;
  return { 'proxy-authorization': `Basic ${Buffer.from(creds).toString('base64')}` };
}

/**
 * POST `body` to `url`, directly or through `proxy`; resolves with the response (status, headers,
 * body stream) once the headers arrived. Redirects are never followed. `signal` aborts everything.
 */
function post(url: URL, headers: Record<string, string>, body: string, proxy: URL | undefined, signal: AbortSignal): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    const payload = Buffer.from(body);
    const all = { ...headers, 'content-length': String(payload.length) };
    const send = (req: ReturnType<typeof httpRequest>): void => {
      const onAbort = (): void => {
        req.destroy(new Error('aborted'));
      };
      signal.addEventListener('abort', onAbort, { once: true });
      req.on('response', (res) => {
        signal.removeEventListener('abort', onAbort);
        signal.addEventListener('abort', () => res.destroy(new Error('aborted')), { once: true });
        resolve(res);
      });
      req.on('error', reject);
      req.end(payload);
    };
    const port = url.port !== '' ? Number(url.port) : url.protocol === 'https:' ? 443 : 80;
    if (proxy === undefined) {
      send((url.protocol === 'https:' ? httpsRequest : httpRequest)(url, { method: 'POST', headers: all, agent: false }));
      return;
    }
    const proxyPort = proxy.port !== '' ? Number(proxy.port) : 80;
    if (url.protocol === 'http:') {
      // Plain http through the proxy: the absolute URL as the request target.
      send(httpRequest({ host: proxy.hostname, port: proxyPort, method: 'POST', path: url.href, headers: { ...all, host: url.host, ...proxyAuthorization(proxy) }, agent: false }));
      return;
    }
    // https through the proxy: a CONNECT tunnel, then TLS to the gateway inside it (the proxy sees neither key nor body).
    const connect = httpRequest({ host: proxy.hostname, port: proxyPort, method: 'CONNECT', path: `${url.hostname}:${port}`, headers: { host: `${url.hostname}:${port}`, ...proxyAuthorization(proxy) }, agent: false });
    const onAbort = (): void => {
      connect.destroy(new Error('aborted'));
    };
    signal.addEventListener('abort', onAbort, { once: true });
    connect.on('connect', (res, socket) => {
      signal.removeEventListener('abort', onAbort);
      if (res.statusCode !== 200) {
        socket.destroy();
        reject(new Error(`the proxy refused the tunnel: HTTP ${res.statusCode ?? '?'}`));
        return;
      }
      send(httpsRequest(url, { method: 'POST', headers: all, agent: false, createConnection: () => tlsConnect({ socket, servername: url.hostname }) }));
    });
    connect.on('error', reject);
    connect.end();
  });
}

/** The gateway's id of a request: Anthropic's `request-id`, else the common `x-request-id`. */
export function requestIdOf(headers: IncomingHttpHeaders): string | null {
  const v = headers['request-id'] ?? headers['x-request-id'];
  const id = Array.isArray(v) ? v[0] : v;
  return typeof id === 'string' && /^[\x21-\x7e]{1,200}$/.test(id) ? id : null;
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

async function readBounded(body: IncomingMessage, limit: number): Promise<string> {
  const decoder = new TextDecoder();
  let out = '';
  let bytes = 0;
  try {
    for await (const chunk of body as AsyncIterable<Buffer>) {
      bytes += chunk.byteLength;
      out += decoder.decode(chunk, { stream: true });
      if (bytes >= limit) break;
    }
  } finally {
    body.destroy();
  }
  return out;
}

/** One model call: request, then the whole SSE body through the reader, under one deadline. */
export async function callModel(url: string, key: string, opts: PreflightOptions, c: PreflightCase, redact: (s: string) => string): Promise<{ outcome: CallOutcome; requestId: string | null }> {
  const controller = new AbortController();
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    controller.abort();
  }, opts.timeoutMs);
  let requestId: string | null = null;
  const done = (outcome: CallOutcome): { outcome: CallOutcome; requestId: string | null } => ({ outcome, requestId: requestId === null ? null : redact(requestId) });
  try {
    const native = (opts.thinking ?? 'adaptive-high') === 'adaptive-high';
    let res: IncomingMessage;
    try {
      res = await post(new URL(url), {
        'content-type': 'application/json',
        accept: 'text/event-stream',
        'anthropic-version': ANTHROPIC_VERSION,
        ...(native ? { 'anthropic-beta': NATIVE_THINKING.beta } : {}),
        'x-api-key': key,
        'user-agent': 'sandboxctl-preflight',
      }, JSON.stringify({ model: opts.model, max_tokens: opts.maxTokens, stream: true, ...(native ? NATIVE_THINKING.body : {}), messages: c.messages }), opts.proxy, controller.signal);
    } catch (err) {
      if (timedOut) return done({ kind: 'timeout', afterMs: opts.timeoutMs });
      return done({ kind: 'transport', message: redact(transportMessage(err)) });
    }
    requestId = requestIdOf(res.headers);
    const status = res.statusCode ?? 0;
    if (status !== 200) {
      let body = '';
      try {
        body = await readBounded(res, LIMITS.errorBodyBytes);
      } catch {
        // the status says enough
      }
      if (timedOut) return done({ kind: 'timeout', afterMs: opts.timeoutMs });
      const where = status >= 300 && status < 400 ? ` (redirect to ${String(res.headers.location ?? '?')} not followed: the key would go along)` : '';
      return done({ kind: 'http', status, body: redact(`${body}${where}`) });
    }
    const reader = new MessageStreamReader();
    const contentType = String(res.headers['content-type'] ?? '');
    if (!/^text\/event-stream\b/i.test(contentType)) {
      res.destroy();
      reader.fail(`content-type ${JSON.stringify(contentType.slice(0, 60))}, not text/event-stream`);
      return done({ kind: 'stream', stream: reader.result() });
    }
    const decoder = new TextDecoder();
    let bytes = 0;
    try {
      for await (const chunk of res as AsyncIterable<Buffer>) {
        bytes += chunk.byteLength;
        if (bytes > LIMITS.streamBytes) {
          reader.fail(`the stream exceeds ${LIMITS.streamBytes} bytes`);
          break;
        }
        reader.push(decoder.decode(chunk, { stream: true }));
      }
      reader.push(decoder.decode());
    } catch (err) {
      if (timedOut) return done({ kind: 'timeout', afterMs: opts.timeoutMs });
      reader.interrupt(redact(transportMessage(err)));
    } finally {
      res.destroy();
    }
    if (timedOut) return done({ kind: 'timeout', afterMs: opts.timeoutMs });
    // Whatever the gateway sent may quote the key (an echoing proxy): redact before any excerpt is cut.
    const stream = reader.result();
    const orNull = (v: string | null) => (v === null ? null : redact(v));
    return done({
      kind: 'stream',
      stream: {
        ...stream, text: redact(stream.text), malformed: orNull(stream.malformed), interrupted: orNull(stream.interrupted),
        error: stream.error === null ? null : { type: redact(stream.error.type), message: redact(stream.error.message) },
      },
    });
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
    const { outcome, requestId } = await callModel(url, key, opts, c, redact);
    const report = callReport(c, judge(c, outcome, others), deps.now() - started, requestId);
    calls.push(report);
    deps.onCall?.(c, report);
  }
  return {
    gateway: messagesUrl(opts.gateway), model: opts.model, repetitions: opts.repetitions,
    thinking: (opts.thinking ?? 'adaptive-high') === 'adaptive-high' ? 'adaptive (effort high)' : 'none', proxy: shownProxy(opts.proxy),
    ...summarize(calls), calls,
  };
}

const yesNo = (b: boolean): string => (b ? 'yes' : 'no');

export function renderPreflight(r: PreflightReport): string {
  const lines = [
    `gateway:  ${r.gateway}`,
    `model:    ${r.model}`,
    `thinking: ${r.thinking} asked`,
    ...(r.proxy !== null ? [`proxy:    ${r.proxy}`] : []),
    '',
    table(['CASE', 'RESULT', 'REASON', 'HTTP', 'STOP', 'THINKING', 'LATENCY', 'REQUEST-ID'], r.calls.map((c) => [
      caseName({ kind: c.case, repetition: c.repetition }),
      c.passed ? 'PASS' : 'FAIL',
      c.reason ?? '-',
      c.status === null ? '-' : String(c.status),
      c.stop_reason ?? '-',
      yesNo(c.thinking),
      `${c.latency_ms}ms`,
      c.request_id ?? '-',
    ])),
    '',
    'answers:',
    ...r.calls.map((c) => `  ${caseName({ kind: c.case, repetition: c.repetition })} [${c.request_id ?? 'no request id'}]: ${c.reply_excerpt === '' ? '(no answer)' : JSON.stringify(c.reply_excerpt)}`),
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
