// A file out of an npm package tarball (a native CLI binary), fetched once with `npm pack`, checked
// against the registry integrity pinned by the caller, and cached under ~/.cache/sandboxfleet/cli.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { homedir, tmpdir } from 'node:os';
import { basename, join } from 'node:path';

export interface NpmPackedFile {
  /** `name@version` as `npm pack` takes it. */
  readonly spec: string;
  /** npm's dist.integrity of the tarball (`npm view <spec> dist.integrity`). */
  readonly integrity: string;
  /** Path of the file inside the tarball (`package/...`). */
  readonly member: string;
  /** Cache subdirectory name (versioned). */
  readonly cacheName: string;
}

export function npmPackedFile(f: NpmPackedFile, env: NodeJS.ProcessEnv = process.env): string {
  const dir = join(env.SANDBOXFLEET_CLI_CACHE ?? join(homedir(), '.cache', 'sandboxfleet', 'cli'), f.cacheName);
  const target = join(dir, basename(f.member));
  if (existsSync(target)) return target;
  const work = mkdtempSync(join(tmpdir(), 'sf-npm-pack-'));
  try {
    const name = execFileSync('npm', ['pack', f.spec, '--silent', '--pack-destination', work], { encoding: 'utf8' }).trim().split('\n').pop()!;
    const tgz = join(work, name);
    const got = `sha512-${createHash('sha512').update(readFileSync(tgz)).digest('base64')}`;
    if (got !== f.integrity) throw new Error(`${f.spec}: integrity ${got}, pinned ${f.integrity}`);
    execFileSync('tar', ['-xzf', tgz, '-C', work, f.member]);
    mkdirSync(dir, { recursive: true });
    renameSync(join(work, f.member), target);
    return target;
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}
