// `sandboxctl preflight` option parsing (R-P3): the gateway URL (http(s) only, no credentials,
// query or fragment, a path prefix kept), model ids, bounded integers, and the key redactor.
import { describe, expect, it } from 'vitest';
import { UsageError } from '../../../src/cli/connection.ts';
import { boundedInt, isLoopback, messagesUrl, parseGateway, parseModel, redactor } from '../../../src/cli/preflight.ts';

describe('preflight options', () => {
  it('gateway URL → the messages endpoint, with or without a path prefix and trailing slashes', () => {
    expect(messagesUrl(parseGateway('http://127.0.0.1:8080'))).toBe('http://127.0.0.1:8080/v1/messages');
    expect(messagesUrl(parseGateway('http://127.0.0.1:8080/'))).toBe('http://127.0.0.1:8080/v1/messages');
    expect(messagesUrl(parseGateway('https://gw.example/anthropic//'))).toBe('https://gw.example/anthropic/v1/messages');
  });

  it('refuses other schemes, credentials, queries and fragments without repeating the URL', () => {
    for (const bad of ['ftp://gw', 'gw.example', 'file:///etc/passwd', 'https://u:s3cretpw@gw', 'https://gw/?key=s3cretpw', 'https://gw/#s3cretpw']) {
      expect(() => parseGateway(bad), bad).toThrow(UsageError);
      try {
        parseGateway(bad);
      } catch (err) {
        expect((err as Error).message).not.toContain('s3cretpw');
      }
    }
  });

  it('loopback hosts', () => {
    expect(isLoopback(new URL('http://127.0.0.1:1'))).toBe(true);
    expect(isLoopback(new URL('http://[::1]:1'))).toBe(true);
    expect(isLoopback(new URL('http://localhost'))).toBe(true);
    expect(isLoopback(new URL('http://gateway.svc:8080'))).toBe(false);
  });

  it('model ids and bounded integers', () => {
    expect(parseModel('anthropic/claude-sonnet-4-5@20250929')).toBe('anthropic/claude-sonnet-4-5@20250929');
    for (const bad of ['', 'a b', '-x', 'x'.repeat(201)]) expect(() => parseModel(bad)).toThrow(UsageError);
    expect(boundedInt('3', '--repetitions', 1, 10)).toBe(3);
    for (const bad of ['0', '11', '-1', '2.5', 'abc', '']) expect(() => boundedInt(bad, '--repetitions', 1, 10)).toThrow(/from 1 to 10/);
  });

  it('redacts every occurrence of the key', () => {
    const r = redactor('sk-abcdef123');
    expect(r('x sk-abcdef123 y sk-abcdef123')).toBe('x <redacted> y <redacted>');
    expect(redactor('')('unchanged')).toBe('unchanged');
    // A text cut through the key: its prefix at the end, its suffix at the start.
    expect(r('echo sk-abcdef1')).toBe('echo <redacted>');
    expect(r('bcdef123 rest')).toBe('<redacted> rest');
    expect(r('sk-abcd')).toBe('sk-abcd'); // shorter than 8: nothing to hide
  });
});
