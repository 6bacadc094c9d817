// `sandboxctl nats-permissions HOST` (offline): prints exactly core's hostPermissions for the host,
// as a nats-server user entry, as `nsc` flags that survive a shell, or as JSON; bad input exits 2.
import { describe, expect, it } from 'vitest';
import { hostPermissions } from '../../../src/core/agent-subjects.ts';
import { runCli } from '../../../src/cli/commands.ts';

async function run(...argv: string[]): Promise<{ code: number; out: string; err: string }> {
  let out = '';
  let err = '';
  const code = await runCli(argv, { out: (t) => (out += `${t}\n`), err: (t) => (err += `${t}\n`) }, {});
  return { code, out, err };
}

describe('sandboxctl nats-permissions', () => {
  it('prints the host permissions as JSON, without any server', async () => {
    const r = await run('-o', 'json', 'nats-permissions', 'node-1.example.com');
    expect(r.code).toBe(0);
    expect(JSON.parse(r.out)).toEqual({ host: 'node-1.example.com', ...hostPermissions('node-1.example.com') });
  });

  it('prints a nats-server user entry and shell-safe nsc flags', async () => {
    const key = `U${'A'.repeat(55)}`;
    const conf = await run('nats-permissions', 'host-a', '--nkey', key);
    expect(conf.code).toBe(0);
    expect(conf.out).toContain(`nkey: "${key}"`);
    for (const s of hostPermissions('host-a').publish) expect(conf.out).toContain(JSON.stringify(s));
    const nsc = await run('nats-permissions', 'host-a', '--nsc');
    expect(nsc.out).toContain("--allow-pub '$JS.API.INFO'");
    expect(nsc.out).toContain("--allow-sub 'sf.host.host-a.cmd'");
    expect(nsc.out).not.toMatch(/"\$/);
  });

  it('prints the chart user entry as JSON (nats.server.authorization.users), and needs --nkey for it', async () => {
    const key = `U${'A'.repeat(55)}`;
    const r = await run('nats-permissions', 'host-a', '--nkey', key, '--chart-user');
    expect(r.code).toBe(0);
    const p = hostPermissions('host-a');
    expect(JSON.parse(r.out)).toEqual({ nkey: key, permissions: { publish: { allow: p.publish }, subscribe: { allow: p.subscribe }, allow_responses: true } });
    expect((await run('nats-permissions', 'host-a', '--chart-user')).code).toBe(2);
  });

  it('refuses a bad host id or nkey with a usage error', async () => {
    expect((await run('nats-permissions', 'bad host')).code).toBe(2);
    expect((await run('nats-permissions', 'host-a', '--nkey', 'SUAAAA')).code).toBe(2);
  });
});
