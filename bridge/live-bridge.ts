// live-bridge: the http-agent live-bridge helper, version 4, that the sandbox image ships at
// /usr/local/bin/live-bridge (R-S7 is its contract; R-H2 reads its version). It runs OpenCode or
// Kilo as their own headless server and turns their event stream into turns a runner can drive
// through nothing but a process in the member container (the fleet's Exec):
//
//   live-bridge --version            prints `http-agent-live-bridge=4` (the attestation probe)
//   live-bridge serve --cli opencode  the member's main process: starts `<cli> serve` on loopback
//                                     (a random password of its own), holds ONE subscription to its
//                                     `GET /event` stream, and listens on a unix socket that serves
//                                     the CLI's own server API (every path is passed through) plus
//                                     POST /bridge/v4/turn
//   live-bridge turn --turn-id T [--session S] [--model P/M] [--] PROMPT
//                                     one turn: prints the turn's events as JSON lines, tagged with
//                                     `turnId`, and exits after `settled`
//   live-bridge api METHOD PATH [JSON] one request to the CLI's own API through the bridge
//
// The v4 guarantees (R-S5, R-S7):
// - a turn is attached to the event subscription that is active when it starts; events of any other
//   subscription never reach it, and a turn is never started while no subscription is active;
// - `settled` (with the root session id) is emitted for the current turn once the native session is
//   idle again after it was busy with the turn (a prompt the CLI accepted but never became busy with
//   settles `aborted` after --start-timeout-ms, 30 s); events of other sessions are not forwarded,
//   events of the root session and of the Task child sessions it reports (`parentID` chain) are;
// - the stream cannot be replayed: a turn id is accepted once; a client that goes away aborts the
//   native turn (`POST /session/:id/abort`) and the bridge refuses the next turn until the session is
//   idle; a subscription that breaks aborts the turns attached to it, which settle `aborted`;
// - permission requests of the root session and its Task children are answered `once`
//   automatically; a reply that fails is retried once, then the turn is aborted and settles with the
//   error (never hangs); a native question is rejected by its own id (one reply per question, v3).
// Plain Node.js (the image carries this machine's `node`); no dependencies. Built into the image by
// transpiling this file (TypeScript's transpileModule); see test/support/live-bridge-image.ts.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { realpathSync, rmSync } from 'node:fs';
import { createServer, request, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createTcpServer } from 'node:net';
import { pathToFileURL } from 'node:url';

export const BRIDGE_VERSION = 4;
export const VERSION_LINE = `http-agent-live-bridge=${BRIDGE_VERSION}`;
export const DEFAULT_SOCKET = '/dev/shm/live-bridge.sock';
export const TURN_PATH = '/bridge/v4/turn';

/** Bounds on what the bridge accepts (R-R4). */
const MAX_BODY_BYTES = 1024 * 1024;
const MAX_PROMPT_BYTES = 256 * 1024;
const MAX_SSE_EVENT_BYTES = 16 * 1024 * 1024;
const MAX_REMEMBERED_TURNS = 4096;
const MAX_CHILD_SESSIONS = 1024;
const ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;
const SESSION_ID = /^ses_[A-Za-z0-9]{1,64}$/;
const MODEL = /^[A-Za-z0-9._-]{1,64}\/[A-Za-z0-9._:-]{1,128}$/;

type Json = Record<string, unknown>;
const isRec = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);
const str = (v: unknown): string | undefined => (typeof v === 'string' ? v : undefined);

export interface CliSpec {
  /** Environment variable prefix of the CLI's server credentials (OPENCODE_SERVER_PASSWORD, KILO_…). */
  readonly envPrefix: string;
  readonly binary: string;
}

export const CLIS: Readonly<Record<string, CliSpec>> = {
  opencode: { envPrefix: 'OPENCODE', binary: '/usr/local/bin/opencode' },
  kilo: { envPrefix: 'KILO', binary: '/usr/local/bin/kilo' },
};

const log = (msg: string, extra: Json = {}): void => {
  process.stderr.write(`${JSON.stringify({ t: new Date().toISOString(), bridge: BRIDGE_VERSION, msg, ...extra })}\n`);
};

// ---- the CLI's own server ----------------------------------------------------------------------

interface Answer {
  readonly status: number;
  readonly body: string;
}

/** The CLI's HTTP server on loopback, with the credentials only the bridge knows. */
class CliServer {
  constructor(readonly base: URL, readonly auth: string | undefined) {}

  /** One request; resolves with status and body (bounded), rejects on a transport error or timeout. */
  call(method: string, path: string, body?: unknown, timeoutMs = 30_000): Promise<Answer> {
    return new Promise((resolve, reject) => {
      const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
      const req = request(new URL(path, this.base), {
        method,
        headers: { ...(this.auth ? { authorization: this.auth } : {}), ...(payload ? { 'content-type': 'application/json', 'content-length': payload.length } : {}) },
        timeout: timeoutMs,
      }, (res) => {
        const chunks: Buffer[] = [];
        let size = 0;
        res.on('data', (c: Buffer) => {
          size += c.length;
          if (size <= MAX_BODY_BYTES * 16) chunks.push(c);
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }));
        res.on('error', reject);
      });
      req.on('timeout', () => req.destroy(new Error(`${method} ${path}: timed out after ${timeoutMs} ms`)));
      req.on('error', reject);
      req.end(payload);
    });
  }

  /** Pass a request of a bridge client through to the CLI's API unchanged (but for our credentials). */
  proxy(inbound: IncomingMessage, outbound: ServerResponse): void {
    const headers = { ...inbound.headers };
    delete headers.host;
    delete headers.authorization;
    if (this.auth) headers.authorization = this.auth;
    const req = request(new URL(inbound.url ?? '/', this.base), { method: inbound.method, headers }, (res) => {
      outbound.writeHead(res.statusCode ?? 502, res.headers);
      res.pipe(outbound);
    });
    req.on('error', (err) => {
      if (!outbound.headersSent) outbound.writeHead(502, { 'content-type': 'application/json' });
      outbound.end(JSON.stringify({ error: 'cli_unreachable', message: err.message }));
    });
    outbound.on('close', () => req.destroy());
    inbound.pipe(req);
  }
}

/** A free loopback port (the CLI's own default port may be taken by another member on the host network). */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createTcpServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const address = s.address();
      const port = typeof address === 'object' && address !== null ? address.port : 0;
      s.close(() => resolve(port));
    });
  });
}

/** Start `<binary> serve` and wait for its "listening on http://…" line. */
async function startCli(spec: CliSpec, binary: string): Promise<{ child: ChildProcess; server: CliServer }> {
  const password = randomBytes(24).toString('base64url');
  const port = await freePort();
  const child = spawn(binary, ['serve', '--hostname', '127.0.0.1', '--port', String(port)], {
    // A sandboxed server of a pinned CLI: no self-update, no sharing, no model catalogue or LSP
    // downloads (each only if the image or operator did not decide otherwise).
    env: {
      ...Object.fromEntries(['DISABLE_AUTOUPDATE', 'DISABLE_SHARE', 'DISABLE_MODELS_FETCH', 'DISABLE_LSP_DOWNLOAD'].map((k) => [`${spec.envPrefix}_${k}`, '1'])),
      ...process.env,
      [`${spec.envPrefix}_SERVER_USERNAME`]: 'bridge',
      [`${spec.envPrefix}_SERVER_PASSWORD`]: password,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const url = await new Promise<URL>((resolve, reject) => {
    let seen = '';
    const timer = setTimeout(() => reject(new Error(`${binary} serve printed no address within 60 s: ${seen.slice(-500)}`)), 60_000);
    const onData = (c: Buffer): void => {
      seen = (seen + c.toString('utf8')).slice(-8192);
      const m = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(seen);
      if (m) {
        clearTimeout(timer);
        resolve(new URL(m[1]!));
      }
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', onData);
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`${binary} serve exited (${code ?? signal}) before listening: ${seen.slice(-500)}`));
    });
  });
  // Keep draining its output so it never blocks on a full pipe; its log is the bridge's stderr.
  child.stdout!.removeAllListeners('data');
  child.stderr!.removeAllListeners('data');
  child.stdout!.on('data', (c: Buffer) => process.stderr.write(c));
  child.stderr!.on('data', (c: Buffer) => process.stderr.write(c));
  return { child, server: new CliServer(url, `Basic ${Buffer.from(`bridge:${password}`).toString('base64')}`) };
}

// ---- the event subscription ----------------------------------------------------------------------

/** One `GET /event` stream; `id` numbers subscriptions so a turn knows which one it belongs to. */
class Subscription {
  active = false;
  #req: ReturnType<typeof request> | undefined;

  constructor(
    readonly id: number,
    private readonly server: CliServer,
    private readonly onEvent: (sub: Subscription, e: Json) => void,
    private readonly onEnd: (sub: Subscription, why: string) => void,
  ) {}

  /** Resolves once the server answered 200 (the stream is live), rejects otherwise. */
  open(): Promise<void> {
    return new Promise((resolve, reject) => {
      const headers: Record<string, string> = { accept: 'text/event-stream' };
      if (this.server.auth) headers.authorization = this.server.auth;
      const req = request(new URL('/event', this.server.base), { method: 'GET', headers }, (res) => {
        if (res.statusCode !== 200) {
          res.resume();
          reject(new Error(`GET /event answered ${res.statusCode}`));
          return;
        }
        this.active = true;
        resolve();
        let buffer = '';
        let data: string[] = [];
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          buffer += chunk;
          if (buffer.length > MAX_SSE_EVENT_BYTES) {
            this.end('an event larger than the bound');
            return;
          }
          for (let nl = buffer.indexOf('\n'); nl !== -1; nl = buffer.indexOf('\n')) {
            const line = buffer.slice(0, nl).replace(/\r$/, '');
            buffer = buffer.slice(nl + 1);
            if (line === '') {
              if (data.length > 0) this.#dispatch(data.join('\n'));
              data = [];
            } else if (line.startsWith('data:')) {
              data.push(line.slice(line.startsWith('data: ') ? 6 : 5));
            }
          }
        });
        res.on('end', () => this.end('the CLI ended the event stream'));
        res.on('error', (err) => this.end(`event stream error: ${err.message}`));
      });
      req.on('error', (err) => {
        if (this.active) this.end(`event stream error: ${err.message}`);
        else reject(err);
      });
      req.end();
      this.#req = req;
    });
  }

  #dispatch(text: string): void {
    let e: unknown;
    try {
      e = JSON.parse(text);
    } catch {
      return;
    }
    if (isRec(e) && typeof e.type === 'string') this.onEvent(this, e);
  }

  end(why: string): void {
    if (!this.active) return;
    this.active = false;
    this.#req?.destroy();
    this.onEnd(this, why);
  }
}

// ---- turns ---------------------------------------------------------------------------------------

/** The session an event is about (every OpenCode/Kilo event names it in one of these places). */
function sessionOf(e: Json): string | undefined {
  const p = isRec(e.properties) ? e.properties : {};
  return str(p.sessionID) ?? (isRec(p.info) ? str(p.info.sessionID) : undefined) ?? (isRec(p.part) ? str(p.part.sessionID) : undefined);
}

interface TurnRequest {
  readonly turnId: string;
  readonly prompt: string;
  readonly sessionID?: string;
  readonly model?: { providerID: string; modelID: string };
}

export function parseTurnRequest(body: unknown): TurnRequest | string {
  if (!isRec(body)) return 'body must be a JSON object';
  const turnId = body.turnId;
  if (typeof turnId !== 'string' || !ID.test(turnId)) return 'turnId must be 1..128 of A-Za-z0-9._:- (starting alphanumeric)';
  const prompt = body.prompt;
  if (typeof prompt !== 'string' || prompt.length === 0 || Buffer.byteLength(prompt) > MAX_PROMPT_BYTES) return `prompt must be 1..${MAX_PROMPT_BYTES} bytes`;
  const sessionID = body.sessionID;
  if (sessionID !== undefined && (typeof sessionID !== 'string' || !SESSION_ID.test(sessionID))) return 'sessionID must look like ses_<alphanumerics>';
  const model = body.model;
  if (model !== undefined && (typeof model !== 'string' || !MODEL.test(model))) return 'model must be <provider>/<model>';
  const [providerID, modelID] = typeof model === 'string' ? [model.slice(0, model.indexOf('/')), model.slice(model.indexOf('/') + 1)] : [];
  return { turnId, prompt, ...(sessionID !== undefined ? { sessionID } : {}), ...(providerID !== undefined && modelID !== undefined ? { model: { providerID, modelID } } : {}) };
}

class Turn {
  readonly sessions: Set<string>;
  sawBusy = false;
  /** When the CLI accepted the prompt (prompt_async answered). */
  acceptedAt: number | undefined;
  done = false;
  /** Set when the bridge aborted the native turn; `settled` then says why. */
  aborted: string | undefined;
  readonly repliedPermissions = new Set<string>();

  constructor(readonly id: string, readonly root: string, readonly sub: Subscription, readonly out: ServerResponse) {
    this.sessions = new Set([root]);
  }

  write(type: string, properties: Json): void {
    if (!this.out.writableEnded) this.out.write(`${JSON.stringify({ turnId: this.id, type, properties })}\n`);
  }
}

export interface BridgeOptions {
  readonly cli: string;
  readonly socket: string;
  /** Attach to a CLI server that is already running (tests of the bridge against a named stub) instead of starting one. */
  readonly attach?: { readonly url: string; readonly auth?: string };
  readonly binary?: string;
  /** A prompt the CLI accepted but never became busy with, this long after, settles as aborted (never hangs). */
  readonly startTimeoutMs?: number;
}

/** The bridge daemon (`live-bridge serve`). */
export class Bridge {
  #server: CliServer | undefined;
  #child: ChildProcess | undefined;
  #http: Server | undefined;
  #sub: Subscription | undefined;
  #subs = 0;
  #turn: Turn | undefined;
  /** The session of an aborted turn, until it is idle again: no new turn meanwhile (one at a time). */
  #draining: { session: string; until: number } | undefined;
  readonly #seen: string[] = [];
  #stopping = false;
  #poll: NodeJS.Timeout | undefined;

  constructor(private readonly options: BridgeOptions) {}

  async start(): Promise<void> {
    const spec = CLIS[this.options.cli];
    if (this.options.attach !== undefined) {
      this.#server = new CliServer(new URL(this.options.attach.url), this.options.attach.auth);
    } else {
      if (spec === undefined) throw new Error(`unknown CLI ${this.options.cli} (opencode or kilo)`);
      const started = await startCli(spec, this.options.binary ?? spec.binary);
      this.#server = started.server;
      this.#child = started.child;
      started.child.on('exit', (code, signal) => {
        if (this.#stopping) return;
        log('the CLI server exited; the bridge stops', { code, signal });
        this.#sub?.end('the CLI server exited');
        void this.stop(1);
      });
    }
    await this.#subscribe();
    rmSync(this.options.socket, { force: true });
    this.#http = createServer((req, res) => void this.#route(req, res));
    await new Promise<void>((resolve, reject) => {
      this.#http!.once('error', reject);
      this.#http!.listen(this.options.socket, () => resolve());
    });
    // A safety net for a missed idle event: the status map says when the session is idle.
    this.#poll = setInterval(() => void this.#pollStatus(), 1_000);
    log('ready', { cli: this.options.cli, socket: this.options.socket });
  }

  async #subscribe(): Promise<void> {
    for (let delay = 250; !this.#stopping; delay = Math.min(delay * 2, 5_000)) {
      const sub = new Subscription(++this.#subs, this.#server!, (s, e) => this.#onEvent(s, e), (s, why) => this.#onSubscriptionEnd(s, why));
      try {
        await sub.open();
        this.#sub = sub;
        return;
      } catch (err) {
        log('subscribing to the CLI events failed; retrying', { error: (err as Error).message });
        await new Promise((r) => setTimeout(r, delay));
      }
    }
  }

  #onSubscriptionEnd(sub: Subscription, why: string): void {
    log('event subscription ended', { subscription: sub.id, why });
    const t = this.#turn;
    if (t !== undefined && t.sub === sub && !t.done) void this.#abort(t, `event subscription lost (${why}); turn aborted`);
    if (!this.#stopping) void this.#subscribe();
  }

  #onEvent(sub: Subscription, e: Json): void {
    const t = this.#turn;
    const props = isRec(e.properties) ? e.properties : {};
    const session = sessionOf(e);
    const type = String(e.type);
    if (this.#draining !== undefined && session === this.#draining.session && (type === 'session.idle' || (type === 'session.status' && isRec(props.status) && props.status.type === 'idle'))) this.#draining = undefined;
    // Events of another subscription never reach a turn (it was attached to the one active when it started).
    if (t === undefined || t.done || t.sub !== sub) return;
    // Task child sessions the root turn reports: their parent is the root or one of its children.
    if ((type === 'session.created' || type === 'session.updated') && isRec(props.info)) {
      const child = str(props.info.id);
      const parent = str(props.info.parentID);
      if (child !== undefined && parent !== undefined && t.sessions.has(parent) && t.sessions.size < MAX_CHILD_SESSIONS) t.sessions.add(child);
    }
    if (session === undefined || !t.sessions.has(session)) return;
    t.write(type, props);
    if (type === 'permission.asked') void this.#replyPermission(t, str(props.id));
    else if (type === 'question.asked') void this.#rejectQuestion(t, str(props.id));
    else if (session === t.root && type === 'session.status' && isRec(props.status)) {
      if (props.status.type === 'busy' || props.status.type === 'retry') t.sawBusy = true;
      else if (props.status.type === 'idle' && t.sawBusy) this.#settle(t);
    } else if (session === t.root && type === 'session.idle' && t.sawBusy) this.#settle(t);
  }

  /** A one-shot permission reply (`once`); a failed reply is retried once, then the turn is aborted. */
  async #replyPermission(t: Turn, requestID: string | undefined): Promise<void> {
    if (requestID === undefined || t.repliedPermissions.has(requestID)) return;
    t.repliedPermissions.add(requestID);
    let last = '';
    for (let attempt = 1; attempt <= 2; attempt++) {
      try {
        const a = await this.#server!.call('POST', `/permission/${encodeURIComponent(requestID)}/reply`, { reply: 'once' });
        if (a.status >= 200 && a.status < 300) {
          t.write('bridge.permission.replied', { requestID, reply: 'once', attempt });
          return;
        }
        last = `HTTP ${a.status}: ${a.body.slice(0, 200)}`;
      } catch (err) {
        last = (err as Error).message;
      }
      t.write('bridge.permission.reply_failed', { requestID, attempt, error: last });
    }
    await this.#abort(t, `permission reply failed twice (${last}); turn aborted`);
  }

  /** The bridge cannot answer a native question: reject exactly that question, so the turn goes on. */
  async #rejectQuestion(t: Turn, requestID: string | undefined): Promise<void> {
    if (requestID === undefined) return;
    const a = await this.#server!.call('POST', `/question/${encodeURIComponent(requestID)}/reject`).catch((err: Error) => ({ status: 0, body: err.message }));
    t.write('bridge.question.rejected', { requestID, ok: a.status >= 200 && a.status < 300 });
  }

  /** Abort the native turn; it settles `aborted` once the session is idle (or at once if nothing answers). */
  async #abort(t: Turn, why: string): Promise<void> {
    if (t.done || t.aborted !== undefined) return;
    t.aborted = why;
    t.sawBusy = true;
    await this.#server!.call('POST', `/session/${encodeURIComponent(t.root)}/abort`).catch((err: Error) => log('abort failed', { error: err.message }));
    // Without a live subscription no idle event can come: the status poll settles it.
  }

  async #pollStatus(): Promise<void> {
    const t = this.#turn;
    const draining = this.#draining;
    if ((t === undefined || t.done) && draining === undefined) return;
    const a = await this.#server!.call('GET', '/session/status', undefined, 5_000).catch(() => undefined);
    if (a === undefined || a.status !== 200) return;
    let map: unknown;
    try {
      map = JSON.parse(a.body);
    } catch {
      return;
    }
    if (!isRec(map)) return;
    const busy = (s: string): boolean => isRec(map[s]) && (map[s] as Json).type !== 'idle';
    if (draining !== undefined && (!busy(draining.session) || Date.now() > draining.until)) this.#draining = undefined;
    if (t === undefined || t.done) return;
    if (busy(t.root)) t.sawBusy = true;
    else if (t.sawBusy) this.#settle(t);
    else if (t.acceptedAt !== undefined && Date.now() - t.acceptedAt > (this.options.startTimeoutMs ?? 30_000)) {
      // Idle, and never busy with the prompt it accepted: nothing will run; say so instead of waiting.
      t.aborted = 'the CLI accepted the prompt but never started the turn';
      this.#settle(t);
    }
  }

  #settle(t: Turn): void {
    if (t.done) return;
    t.done = true;
    t.write('settled', { sessionID: t.root, ...(t.aborted !== undefined ? { aborted: true, error: t.aborted } : {}) });
    t.out.end();
    if (this.#turn === t) this.#turn = undefined;
  }

  async #route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? '/').split('?')[0];
    try {
      if (path === '/bridge/v4/health') {
        json(res, 200, { version: BRIDGE_VERSION, cli: this.options.cli, subscription: this.#sub?.active ? this.#sub.id : null, turn: this.#turn?.id ?? null });
      } else if (path === TURN_PATH && req.method === 'POST') {
        await this.#startTurn(req, res);
      } else if (path?.startsWith('/bridge/')) {
        json(res, 404, { error: 'not_found' });
      } else {
        this.#server!.proxy(req, res);
      }
    } catch (err) {
      if (!res.headersSent) json(res, 500, { error: 'bridge_error', message: (err as Error).message });
      else res.end();
    }
  }

  async #startTurn(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const body = await readBody(req).catch(() => undefined);
    if (body === undefined) return json(res, 413, { error: 'invalid_request', message: `body must be JSON of at most ${MAX_BODY_BYTES} bytes` });
    const parsed = parseTurnRequest(body);
    if (typeof parsed === 'string') return json(res, 400, { error: 'invalid_request', message: parsed });
    // No replay: a turn id is accepted once, whatever became of it.
    if (this.#seen.includes(parsed.turnId)) return json(res, 409, { error: 'turn_replayed', message: `turn ${parsed.turnId} was already started; its stream cannot be replayed` });
    if (this.#turn !== undefined || this.#draining !== undefined) return json(res, 409, { error: 'turn_in_flight', message: `turn ${this.#turn?.id ?? '(aborted)'} has not settled` });
    const sub = this.#sub;
    if (sub === undefined || !sub.active) return json(res, 503, { error: 'subscription_unavailable', message: 'no live event subscription to the CLI' });
    let session = parsed.sessionID;
    if (session !== undefined) {
      const found = await this.#server!.call('GET', `/session/${session}`);
      if (found.status === 404) return json(res, 404, { error: 'session_not_found', message: `no native session ${session}` });
      if (found.status !== 200) return json(res, 502, { error: 'cli_error', message: `GET /session answered ${found.status}` });
    } else {
      const made = await this.#server!.call('POST', '/session', {});
      const info = made.status === 200 ? (JSON.parse(made.body) as unknown) : undefined;
      session = isRec(info) ? str(info.id) : undefined;
      if (session === undefined) return json(res, 502, { error: 'cli_error', message: `POST /session answered ${made.status}` });
    }
    this.#seen.push(parsed.turnId);
    if (this.#seen.length > MAX_REMEMBERED_TURNS) this.#seen.shift();
    res.writeHead(200, { 'content-type': 'application/x-ndjson', 'cache-control': 'no-store' });
    const t = new Turn(parsed.turnId, session, sub, res);
    this.#turn = t;
    t.write('bridge.turn', { sessionID: session, subscription: sub.id, version: BRIDGE_VERSION });
    // The client going away before `settled` is a disconnect: abort the native turn, never replay.
    res.on('close', () => {
      if (t.done) return;
      t.done = true;
      if (this.#turn === t) this.#turn = undefined;
      this.#draining = { session: t.root, until: Date.now() + 60_000 };
      log('turn stream dropped; aborting the native turn', { turnId: t.id, sessionID: t.root });
      void this.#server!.call('POST', `/session/${encodeURIComponent(t.root)}/abort`).catch((err: Error) => log('abort failed', { error: err.message }));
    });
    const sent = await this.#server!.call('POST', `/session/${encodeURIComponent(session)}/prompt_async`, {
      parts: [{ type: 'text', text: parsed.prompt }],
      ...(parsed.model !== undefined ? { model: parsed.model } : {}),
    }).catch((err: Error) => ({ status: 0, body: err.message }));
    t.acceptedAt = Date.now();
    if (sent.status < 200 || sent.status >= 300) {
      // Refused by the CLI: nothing ran, so this is no native turn end (no `settled`).
      t.write('bridge.rejected', { status: sent.status, message: sent.body.slice(0, 2000) });
      t.done = true;
      if (this.#turn === t) this.#turn = undefined;
      res.end();
    }
  }

  async stop(code = 0): Promise<never> {
    if (!this.#stopping) {
      this.#stopping = true;
      if (this.#poll) clearInterval(this.#poll);
      this.#sub?.end('the bridge is stopping');
      this.#http?.close();
      rmSync(this.options.socket, { force: true });
      const child = this.#child;
      if (child !== undefined && child.exitCode === null && child.signalCode === null) {
        const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
        child.kill('SIGTERM');
        const killer = setTimeout(() => child.kill('SIGKILL'), 10_000);
        await exited;
        clearTimeout(killer);
      }
    }
    process.exit(code);
  }
}

function json(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

function readBody(req: IncomingMessage): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > MAX_BODY_BYTES) {
        req.destroy();
        reject(new Error('too large'));
      } else chunks.push(c);
    });
    req.on('end', () => {
      try {
        resolve(JSON.parse(Buffer.concat(chunks).toString('utf8')));
      } catch (err) {
        reject(err as Error);
      }
    });
    req.on('error', reject);
  });
}

// ---- the client side (`turn`, `api`), run by the runner through the fleet's Exec ------------------

/** A request to the bridge's socket, retried until the daemon listens (a container just started) or `waitMs` passed. */
function bridgeRequest(socket: string, method: string, path: string, body: unknown, waitMs: number): Promise<IncomingMessage & { abort: () => void }> {
  const deadline = Date.now() + waitMs;
  return new Promise((resolve, reject) => {
    const attempt = (): void => {
      const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
      const req = request({ socketPath: socket, path, method, headers: payload ? { 'content-type': 'application/json', 'content-length': payload.length } : {} }, (res) => {
        // 503 while the daemon has no subscription yet (it is starting): wait and retry.
        if (res.statusCode === 503 && Date.now() < deadline) {
          res.resume();
          setTimeout(attempt, 250);
          return;
        }
        resolve(Object.assign(res, { abort: () => req.destroy() }));
      });
      req.on('error', (err: NodeJS.ErrnoException) => {
        if ((err.code === 'ENOENT' || err.code === 'ECONNREFUSED') && Date.now() < deadline) setTimeout(attempt, 250);
        else reject(err);
      });
      req.end(payload);
    };
    attempt();
  });
}

async function runTurnClient(args: Args): Promise<number> {
  const turnId = args.flags.get('turn-id');
  const prompt = args.rest.join(' ');
  if (turnId === undefined || prompt === '') return usage('turn needs --turn-id and a prompt');
  const res = await bridgeRequest(args.socket, 'POST', TURN_PATH, {
    turnId, prompt,
    ...(args.flags.has('session') ? { sessionID: args.flags.get('session') } : {}),
    ...(args.flags.has('model') ? { model: args.flags.get('model') } : {}),
  }, Number(args.flags.get('wait-ms') ?? 60_000));
  // A signal (the runner cancelled the Exec) closes the stream: the bridge aborts the native turn.
  for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => {
    res.abort();
    process.exit(sig === 'SIGINT' ? 130 : 143);
  });
  if (res.statusCode !== 200) {
    const text = await new Promise<string>((resolve) => {
      let s = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (s += c));
      res.on('end', () => resolve(s));
    });
    process.stderr.write(`${text}\n`);
    return 1;
  }
  let settled = false;
  let rest = '';
  res.setEncoding('utf8');
  await new Promise<void>((resolve) => {
    res.on('data', (chunk: string) => {
      rest += chunk;
      for (let nl = rest.indexOf('\n'); nl !== -1; nl = rest.indexOf('\n')) {
        const line = rest.slice(0, nl);
        rest = rest.slice(nl + 1);
        process.stdout.write(`${line}\n`);
        if (line.includes('"type":"settled"')) settled = true;
      }
    });
    res.on('end', resolve);
    res.on('error', () => resolve());
    res.on('close', resolve);
  });
  return settled ? 0 : 1;
}

async function runApiClient(args: Args): Promise<number> {
  const [method, path, body] = args.rest;
  if (method === undefined || path === undefined || !path.startsWith('/')) return usage('api needs METHOD /path [JSON]');
  const res = await bridgeRequest(args.socket, method.toUpperCase(), path, body === undefined ? undefined : JSON.parse(body), Number(args.flags.get('wait-ms') ?? 60_000));
  const chunks: Buffer[] = [];
  for await (const c of res) chunks.push(c as Buffer);
  process.stdout.write(Buffer.concat(chunks));
  process.stdout.write('\n');
  return (res.statusCode ?? 0) >= 200 && (res.statusCode ?? 0) < 300 ? 0 : 1;
}

interface Args {
  readonly command: string | undefined;
  readonly flags: Map<string, string>;
  readonly rest: string[];
  readonly socket: string;
}

const VALUE_FLAGS = new Set(['cli', 'socket', 'turn-id', 'session', 'model', 'wait-ms', 'binary', 'attach', 'attach-auth', 'start-timeout-ms']);

export function parseArgs(argv: readonly string[]): Args | string {
  const flags = new Map<string, string>();
  const rest: string[] = [];
  let command: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '--') {
      rest.push(...argv.slice(i + 1));
      break;
    }
    if (a === '--version') return 'version';
    if (a.startsWith('--')) {
      const name = a.slice(2);
      if (!VALUE_FLAGS.has(name)) return `unknown flag ${a}`;
      const v = argv[i + 1];
      if (v === undefined) return `${a} needs a value`;
      flags.set(name, v);
      i++;
    } else if (command === undefined) command = a;
    else rest.push(a);
  }
  return { command, flags, rest, socket: flags.get('socket') ?? process.env.LIVE_BRIDGE_SOCKET ?? DEFAULT_SOCKET };
}

function usage(problem: string): number {
  process.stderr.write(`live-bridge: ${problem}\nusage: live-bridge --version | serve --cli opencode|kilo [--socket PATH] | turn --turn-id ID [--session ID] [--model P/M] [--] PROMPT | api METHOD /path [JSON]\n`);
  return 2;
}

export async function main(argv: readonly string[]): Promise<number> {
  const args = parseArgs(argv);
  if (args === 'version') {
    process.stdout.write(`${VERSION_LINE}\n`);
    return 0;
  }
  if (typeof args === 'string') return usage(args);
  switch (args.command) {
    case 'serve': {
      const cli = args.flags.get('cli');
      if (cli === undefined || (CLIS[cli] === undefined && !args.flags.has('attach'))) return usage('serve needs --cli opencode|kilo');
      const attach = args.flags.get('attach');
      const bridge = new Bridge({
        cli, socket: args.socket,
        ...(attach !== undefined ? { attach: { url: attach, ...(args.flags.has('attach-auth') ? { auth: args.flags.get('attach-auth')! } : {}) } } : {}),
        ...(args.flags.has('binary') ? { binary: args.flags.get('binary')! } : {}),
        ...(args.flags.has('start-timeout-ms') ? { startTimeoutMs: Number(args.flags.get('start-timeout-ms')) } : {}),
      });
      // The member's main process: SIGTERM (a clean stop) stops the CLI and exits 0 by itself (R-G2).
      process.on('SIGTERM', () => void bridge.stop(0));
      process.on('SIGINT', () => void bridge.stop(0));
      await bridge.start();
      return new Promise<number>(() => undefined);
    }
    case 'turn':
      return runTurnClient(args);
    case 'api':
      return runApiClient(args);
    default:
      return usage(args.command === undefined ? 'no command' : `unknown command ${args.command}`);
  }
}

// Run as a program (the image's launcher), not when imported by a test.
if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  main(process.argv.slice(2)).then((code) => process.exit(code), (err: unknown) => {
    log('fatal', { error: err instanceof Error ? err.message : String(err) });
    process.exit(1);
  });
}
