// `sandboxctl preflight` (R-P3, issue 16 item 6): what it asks the gateway for, what it prints, and
// how it reaches a gateway through an HTTP proxy — the real binary (child process through the
// launcher) against the loopback fake Messages API, over real sockets:
//   - by default every call asks for the pinned Claude Code's own thinking setting (thinking
//     adaptive, output_config effort high, with its beta header); `--thinking off` sends none;
//   - every call's answer and the gateway's request id are printed (table and JSON), never the key
//     nor a request header;
//   - `--proxy http://user:pass@…` reaches an https gateway through a CONNECT tunnel (TLS end to end:
//     the proxy sees no key) and an http one in absolute form, with Proxy-Authorization; the printed
//     proxy has no credentials; HTTP_PROXY from the environment is used for a non-loopback gateway
//     unless NO_PROXY names it, and never for a loopback one.
// The proxy and the TLS front are small real servers of this test (Node's http/tls), not mocks of
// the code under test.
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createServer, request, type Server } from 'node:http';
import { connect as netConnect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve as resolvePath } from 'node:path';
import { createServer as createTlsServer, type Server as TlsServer } from 'node:tls';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createTestPki, type TestPki } from '../../support/certs.ts';
import { startFakeModelApi, type FakeModelApi } from '../../support/fake-model-api.ts';

const LAUNCHER = resolvePath('cmd/sandboxctl/sandboxctl.mjs');
const KEY = `sk-test-${randomBytes(24).toString('hex')}`;
const MODEL = 'claude-fake-preflight';

let api: FakeModelApi;
let dir = '';
let keyFile = '';
let caFile = '';
let pki: TestPki;
let proxy: Server;
let proxyPort = 0;
let tlsFront: TlsServer;
let tlsPort = 0;
/** What the proxy saw: each request's method and target, and its Proxy-Authorization. */
let proxied: Array<{ method: string; target: string; auth: string | undefined; sawKey: boolean }> = [];

/** A model that reads its history (what every preflight case needs to pass). */
function answer(last: string, messages: ReadonlyArray<{ role: string; text: string }>): string {
  const mark = /[A-Z]{4}-\d{4}/;
  if (last.includes('Reply with exactly this token')) return mark.exec(last)![0];
  if (last.includes('Which code word did I pick')) return `You picked ${mark.exec(messages[0]!.text)![0]}.`;
  if (last.includes('current locker code')) return /It is now ([A-Z]{4}-\d{4})/.exec(messages.find((m) => m.role === 'user' && m.text.includes('It is now'))!.text)![1]!;
  if (last.includes('tell you earlier')) return "You haven't told me anything earlier in this conversation.";
  return 'Hello! Nice to meet you.';
}

function sandboxctl(args: string[], env: NodeJS.ProcessEnv): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [LAUNCHER, 'preflight', '--model', MODEL, '--key-file', keyFile, ...args], { cwd: tmpdir(), env, timeout: 120_000, maxBuffer: 16 * 1024 * 1024 }, (error, stdout, stderr) => {
      const code = error === null ? 0 : typeof (error as { code?: unknown }).code === 'number' ? (error as { code: number }).code : -1;
      resolve({ code, stdout, stderr });
    });
  });
}

/** The environment without any proxy settings of this machine. */
function cleanEnv(extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  const env = { ...process.env };
  for (const k of ['HTTP_PROXY', 'http_proxy', 'HTTPS_PROXY', 'https_proxy', 'NO_PROXY', 'no_proxy', 'ALL_PROXY', 'all_proxy']) delete env[k];
  return { ...env, ...extra };
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'sf-preflight-native-'));
  keyFile = join(dir, 'gateway.key');
  await writeFile(keyFile, `${KEY}\n`, { mode: 0o600 });
  await chmod(keyFile, 0o600);
  api = await startFakeModelApi(answer);
  pki = await createTestPki();
  caFile = join(dir, 'ca.pem');
  await writeFile(caFile, pki.ca);
  const fake = new URL(api.url);
  // A TLS front for the fake: an https gateway at 127.0.0.1 (the test server certificate's name).
  tlsFront = createTlsServer({ cert: pki.server.cert, key: pki.server.key }, (clear) => {
    const upstream = netConnect(Number(fake.port), '127.0.0.1');
    clear.pipe(upstream).pipe(clear);
    upstream.on('error', () => clear.destroy());
    clear.on('error', () => upstream.destroy());
  });
  await new Promise<void>((r) => tlsFront.listen(0, '127.0.0.1', r));
  tlsPort = (tlsFront.address() as { port: number }).port;
  // A forwarding proxy: absolute-form requests to any host go to the fake; CONNECT tunnels to the TLS front.
  proxy = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      proxied.push({ method: req.method ?? '', target: req.url ?? '', auth: req.headers['proxy-authorization'], sawKey: JSON.stringify(req.headers).includes(KEY) });
      const target = new URL(req.url ?? '/');
      const headers = { ...req.headers };
      delete headers['proxy-authorization'];
      const up = request({ host: '127.0.0.1', port: Number(fake.port), method: req.method, path: target.pathname, headers }, (ur) => {
        res.writeHead(ur.statusCode ?? 502, ur.headers);
        ur.pipe(res);
      });
      up.on('error', () => res.destroy());
      up.end(Buffer.concat(chunks));
    });
  });
  proxy.on('connect', (req, socket: Socket, head: Buffer) => {
    proxied.push({ method: 'CONNECT', target: req.url ?? '', auth: req.headers['proxy-authorization'], sawKey: JSON.stringify(req.headers).includes(KEY) });
    const up = netConnect(tlsPort, '127.0.0.1', () => {
      socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      if (head.length > 0) up.write(head);
      // The proxy only relays bytes: the key travels inside TLS it cannot read.
      socket.on('data', (d: Buffer) => {
        if (d.includes(Buffer.from(KEY))) proxied.push({ method: 'LEAK', target: '', auth: undefined, sawKey: true });
      });
      socket.pipe(up).pipe(socket);
    });
    up.on('error', () => socket.destroy());
  });
  await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', r));
  proxyPort = (proxy.address() as { port: number }).port;
}, 60_000);

afterAll(async () => {
  await api?.close();
  proxy?.close();
  tlsFront?.close();
  await pki?.cleanup();
  if (dir !== '') await rm(dir, { recursive: true, force: true });
});

beforeEach(() => {
  api.requests.length = 0;
  proxied = [];
});

describe('sandboxctl preflight asks for the native thinking setting and shows each answer with its request id', () => {
  it('by default every call asks for adaptive thinking at high effort, as the pinned Claude Code does', async () => {
    const run = await sandboxctl(['--gateway', api.url, '--repetitions', '1'], cleanEnv());
    expect(run.code, run.stderr).toBe(0);
    expect(api.requests).toHaveLength(5);
    for (const r of api.requests) {
      expect(r.raw).toMatchObject({ model: MODEL, stream: true, thinking: { type: 'adaptive' }, output_config: { effort: 'high' } });
      expect(r.headers?.['anthropic-beta']).toBe('effort-2025-11-24');
    }
    expect(run.stdout).toMatch(/^thinking: adaptive \(effort high\) asked$/m);
  });

  it('--thinking off asks for none', async () => {
    const run = await sandboxctl(['--gateway', api.url, '--repetitions', '1', '--thinking', 'off'], cleanEnv());
    expect(run.code, run.stderr).toBe(0);
    for (const r of api.requests) {
      expect(r.raw).not.toHaveProperty('thinking');
      expect(r.raw).not.toHaveProperty('output_config');
      expect(r.headers?.['anthropic-beta']).toBeUndefined();
    }
    expect((await sandboxctl(['--gateway', api.url, '--thinking', 'max'], cleanEnv())).code).toBe(2);
  });

  it('prints every answer and the gateway\'s request id for it, in the table and in JSON, never the key or a header', async () => {
    const table = await sandboxctl(['--gateway', api.url, '--repetitions', '1'], cleanEnv());
    expect(table.code).toBe(0);
    const ids = api.requests.map((r) => r.requestId!);
    expect(ids).toHaveLength(5);
    for (const id of ids) expect(table.stdout).toContain(id);
    expect(table.stdout).toMatch(/^answers:$/m);
    expect(table.stdout).toMatch(new RegExp(`^  greeting#1 \\[${ids[0]}\\]: "Hello! Nice to meet you\\."$`, 'm'));
    for (const out of [table.stdout, table.stderr]) {
      expect(out).not.toContain(KEY);
      expect(out).not.toMatch(/x-api-key|anthropic-version|authorization/i);
    }
    api.requests.length = 0;
    const json = await sandboxctl(['--gateway', api.url, '--repetitions', '1', '-o', 'json'], cleanEnv());
    const report = JSON.parse(json.stdout) as { thinking: string; proxy: string | null; calls: Array<{ request_id: string; reply_excerpt: string }> };
    expect(report.calls.map((c) => c.request_id)).toEqual(api.requests.map((r) => r.requestId));
    expect(report.calls.every((c) => c.reply_excerpt !== '')).toBe(true);
    expect(report).toMatchObject({ thinking: 'adaptive (effort high)', proxy: null });
    expect(json.stdout).not.toContain(KEY);
  });
});

describe('sandboxctl preflight through an HTTP proxy', () => {
  it('--proxy with credentials: an https gateway through a CONNECT tunnel, the key never seen by the proxy, the credentials never printed', async () => {
    const run = await sandboxctl(['--gateway', `https://127.0.0.1:${tlsPort}`, '--repetitions', '1', '--proxy', `http://fleet:s3cret@127.0.0.1:${proxyPort}`], cleanEnv({ NODE_EXTRA_CA_CERTS: caFile }));
    expect(run.code, `${run.stdout}\n${run.stderr}`).toBe(0);
    expect(api.requests).toHaveLength(5);
    expect(proxied.map((p) => [p.method, p.target])).toEqual(Array.from({ length: 5 }, () => ['CONNECT', `127.0.0.1:${tlsPort}`]));
    expect(proxied.every((p) => p.auth === `Basic ${Buffer.from('fleet:s3cret').toString('base64')}` && !p.sawKey)).toBe(true);
    expect(run.stdout).toMatch(new RegExp(`^proxy: +http://127\\.0\\.0\\.1:${proxyPort}$`, 'm'));
    expect(`${run.stdout}${run.stderr}`).not.toContain('s3cret');
  });

  it('HTTP_PROXY from the environment: used for a gateway off loopback (absolute form), not when NO_PROXY names it, never for loopback', async () => {
    const fakePort = new URL(api.url).port;
    const viaEnv = await sandboxctl(['--gateway', `http://gateway.test:${fakePort}`, '--repetitions', '1', '--allow-plain-http'], cleanEnv({ HTTP_PROXY: `http://127.0.0.1:${proxyPort}` }));
    expect(viaEnv.code, `${viaEnv.stdout}\n${viaEnv.stderr}`).toBe(0);
    expect(proxied.map((p) => [p.method, p.target])).toEqual(Array.from({ length: 5 }, () => ['POST', `http://gateway.test:${fakePort}/v1/messages`]));
    proxied = [];
    // NO_PROXY names the gateway: no proxy, so the name does not resolve and every call fails as transport.
    const bypassed = await sandboxctl(['--gateway', `http://gateway.test:${fakePort}`, '--repetitions', '1', '--allow-plain-http', '-o', 'json'], cleanEnv({ HTTP_PROXY: `http://127.0.0.1:${proxyPort}`, NO_PROXY: 'example.com,.test' }));
    expect(bypassed.code).toBe(1);
    expect((JSON.parse(bypassed.stdout) as { calls: Array<{ reason: string }> }).calls.every((c) => c.reason === 'transport')).toBe(true);
    expect(proxied).toEqual([]);
    // A loopback gateway never goes through an environment proxy.
    const loopback = await sandboxctl(['--gateway', api.url, '--repetitions', '1'], cleanEnv({ HTTP_PROXY: `http://127.0.0.1:${proxyPort}` }));
    expect(loopback.code).toBe(0);
    expect(proxied).toEqual([]);
  });

  it('a proxy URL that is not plain http:// is refused before anything is sent', async () => {
    const run = await sandboxctl(['--gateway', api.url, '--proxy', 'socks5://127.0.0.1:1080'], cleanEnv());
    expect(run.code).toBe(2);
    expect(run.stderr).toContain('the proxy must be an http:// URL');
    expect(api.requests).toHaveLength(0);
  });
});
