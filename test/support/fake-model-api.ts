// A loopback fake of the Anthropic Messages API (and of the OpenAI Responses API, for Codex) for
// the pinned-CLI request-history tests (R-P1): no credentials, no cost, and every request body recorded so a test can compare what the
// model API RECEIVED turn after turn (user and assistant text, roles, order, duplicates).
// `sandboxctl preflight` (R-P3) scripts it from the whole message list and makes it misbehave:
// a thinking block, a stream cut before message_stop, an SSE error event, a malformed event, an
// HTTP error status (see ScriptedReply).
import { createServer, type IncomingHttpHeaders, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { expect } from 'vitest';

export interface RecordedRequest {
  readonly path: string;
  readonly body: { model?: string; stream?: boolean; max_tokens?: number; messages?: Array<{ role: string; content: unknown }> };
  /** The request's headers (Node lower-cases the names). */
  readonly headers?: IncomingHttpHeaders;
  /** The body exactly as received (parsed JSON): what the full-text history checker reads (history-checker.ts). */
  readonly raw?: unknown;
  /** Which API the request went to. */
  readonly api?: 'messages' | 'responses';
  /** The `request-id` header the fake answered with (what a gateway's request id is to preflight). */
  readonly requestId?: string;
}

/** A message of the request, as the reply script sees it: role and plain text. */
export interface FakeMessage {
  readonly role: string;
  readonly text: string;
}

/**
 * What a scripted reply can do besides answering `text` (Messages API; the Responses API path uses
 * `text` only). With `status` (≠ 200) the answer is that status and `body`, no stream.
 */
export interface ScriptedReply {
  readonly text?: string;
  /** A thinking block (thinking_delta + signature_delta) before the text. */
  readonly thinking?: string;
  readonly status?: number;
  /** Body of a `status` answer (default: an API error JSON). */
  readonly body?: string;
  /** An SSE `error` event after the text started, then the stream ends. */
  readonly errorEvent?: { readonly type: string; readonly message: string };
  /** End the stream after the text, before message_delta and message_stop. */
  readonly truncate?: boolean;
  /** The message_delta stop_reason (default end_turn). */
  readonly stopReason?: string;
  /** Send an event whose data is not JSON in the middle of the stream. */
  readonly malformed?: boolean;
  /** A tool call after the text (Messages API, streamed): stop_reason `tool_use`. */
  readonly toolUse?: { readonly id: string; readonly name: string; readonly input: Record<string, unknown> };
}

/** The script: the last user text (what every CLI-history test needs) and the whole message list. */
export type ReplyScript = (lastUserText: string, messages: readonly FakeMessage[]) => string | ScriptedReply;

const scripted = (r: string | ScriptedReply): ScriptedReply => (typeof r === 'string' ? { text: r } : r);
const plainMessages = (messages: RecordedRequest['body']['messages']): FakeMessage[] => (messages ?? []).map((m) => ({ role: m.role, text: textOf(m.content) }));

/** Plain text of a Messages API message content (string, or text blocks). */
export function textOf(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content.map((b: { type?: string; text?: string }) => (b?.type === 'text' && typeof b.text === 'string' ? b.text : '')).join('');
}

interface ResponsesBody {
  model?: string;
  stream?: boolean;
  input?: Array<{ type?: string; role?: string; content?: string | Array<{ type?: string; text?: string }> }>;
}

export interface FakeModelApi {
  readonly url: string;
  readonly requests: RecordedRequest[];
  /** Requests to anything but POST …/v1/messages (answered 404, or a token count). */
  readonly unexpected: string[];
  /** Answer the next `n` message requests with HTTP `status` (e.g. 529 overloaded) before answering normally. */
  failNext(n: number, status: number): void;
  /**
   * Hold the answer to every Messages request whose last user text contains `marker` until the
   * returned release is called (a turn that is still running, for "follow-up while running").
   */
  holdRequestsWith(marker: string): () => void;
  close(): Promise<void>;
}

/**
 * A loopback fake of POST /v1/messages: streams (SSE) or returns one assistant text message whose
 * text is `reply(lastUserText, messages)` (or what its ScriptedReply says). Every request body and
 * its headers are recorded for the history assertions.
 */
export async function startFakeModelApi(reply: ReplyScript): Promise<FakeModelApi> {
  const requests: RecordedRequest[] = [];
  const unexpected: string[] = [];
  let failures: { n: number; status: number } = { n: 0, status: 500 };
  const holds = new Map<string, Promise<void>>();
  let seq = 0;
  // The OpenAI Responses API (Codex): the request's input messages are recorded in the Messages
  // shape (role + text blocks), so the same history helpers read both.
  const messagesOfResponses = (body: ResponsesBody): Array<{ role: string; content: unknown }> => (body.input ?? []).filter((i) => i.type === 'message' || i.role !== undefined).map((i) => ({
    role: i.role ?? '',
    content: (Array.isArray(i.content) ? i.content : [{ text: String(i.content ?? '') }]).map((c) => ({ type: 'text', text: typeof c.text === 'string' ? c.text : '' })),
  }));
  const answerResponses = (res: ServerResponse, body: ResponsesBody, requestId: string): void => {
    const messages = messagesOfResponses(body);
    res.setHeader('x-request-id', requestId);
    if (failures.n > 0) {
      failures = { ...failures, n: failures.n - 1 };
      res.writeHead(failures.status, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { type: 'server_error', message: 'fake failure' } }));
      return;
    }
    const text = scripted(reply(textOf([...messages].reverse().find((m) => m.role === 'user')?.content), plainMessages(messages))).text ?? '';
    const id = `resp_fake_${++seq}`;
    const item = { type: 'message', role: 'assistant', id: `msg_fake_${seq}`, status: 'completed', content: [{ type: 'output_text', text, annotations: [] }] };
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    const send = (type: string, data: Record<string, unknown>): void => void res.write(`event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`);
    send('response.created', { response: { id, status: 'in_progress' } });
    send('response.output_item.added', { output_index: 0, item: { ...item, status: 'in_progress', content: [] } });
    send('response.output_text.delta', { output_index: 0, content_index: 0, item_id: item.id, delta: text });
    send('response.output_item.done', { output_index: 0, item });
    send('response.completed', { response: { id, status: 'completed', usage: { input_tokens: 10, output_tokens: 5, total_tokens: 15, input_tokens_details: { cached_tokens: 0 }, output_tokens_details: { reasoning_tokens: 0 } } } });
    res.end();
  };
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
      const raw: unknown = structuredClone(body);
      if (req.method === 'POST' && path.endsWith('/v1/responses')) {
        const rb = body as ResponsesBody;
        const requestId = `req_fake_${++seq}`;
        // Recorded as it arrives (a held request is in `requests` while it waits).
        requests.push({ path, body: { model: rb.model, stream: rb.stream, messages: messagesOfResponses(rb) }, headers: req.headers, raw, api: 'responses', requestId });
        const input = rb.input ?? [];
        const lastUser = [...input].reverse().find((i) => i.role === 'user');
        const lastUserText = typeof lastUser?.content === 'string' ? lastUser.content : (lastUser?.content ?? []).map((c) => c.text ?? '').join('');
        const held = [...holds].find(([marker]) => lastUserText.includes(marker))?.[1];
        if (held !== undefined) void held.then(() => answerResponses(res, rb, requestId));
        else answerResponses(res, rb, requestId);
        return;
      }
      if (req.method !== 'POST' || !path.endsWith('/v1/messages')) {
        unexpected.push(`${req.method ?? '?'} ${path}`);
        res.writeHead(path.endsWith('/count_tokens') ? 200 : 404, { 'content-type': 'application/json' });
        res.end(path.endsWith('/count_tokens') ? '{"input_tokens":10}' : '{"type":"error","error":{"type":"not_found_error","message":"not here"}}');
        return;
      }
      const requestId = `req_fake_${++seq}`;
      requests.push({ path, body, headers: req.headers, raw, api: 'messages', requestId });
      res.setHeader('request-id', requestId);
      const lastUserText = textOf([...(body.messages ?? [])].reverse().find((m) => m.role === 'user')?.content);
      const held = [...holds].find(([marker]) => lastUserText.includes(marker))?.[1];
      if (held !== undefined) {
        void held.then(() => answerMessages(res, body));
        return;
      }
      answerMessages(res, body);
    });
  });
  const answerMessages = (res: ServerResponse, body: RecordedRequest['body']): void => {
    if (failures.n > 0) {
      failures = { ...failures, n: failures.n - 1 };
      res.writeHead(failures.status, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ type: 'error', error: { type: failures.status === 529 ? 'overloaded_error' : 'api_error', message: 'fake failure' } }));
      return;
    }
    const lastUser = [...(body.messages ?? [])].reverse().find((m) => m.role === 'user');
    const script = scripted(reply(textOf(lastUser?.content), plainMessages(body.messages)));
    const text = script.text ?? '';
    if (script.status !== undefined && script.status !== 200) {
      res.writeHead(script.status, { 'content-type': 'application/json' });
      res.end(script.body ?? JSON.stringify({ type: 'error', error: { type: 'api_error', message: 'scripted failure' } }));
      return;
    }
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
    let index = 0;
    if (script.thinking !== undefined) {
      send('content_block_start', { type: 'content_block_start', index, content_block: { type: 'thinking', thinking: '', signature: '' } });
      send('content_block_delta', { type: 'content_block_delta', index, delta: { type: 'thinking_delta', thinking: script.thinking } });
      send('content_block_delta', { type: 'content_block_delta', index, delta: { type: 'signature_delta', signature: 'ZmFrZS1zaWduYXR1cmU=' } });
      send('content_block_stop', { type: 'content_block_stop', index });
      index++;
    }
    send('content_block_start', { type: 'content_block_start', index, content_block: { type: 'text', text: '' } });
    send('ping', { type: 'ping' });
    // The text in two deltas, so a reader must concatenate them.
    const half = Math.ceil(text.length / 2);
    send('content_block_delta', { type: 'content_block_delta', index, delta: { type: 'text_delta', text: text.slice(0, half) } });
    if (script.malformed === true) res.write('event: content_block_delta\ndata: {"type":"content_block_delta", not json\n\n');
    if (script.errorEvent !== undefined) {
      send('error', { type: 'error', error: script.errorEvent });
      res.end();
      return;
    }
    send('content_block_delta', { type: 'content_block_delta', index, delta: { type: 'text_delta', text: text.slice(half) } });
    send('content_block_stop', { type: 'content_block_stop', index });
    if (script.truncate === true) {
      res.end();
      return;
    }
    if (script.toolUse !== undefined) {
      index++;
      const { id: toolId, name, input } = script.toolUse;
      send('content_block_start', { type: 'content_block_start', index, content_block: { type: 'tool_use', id: toolId, name, input: {} } });
      send('content_block_delta', { type: 'content_block_delta', index, delta: { type: 'input_json_delta', partial_json: JSON.stringify(input) } });
      send('content_block_stop', { type: 'content_block_stop', index });
    }
    send('message_delta', { type: 'message_delta', delta: { stop_reason: script.stopReason ?? (script.toolUse !== undefined ? 'tool_use' : 'end_turn'), stop_sequence: null }, usage: { output_tokens: 5 } });
    send('message_stop', { type: 'message_stop' });
    res.end();
  };
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  const port = typeof address === 'object' && address !== null ? address.port : 0;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    unexpected,
    failNext(n, status) {
      failures = { n, status };
    },
    holdRequestsWith(marker) {
      let release!: () => void;
      holds.set(marker, new Promise<void>((resolve) => (release = resolve)));
      return () => {
        holds.delete(marker);
        release();
      };
    },
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

/**
 * The conversation a request carries: each user and assistant message as role + the marker words
 * (MARK-…) of its text. CLIs also send messages of their own (a `system` role entry, system
 * reminders inside user text); those are not conversation history and are left out.
 */
export function history(request: RecordedRequest): string[] {
  return (request.body.messages ?? [])
    .filter((m) => m.role === 'user' || m.role === 'assistant')
    .map((m) => `${m.role}:${(textOf(m.content).match(/MARK-[A-Z0-9]+/g) ?? []).join(',')}`);
}

/** The last request of a turn that carried its prompt (the CLI may make others, e.g. a retry). */
export function promptRequest(requests: readonly RecordedRequest[], marker: string): RecordedRequest {
  const r = requests.filter((q) => (q.body.messages ?? []).some((m) => m.role === 'user' && textOf(m.content).includes(marker))).at(-1);
  expect(r, `a request carrying ${marker}`).toBeDefined();
  return r!;
}

/**
 * The fake's reply: an acknowledgement of the prompt's marker word — the LAST one in the last user
 * message (after a failed turn, OpenCode and Kilo send the failed prompt and the new one as one
 * message).
 */
export const ackMarker = (last: string): string => `ack ${last.match(/MARK-[A-Z0-9]+/g)?.at(-1) ?? 'none'}`;
