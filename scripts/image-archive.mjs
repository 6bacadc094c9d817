#!/usr/bin/env node
// Writes a container image archive in `docker save` format from root file system directories,
// without Docker or a registry: one layer per directory, in order (GNU tar of the directory: sorted
// names, mtime 0, owner root, so the same tree gives the same layer and image id), its config
// (entrypoint, env, user, labels) and manifest.json. `ctr images import` and `docker load` both
// read it; images that share a first layer store it once. Used by scripts/test-cluster (the pause
// image) and test/support/cluster-images.ts (control plane, host agent, NATS).
//   node image-archive.mjs OUT.tar REFERENCE CONFIG_JSON ROOTFS_DIR [MORE_LAYER_DIR...]
// CONFIG_JSON is the image config's "config" object, e.g. '{"Entrypoint":["/pause"]}'.
import process from 'node:process';
import { Buffer } from 'node:buffer';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createReadStream, mkdirSync, mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';

const [out, reference, configJson, ...layers] = process.argv.slice(2);
if (!out || !reference || !configJson || layers.length === 0) {
  process.stderr.write('usage: image-archive.mjs OUT.tar REFERENCE CONFIG_JSON ROOTFS_DIR [MORE_LAYER_DIR...]\n');
  process.exit(2);
}
const sha256File = (path) => new Promise((resolve, reject) => {
  const h = createHash('sha256');
  createReadStream(path).on('data', (d) => h.update(d)).on('end', () => resolve(h.digest('hex'))).on('error', reject);
});
const stage = mkdtempSync(join(tmpdir(), 'image-archive-'));
try {
  const diffIds = [];
  for (const dir of layers) {
    const layer = join(stage, 'layer.tar');
    execFileSync('tar', ['--sort=name', '--mtime=@0', '--owner=0', '--group=0', '--numeric-owner', '--format=posix',
      '--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime', '-C', dir, '-cf', layer, '.']);
    const diffId = await sha256File(layer);
    mkdirSync(join(stage, diffId), { recursive: true });
    renameSync(layer, join(stage, diffId, 'layer.tar'));
    diffIds.push(diffId);
  }
  const config = Buffer.from(JSON.stringify({
    architecture: 'amd64', os: 'linux', created: '1970-01-01T00:00:00Z',
    config: JSON.parse(configJson),
    rootfs: { type: 'layers', diff_ids: diffIds.map((d) => `sha256:${d}`) },
    history: diffIds.map(() => ({ created: '1970-01-01T00:00:00Z', created_by: 'scripts/image-archive.mjs' })),
  }));
  const configId = createHash('sha256').update(config).digest('hex');
  writeFileSync(join(stage, `${configId}.json`), config);
  writeFileSync(join(stage, 'manifest.json'), JSON.stringify([{ Config: `${configId}.json`, RepoTags: [reference], Layers: diffIds.map((d) => `${d}/layer.tar`) }]));
  mkdirSync(dirname(out), { recursive: true });
  execFileSync('tar', ['--sort=name', '--mtime=@0', '--owner=0', '--group=0', '--numeric-owner', '-C', stage, '-cf', `${out}.tmp`, '.']);
  renameSync(`${out}.tmp`, out);
  process.stdout.write(`sha256:${configId}\n`);
} finally {
  rmSync(stage, { recursive: true, force: true });
}
