// The sandbox base image for tests, built locally (no registry can be reached): a busybox-static
// rootfs with users root and agent (uid 1000), and the live-bridge helper whose `--version` and the
// image label `http-agent-live-bridge` are what host attestation checks (R-H1, R-H2).
// `docker import` stamps a creation time into the config, so each import has a new image id. To
// get the SAME image id on every host the image is imported once, `docker save`d to an archive,
// and that archive is `docker load`ed into each host. Archives are cached, keyed by their inputs.
import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream, existsSync, lstatSync, mkdirSync, readFileSync, readdirSync, readlinkSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type Docker from 'dockerode';
import tar from 'tar-stream';

export const BRIDGE_LABEL = 'http-agent-live-bridge';
export const HELPER_PATH = '/usr/local/bin/live-bridge';
const IMAGE_REPO = 'sandboxfleet/sandbox';
const BUSYBOX = '/bin/busybox';
/** Bump when the recipe below changes in a way the inputs do not capture. */
const RECIPE_VERSION = 1;

export interface SandboxImageSpec {
  /** Value of the `http-agent-live-bridge` label; null builds an image without the label. */
  readonly bridgeVersion: number | null;
  /** What the helper's `--version` prints; defaults to bridgeVersion; null builds an image without the helper. */
  readonly helperVersion?: number | null;
  /** Exact text the helper's `--version` prints instead of `<helperVersion>\n` (needs a tagSuffix). */
  readonly helperOutput?: string;
  /** More files from this machine, e.g. a native CLI and the libraries it links (content read at build). */
  readonly extraFiles?: readonly ExtraFile[];
  /** Whole directory trees from this machine (files, directories, symlinks as they are). */
  readonly extraTrees?: readonly ExtraTree[];
  /** Appended to the tag (`sandboxfleet/sandbox:bridge4-<suffix>`); required with extraFiles. */
  readonly tagSuffix?: string;
  /**
   * The real helper at HELPER_PATH instead of the stand-in script (e.g. the project's live bridge,
   * test/support/live-bridge-image.ts); its `--version` must print helperVersion. Needs a tagSuffix.
   */
  readonly helper?: ExtraFile;
}

export interface ExtraTree {
  /** Absolute directory path inside the image. */
  readonly path: string;
  /** Directory on this machine. */
  readonly source: string;
}

export interface ExtraFile {
  /** Absolute path inside the image. */
  readonly path: string;
  /** File on this machine to copy (symlinks resolved). */
  readonly source: string;
  readonly mode: number;
}

export interface SandboxImage {
  /** `docker save` archive; `loadImage` it into every host. */
  readonly archivePath: string;
  /** `sha256:<hex>` image id (config digest): identical on every host the archive is loaded into. */
  readonly imageId: string;
  /** The tag the archive carries, e.g. `sandboxfleet/sandbox:bridge4`. */
  readonly reference: string;
}

/** Where archives are cached across test runs; overridable for CI caches. */
export function imageCacheDir(env: NodeJS.ProcessEnv = process.env): string {
  return env.SANDBOXFLEET_IMAGE_CACHE ?? join(homedir(), '.cache', 'sandboxfleet', 'images');
}

function helperScript(version: number, output?: string): string {
  // printf with the text as a single-quoted argument: exactly these bytes, newlines included.
  const print = output === undefined ? `echo ${version}` : `printf '%s' '${output.replace(/'/g, `'\\''`)}'`;
  return [
    '#!/bin/sh',
    '# live-bridge: stand-in for the http-agent live-bridge helper of the sandbox image (R-H2).',
    'case "$1" in',
    `  --version) ${print} ;;`,
    '  *) echo "usage: live-bridge --version" >&2; exit 2 ;;',
    'esac',
    '',
  ].join('\n');
}

const PASSWD = 'root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/home/agent:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n';
const GROUP = 'root:x:0:\nagent:x:1000:\nnogroup:x:65534:\n';

/** Deterministic rootfs tarball (fixed mtimes, sorted entries) so the cache key is its digest. */
/** Every entry under `dir`, sorted, relative to it (directories before their contents). */
function walk(dir: string, rel = ''): Array<{ rel: string; kind: 'dir' | 'file' | 'symlink'; mode: number; target?: string }> {
  const out: Array<{ rel: string; kind: 'dir' | 'file' | 'symlink'; mode: number; target?: string }> = [];
  for (const name of readdirSync(join(dir, rel)).sort()) {
    const r = rel === '' ? name : `${rel}/${name}`;
    const st = lstatSync(join(dir, r));
    if (st.isSymbolicLink()) out.push({ rel: r, kind: 'symlink', mode: 0o777, target: readlinkSync(join(dir, r)) });
    else if (st.isDirectory()) out.push({ rel: r, kind: 'dir', mode: st.mode & 0o7777 }, ...walk(dir, r));
    else if (st.isFile()) out.push({ rel: r, kind: 'file', mode: st.mode & 0o7777 });
  }
  return out;
}

async function rootfsTar(helperVersion: number | null, extraFiles: readonly ExtraFile[] = [], extraTrees: readonly ExtraTree[] = [], helperOutput?: string, helper?: ExtraFile): Promise<Buffer> {
  const pack = tar.pack();
  const mtime = new Date(0);
  const dir = (name: string, mode = 0o755, uid = 0): void => {
    pack.entry({ name, type: 'directory', mode, uid, gid: uid, mtime });
  };
  const file = (name: string, content: Buffer | string, mode = 0o644): void => {
    pack.entry({ name, type: 'file', mode, uid: 0, gid: 0, mtime }, content);
  };
  for (const d of ['bin', 'sbin', 'usr', 'usr/bin', 'usr/sbin', 'usr/local', 'usr/local/bin', 'etc', 'dev', 'proc', 'sys', 'var', 'run', 'root', 'home']) {
    dir(d, d === 'root' ? 0o700 : 0o755);
  }
  dir('tmp', 0o1777);
  dir('var/tmp', 0o1777);
  dir('home/agent', 0o755, 1000);
  file('bin/busybox', readFileSync(BUSYBOX), 0o755);
  const applets = (await busyboxApplets()).filter((p) => p !== 'bin/busybox').sort();
  for (const path of applets) pack.entry({ name: path, type: 'symlink', linkname: '/bin/busybox', mode: 0o777, mtime });
  file('etc/passwd', PASSWD);
  file('etc/group', GROUP);
  if (helper !== undefined) file(HELPER_PATH.slice(1), readFileSync(helper.source), helper.mode);
  else if (helperVersion !== null) file(HELPER_PATH.slice(1), helperScript(helperVersion, helperOutput), 0o755);
  const made = new Set<string>();
  for (const f of [...extraFiles].sort((a, b) => a.path.localeCompare(b.path))) {
    const parts = f.path.slice(1).split('/');
    for (let i = 1; i < parts.length; i++) {
      const d = parts.slice(0, i).join('/');
      if (!made.has(d) && !['bin', 'sbin', 'usr', 'usr/bin', 'usr/sbin', 'usr/local', 'usr/local/bin', 'etc', 'var', 'run', 'root', 'home'].includes(d)) dir(d);
      made.add(d);
    }
    file(f.path.slice(1), readFileSync(f.source), f.mode);
  }
  for (const t of extraTrees) {
    const base = t.path.slice(1);
    const parts = base.split('/');
    for (let i = 1; i <= parts.length; i++) {
      const d = parts.slice(0, i).join('/');
      if (!made.has(d) && !['bin', 'sbin', 'usr', 'usr/bin', 'usr/sbin', 'usr/local', 'usr/local/bin', 'etc', 'var', 'run', 'root', 'home'].includes(d)) dir(d);
      made.add(d);
    }
    for (const e of walk(t.source)) {
      const name = `${base}/${e.rel}`;
      if (e.kind === 'dir') dir(name, e.mode);
      else if (e.kind === 'symlink') pack.entry({ name, type: 'symlink', linkname: e.target!, mode: 0o777, mtime });
      else file(name, readFileSync(join(t.source, e.rel)), e.mode);
    }
  }
  pack.finalize();
  const chunks: Buffer[] = [];
  for await (const chunk of pack as unknown as AsyncIterable<Buffer>) chunks.push(chunk);
  return Buffer.concat(chunks);
}

async function busyboxApplets(): Promise<string[]> {
  const { execFile } = await import('node:child_process');
  return new Promise((resolve, reject) => {
    execFile(BUSYBOX, ['--list-full'], (err, stdout) => {
      if (err) reject(new Error(`${BUSYBOX} --list-full failed (install busybox-static): ${err.message}`));
      else resolve(stdout.split('\n').map((s) => s.trim()).filter(Boolean));
    });
  });
}

function changesFor(bridgeVersion: number | null): string[] {
  return [
    ...(bridgeVersion === null ? [] : [`LABEL ${BRIDGE_LABEL}=${bridgeVersion}`]),
    'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin',
    'CMD ["/bin/sleep","infinity"]',
  ];
}

function referenceFor(bridgeVersion: number | null, helperVersion: number | null): string {
  const label = bridgeVersion === null ? 'nolabel' : `bridge${bridgeVersion}`;
  const helper = helperVersion === bridgeVersion ? '' : helperVersion === null ? '-nohelper' : `-helper${helperVersion}`;
  return `${IMAGE_REPO}:${label}${helper}`;
}

/** Wait for a dockerode progress stream to end; a message with `error` fails it. */
function followProgress(docker: Docker, stream: NodeJS.ReadableStream): Promise<Array<Record<string, unknown>>> {
  return new Promise((resolve, reject) => {
    docker.modem.followProgress(stream, (err: Error | null, output: Array<Record<string, unknown>>) => {
      if (err) return reject(err);
      const failed = output.find((m) => m.error !== undefined || m.errorDetail !== undefined);
      if (failed) return reject(new Error(`docker: ${JSON.stringify(failed.error ?? failed.errorDetail)}`));
      resolve(output);
    });
  });
}

const inFlight = new Map<string, Promise<SandboxImage>>();

/**
 * Build (or take from the cache) the sandbox image archive for a spec. `builder` is the daemon that
 * runs `docker import` when the cache misses (use the first host); it ends up holding the image.
 */
export function buildSandboxImage(builder: Docker, spec: SandboxImageSpec): Promise<SandboxImage> {
  const helperVersion = spec.helperVersion === undefined ? spec.bridgeVersion : spec.helperVersion;
  const key = `${spec.bridgeVersion}/${helperVersion}/${spec.tagSuffix ?? ''}/${spec.helperOutput ?? ''}`;
  let p = inFlight.get(key);
  if (!p) {
    p = build(builder, spec.bridgeVersion, helperVersion, spec.extraFiles ?? [], spec.tagSuffix, spec.extraTrees ?? [], spec.helperOutput, spec.helper);
    inFlight.set(key, p);
    p.catch(() => inFlight.delete(key));
  }
  return p;
}

async function build(builder: Docker, bridgeVersion: number | null, helperVersion: number | null, extraFiles: readonly ExtraFile[], tagSuffix: string | undefined, extraTrees: readonly ExtraTree[], helperOutput?: string, helper?: ExtraFile): Promise<SandboxImage> {
  if ((extraFiles.length > 0 || extraTrees.length > 0 || helperOutput !== undefined || helper !== undefined) && tagSuffix === undefined) throw new Error('an image with extra files, a custom helper output or a real helper needs a tagSuffix');
  const rootfs = await rootfsTar(helperVersion, extraFiles, extraTrees, helperOutput, helper);
  const changes = changesFor(bridgeVersion);
  const reference = `${referenceFor(bridgeVersion, helperVersion)}${tagSuffix === undefined ? '' : `-${tagSuffix}`}`;
  const digest = createHash('sha256').update(`recipe ${RECIPE_VERSION}\n`).update(JSON.stringify({ changes, reference })).update(rootfs).digest('hex');
  const cacheDir = imageCacheDir();
  mkdirSync(cacheDir, { recursive: true });
  const archivePath = join(cacheDir, `sandbox-${digest.slice(0, 24)}.tar`);
  const metaPath = `${archivePath}.json`;
  if (existsSync(archivePath) && existsSync(metaPath)) {
    const meta = JSON.parse(readFileSync(metaPath, 'utf8')) as { imageId: string; reference: string };
    return { archivePath, imageId: meta.imageId, reference: meta.reference };
  }

  const [repo, tag] = reference.split(':') as [string, string];
  await followProgress(builder, await builder.importImage(Readable.from([rootfs]) as unknown as string, { repo, tag, changes }));
  const image = builder.getImage(reference);
  const { Id: imageId } = await image.inspect();
  // Write to a private temp name, then rename: concurrent test processes may build the same key.
  const tmp = `${archivePath}.${process.pid}.${Date.now()}.tmp`;
  try {
    await pipeline(await image.get(), createWriteStream(tmp));
    renameSync(tmp, archivePath);
  } finally {
    rmSync(tmp, { force: true });
  }
  const metaTmp = `${metaPath}.${process.pid}.tmp`;
  writeFileSync(metaTmp, `${JSON.stringify({ imageId, reference }, null, 2)}\n`);
  renameSync(metaTmp, metaPath);
  return { archivePath, imageId, reference };
}

/** `docker load` an archive into a host; returns the image id it reports for the reference. */
export async function loadImage(docker: Docker, image: SandboxImage): Promise<string> {
  await followProgress(docker, await docker.loadImage(createReadStream(image.archivePath)));
  const { Id } = await docker.getImage(image.reference).inspect();
  if (Id !== image.imageId) throw new Error(`loaded ${image.reference} as ${Id}, expected ${image.imageId}`);
  return Id;
}

/** Build (cached) and load one spec into every host; returns the image. */
export async function provisionSandboxImage(hosts: readonly Docker[], spec: SandboxImageSpec): Promise<SandboxImage> {
  const [first] = hosts;
  if (!first) throw new Error('provisionSandboxImage needs at least one host');
  const image = await buildSandboxImage(first, spec);
  await Promise.all(hosts.map((d) => loadImage(d, image)));
  return image;
}
