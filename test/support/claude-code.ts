// The pinned Claude Code CLI (R-S6: 2.1.220) for the request-history regression tests (SPEC §7.1),
// and a loopback fake of the Anthropic Messages API it talks to (no credentials, no cost).
// The CLI is the real linux-x64 binary from the npm registry, checked against its pinned integrity
// and cached; it is put into a sandbox image with the glibc libraries it links, taken from this
// machine (FACTS.md: librt, libc, libpthread, libdl, libm, ld-linux-x86-64).
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, renameSync, rmSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { homedir, tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ExtraFile } from './sandbox-image.ts';

export const CLAUDE_CODE_VERSION = '2.1.220';
const PACKAGE = `@anthropic-ai/claude-code-linux-x64@${CLAUDE_CODE_VERSION}`;
/** npm's dist.integrity of the package tarball (`npm view <package> dist.integrity`). */
const INTEGRITY = 'sha512-3CGFCnI0gpgsqNeJruFALBDGJaKXOuok3alQEg56ty2yOPpIrOx/r2Y0+T4uhJl7kP5Hzw4IFkxo4DZKWvzQ7Q==';
export const CLAUDE_PATH = '/usr/local/bin/claude';

/** The CLI binary on this machine: fetched once with `npm pack`, verified, unpacked into the cache. */
export function claudeCodeBinary(env: NodeJS.ProcessEnv = process.env): string {
  const dir = join(env.SANDBOXFLEET_CLI_CACHE ?? join(homedir(), '.cache', 'sandboxfleet', 'cli'), `claude-code-linux-x64-${CLAUDE_CODE_VERSION}`);
  const binary = join(dir, 'claude');
  if (existsSync(binary)) return binary;
  const work = mkdtempSync(join(tmpdir(), 'sf-claude-'));
  try {
    const name = execFileSync('npm', ['pack', PACKAGE, '--silent', '--pack-destination', work], { encoding: 'utf8' }).trim().split('\n').pop()!;
    const tgz = join(work, name);
    const got = `sha512-${createHash('sha512').update(readFileSync(tgz)).digest('base64')}`;
    if (got !== INTEGRITY) throw new Error(`${PACKAGE}: integrity ${got}, pinned ${INTEGRITY}`);
    execFileSync('tar', ['-xzf', tgz, '-C', work, 'package/claude']);
    mkdirSync(dir, { recursive: true });
    renameSync(join(work, 'package', 'claude'), binary);
    return binary;
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

/** The binary and the libraries it links, as sandbox image files. */
export function claudeCodeImageFiles(): ExtraFile[] {
  const libs = ['librt.so.1', 'libc.so.6', 'libpthread.so.0', 'libdl.so.2', 'libm.so.6'];
  return [
    { path: CLAUDE_PATH, source: claudeCodeBinary(), mode: 0o755 },
    { path: '/lib64/ld-linux-x86-64.so.2', source: realpathSync('/lib64/ld-linux-x86-64.so.2'), mode: 0o755 },
    ...libs.map((l) => ({ path: `/lib/x86_64-linux-gnu/${l}`, source: realpathSync(`/lib/x86_64-linux-gnu/${l}`), mode: 0o755 })),
  ];
}

/** What the CLI needs to talk to the fake only, and nothing else (FACTS.md). */
export function claudeCodeEnv(apiUrl: string): Record<string, string> {
  return {
    ANTHROPIC_BASE_URL: apiUrl,
    ANTHROPIC_API_KEY: 'sk-ant-test-not-a-key',
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
    DISABLE_TELEMETRY: '1',
    DISABLE_AUTOUPDATER: '1',
    DISABLE_ERROR_REPORTING: '1',
    HOME: '/root',
  };
}

export interface RecordedRequest {
  readonly path: string;
  readonly body: { model?: string; stream?: boolean; messages?: Array<{ role: string; content: unknown }> };
}

/** Plain text of a Messages API message content (string, or text blocks). */
export function textOf(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content.map((b: { type?: string; text?: string }) => (b?.type === 'text' && typeof b.text === 'string' ? b.text : '')).join('');
}

export interface FakeModelApi {
  readonly url: string;
  readonly requests: RecordedRequest[];
  /** Answer the next `n` message requests with HTTP `status` (e.g. 529 overloaded) before answering normally. */
  failNext(n: number, status: number): void;
  close(): Promise<void>;
}

/**
 * A loopback fake of POST /v1/messages: streams (SSE) or returns one assistant text message whose
 * text is `reply(lastUserText)`. Every request body is recorded for the history assertions.
 */
export async function startFakeModelApi(reply: (lastUserText: string) => string): Promise<FakeModelApi> {
  const requests: RecordedRequest[] = [];
  let failures: { n: number; status: number } = { n: 0, status: 500 };
  let seq = 0;
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const path = (req.url ?? '').split('?')[0] ?? '';
      let body: RecordedRequest['body'] = {};
      try {
        body = chunks.length > 0 ? (JSON.parse(Buffer.concat(chunks).toString('utf8')) as RecordedRequest['body']) : {};
      } catch {
        body = {};
      }
      if (req.method !== 'POST' || path !== '/v1/messages') {
        res.writeHead(path.endsWith('/count_tokens') ? 200 : 404, { 'content-type': 'application/json' });
        res.end(path.endsWith('/count_tokens') ? '{"input_tokens":10}' : '{"type":"error","error":{"type":"not_found_error","message":"not here"}}');
        return;
      }
      requests.push({ path, body });
      if (failures.n > 0) {
        failures = { ...failures, n: failures.n - 1 };
        res.writeHead(failures.status, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ type: 'error', error: { type: failures.status === 529 ? 'overloaded_error' : 'api_error', message: 'fake failure' } }));
        return;
      }
      const lastUser = [...(body.messages ?? [])].reverse().find((m) => m.role === 'user');
      const text = reply(textOf(lastUser?.content));
      const id = `msg_fake_${++seq}`;
      const message = { id, type: 'message', role: 'assistant', model: body.model ?? 'claude-fake', content: [] as unknown[], stop_reason: null, stop_sequence: null, usage: { input_tokens: 10, output_tokens: 0 } };
      if (body.stream !== true) {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ ...message, content: [{ type: 'text', text }], stop_reason: 'end_turn', usage: { input_tokens: 10, output_tokens: 5 } }));
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      const send = (event: string, data: unknown): void => void res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
      send('message_start', { type: 'message_start', message });
      send('content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } });
      send('content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text } });
      send('content_block_stop', { type: 'content_block_stop', index: 0 });
      send('message_delta', { type: 'message_delta', delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 5 } });
      send('message_stop', { type: 'message_stop' });
      res.end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  const port = typeof address === 'object' && address !== null ? address.port : 0;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    failNext(n, status) {
      failures = { n, status };
    },
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
