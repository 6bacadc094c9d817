// A real nats-server whose static authorization admits only nkey users: the control plane (every
// subject) and two hosts, host-a and host-b, each limited to core/agent-subjects.ts
// hostPermissions(host) and its own inbox prefix (R-I2, R-R5). Seeds are written to files the way a
// deployment mounts them. Shared by the security tests.
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { hostInboxPrefix, hostPermissions } from '../../src/core/agent-subjects.ts';
import { newNkeyUser, type NatsAuthOptions } from '../../src/store/nats-auth.ts';
import { startTestNats, type TestNats } from './nats.ts';

export interface NkeyNats {
  readonly nats: TestNats;
  /** The directory holding the seed files (removed by cleanup). */
  readonly dir: string;
  readonly auth: Readonly<Record<'cp' | 'a' | 'b', NatsAuthOptions>>;
  /** Writes a seed (or anything) to `<dir>/<name>.nk`, mode 0600, and returns its path. */
  seedFile(name: string, seed: string): Promise<string>;
  cleanup(): Promise<void>;
}

export async function startNkeyNats(dirPrefix: string): Promise<NkeyNats> {
  const dir = await mkdtemp(join(tmpdir(), dirPrefix));
  const seedFile = async (name: string, seed: string): Promise<string> => {
    const file = join(dir, `${name}.nk`);
    await writeFile(file, `${seed}\n`, { mode: 0o600 });
    return file;
  };
  try {
    const [cp, a, b] = [newNkeyUser(), newNkeyUser(), newNkeyUser()];
    const auth = {
      cp: { credsFile: await seedFile('cp', cp.seed) },
      a: { credsFile: await seedFile('host-a', a.seed), inboxPrefix: hostInboxPrefix('host-a') },
      b: { credsFile: await seedFile('host-b', b.seed), inboxPrefix: hostInboxPrefix('host-b') },
    };
    const nats = await startTestNats({
      users: [
        { nkey: cp.publicKey },
        { nkey: a.publicKey, permissions: hostPermissions('host-a') },
        { nkey: b.publicKey, permissions: hostPermissions('host-b') },
      ],
    });
    return {
      nats,
      dir,
      auth,
      seedFile,
      cleanup: async () => {
        await nats.cleanup();
        await rm(dir, { recursive: true, force: true });
      },
    };
  } catch (e) {
    await rm(dir, { recursive: true, force: true });
    throw e;
  }
}
