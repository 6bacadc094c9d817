// The images the Helm chart names, built on this machine for the test cluster (no registry, no base
// image pull): the control plane and the host agent from the project's own build - a root file
// system assembled from the commit the images are stamped with (`git archive HEAD` of the files
// the Dockerfile copies: package.json, package-lock.json, tsconfig.json, cmd/, src/, proto/; not
// the working tree, whose uncommitted edits are no build), the production dependencies exactly as a
// release installs them (`npm ci --omit=dev --ignore-scripts`, as the Dockerfile's deps stage), and
// this machine's Node.js with the libraries it links - and a NATS image of the pinned nats-server
// that scripts/bootstrap builds. Each is written as a `docker save` archive by
// scripts/image-archive.mjs and imported into a node's containerd with `ctr images import`.
//
// How this relates to the Dockerfile (the release path): same files, same install command, same
// entrypoints, env (NODE_ENV=production, SANDBOXFLEET_BUILD_SHA baked in) and revision label, same
// users (65532 for the control plane, root for the agent); only the base differs (this machine's
// node binary and libraries instead of node:20-bookworm-slim), because CI here reaches no registry.
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, realpathSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { toolsDir } from '../../src/config/tools.ts';
import { imageCacheDir } from './sandbox-image.ts';

const execFileP = promisify(execFile);
export const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
/** What the Dockerfile's runtime stage copies from the checkout (see .dockerignore). */
const APP_FILES = ['package.json', 'package-lock.json', 'tsconfig.json', 'cmd', 'src', 'proto'];
export const IMAGE_TAG = 'ci';
export const CONTROL_PLANE_REPOSITORY = 'sandbox-fleet/control-plane';
export const HOST_AGENT_REPOSITORY = 'sandbox-fleet/host-agent';
export const NATS_REPOSITORY = 'sandbox-fleet-test/nats';

export interface ClusterImage {
  readonly reference: string;
  /** `sha256:<hex>` config digest: the image id containerd reports. */
  readonly id: string;
  readonly archivePath: string;
}

export interface ClusterImages {
  readonly controlPlane: ClusterImage;
  readonly hostAgent: ClusterImage;
  readonly nats: ClusterImage;
  /** The git SHA baked in (SANDBOXFLEET_BUILD_SHA): what attestation.allowedAgentShas must list. */
  readonly buildSha: string;
}

/** A binary and every shared library `ldd` says it loads, at their own paths. */
async function withLibraries(binary: string): Promise<string[]> {
  const { stdout } = await execFileP('ldd', [binary]);
  const libs = [...stdout.matchAll(/(?:=>\s+)?(\/\S+)\s+\(0x/g)].map((m) => m[1] as string);
  return [binary, ...libs];
}

/** Copy files into the root file system at the same absolute paths (symlinks resolved). */
function copyAt(rootfs: string, paths: readonly string[], as?: string): void {
  for (const path of paths) {
    const target = join(rootfs, as !== undefined && path === paths[0] ? as : path);
    mkdirSync(dirname(target), { recursive: true });
    copyFileSync(realpathSync(path), target);
    chmodSync(target, 0o755);
  }
}

function baseTree(rootfs: string): void {
  for (const d of ['etc', 'usr/local/bin', 'var/lib/sandboxfleet']) mkdirSync(join(rootfs, d), { recursive: true });
  mkdirSync(join(rootfs, 'tmp'), { recursive: true });
  chmodSync(join(rootfs, 'tmp'), 0o1777);
  writeFileSync(join(rootfs, 'etc/passwd'), 'root:x:0:0:root:/root:/bin/sh\nnats:x:1000:1000:nats:/tmp:/bin/false\nnonroot:x:65532:65532:nonroot:/home/nonroot:/bin/false\n');
  writeFileSync(join(rootfs, 'etc/group'), 'root:x:0:\nnats:x:1000:\nnonroot:x:65532:\n');
}

/**
 * node_modules exactly as a release installs it (`npm ci --omit=dev --ignore-scripts`, the
 * Dockerfile's deps stage), cached by the lockfile and package.json it was installed from.
 */
async function productionModules(sha: string): Promise<string> {
  const files = await Promise.all(['package.json', 'package-lock.json'].map(async (f) => (await execFileP('git', ['show', `${sha}:${f}`], { cwd: REPO_ROOT, maxBuffer: 64 * 1024 * 1024 })).stdout));
  const key = createHash('sha256').update(files[0]!).update(files[1]!).digest('hex').slice(0, 16);
  const dir = join(imageCacheDir(), `prod-modules-${key}`);
  if (existsSync(join(dir, 'node_modules'))) return join(dir, 'node_modules');
  const stage = mkdtempSync(join(imageCacheDir(), 'prod-modules-tmp-'));
  writeFileSync(join(stage, 'package.json'), files[0]!);
  writeFileSync(join(stage, 'package-lock.json'), files[1]!);
  await execFileP('npm', ['ci', '--omit=dev', '--ignore-scripts', '--prefer-offline', '--no-audit', '--no-fund', '--loglevel=error'], { cwd: stage, maxBuffer: 16 * 1024 * 1024 });
  rmSync(dir, { recursive: true, force: true });
  renameSync(stage, dir);
  return join(dir, 'node_modules');
}

async function archive(out: string, reference: string, config: object, layers: readonly string[]): Promise<ClusterImage> {
  const { stdout } = await execFileP('node', [join(REPO_ROOT, 'scripts/image-archive.mjs'), out, reference, JSON.stringify(config), ...layers], { maxBuffer: 1024 * 1024 });
  return { reference, id: stdout.trim(), archivePath: out };
}

export async function gitHead(): Promise<string> {
  const { stdout } = await execFileP('git', ['rev-parse', 'HEAD'], { cwd: REPO_ROOT });
  return stdout.trim();
}

/** Builds the three archives into `outDir` (a scratch directory of the caller). */
export async function buildClusterImages(outDir: string): Promise<ClusterImages> {
  mkdirSync(imageCacheDir(), { recursive: true });
  const buildSha = await gitHead();
  const [modules, nodeFiles, tarFiles, rmFiles, natsFiles] = await Promise.all([
    productionModules(buildSha), withLibraries(process.execPath), withLibraries('/bin/tar'), withLibraries('/bin/rm'),
    withLibraries(join(toolsDir(), 'bin', 'nats-server')),
  ]);
  const stage = mkdtempSync(join(outDir, 'rootfs-'));
  try {
    // The runtime both processes share (the Dockerfile's `runtime` stage).
    const runtime = join(stage, 'runtime');
    baseTree(runtime);
    copyAt(runtime, nodeFiles, '/usr/local/bin/node');
    mkdirSync(join(runtime, 'app'));
    await execFileP('bash', ['-c', 'set -o pipefail; dir=$0 sha=$1; shift; git archive --format=tar "$sha" -- "$@" | tar -x -C "$dir"', join(runtime, 'app'), buildSha, ...APP_FILES], { cwd: REPO_ROOT });
    cpSync(modules, join(runtime, 'app/node_modules'), { recursive: true, verbatimSymlinks: true });
    const env = ['PATH=/usr/local/bin:/usr/bin:/bin', 'NODE_ENV=production', `SANDBOXFLEET_BUILD_SHA=${buildSha}`];
    const labels = { 'org.opencontainers.image.title': 'sandbox-fleet', 'org.opencontainers.image.revision': buildSha };
    const controlPlane = await archive(join(outDir, 'control-plane.tar'), `${CONTROL_PLANE_REPOSITORY}:${IMAGE_TAG}`, {
      Entrypoint: ['node', '--import', 'tsx', 'cmd/control-plane/main.ts'], WorkingDir: '/app', User: '65532:65532', Env: env, Labels: labels,
      ExposedPorts: { '7443/tcp': {}, '9464/tcp': {} },
    }, [runtime]);
    // The agent adds a layer with GNU tar (layer capture and restore) and rm (restore staging), as
    // the Debian base of the Dockerfile provides them; the runtime layer is shared with the
    // control plane's image (stored once per node).
    const agentTools = join(stage, 'agent-tools');
    copyAt(agentTools, tarFiles);
    copyAt(agentTools, rmFiles);
    const hostAgent = await archive(join(outDir, 'host-agent.tar'), `${HOST_AGENT_REPOSITORY}:${IMAGE_TAG}`, {
      Entrypoint: ['node', '--import', 'tsx', 'cmd/host-agent/main.ts'], WorkingDir: '/app', Env: env, Labels: labels,
    }, [runtime, agentTools]);
    const natsRoot = join(stage, 'nats');
    baseTree(natsRoot);
    copyAt(natsRoot, natsFiles, '/usr/local/bin/nats-server');
    const nats = await archive(join(outDir, 'nats.tar'), `${NATS_REPOSITORY}:${IMAGE_TAG}`, {
      Entrypoint: ['nats-server'], Env: ['PATH=/usr/local/bin:/usr/bin:/bin'], ExposedPorts: { '4222/tcp': {}, '8222/tcp': {} },
    }, [natsRoot]);
    return { controlPlane, hostAgent, nats, buildSha };
  } finally {
    rmSync(stage, { recursive: true, force: true });
  }
}

/** `ctr images import` into one node's containerd (the k8s.io namespace kubelet uses). */
export async function importIntoContainerd(containerdSocket: string, image: ClusterImage): Promise<void> {
  await execFileP('ctr', ['--address', containerdSocket, '-n', 'k8s.io', 'images', 'import', image.archivePath], { maxBuffer: 16 * 1024 * 1024 });
}
