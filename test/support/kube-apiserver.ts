// Test helper: a real Kubernetes API server on loopback, backed by a real etcd (Debian's
// etcd-server), the way envtest runs one: kube-apiserver built by scripts/bootstrap, a static admin
// token (system:masters), a self-signed serving certificate, no endpoint reconciler (its only
// address is 127.0.0.1). No kubelet, no controllers: Node objects are created by the test.
import { spawn, type ChildProcess } from 'node:child_process';
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { get as httpsGet } from 'node:https';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { KubeConfig } from '@kubernetes/client-node';
import { toolPath } from '../../src/config/tools.ts';

export interface TestKubeApiServer {
  readonly url: string;
  /** A kubeconfig file (admin token, server certificate not verified: it is self-signed). */
  readonly kubeconfigPath: string;
  kubeConfig(): KubeConfig;
  stop(): Promise<void>;
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const a = s.address();
      s.close(() => resolve(typeof a === 'object' && a !== null ? a.port : 0));
    });
  });
}

function run(binary: string, args: string[], logFile: string): ChildProcess {
  const child = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  const log = createWriteStream(logFile);
  child.stdout?.pipe(log);
  child.stderr?.pipe(log);
  return child;
}

async function stopProcess(child: ChildProcess | undefined): Promise<void> {
  if (child === undefined || child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
  await exited;
  clearTimeout(timer);
}

/** GET /readyz (self-signed serving certificate: not verified on this loopback test server). */
function readyz(url: string, token: string): Promise<boolean> {
  return new Promise((resolve) => {
    const req = httpsGet(url, { headers: { authorization: `Bearer ${token}` }, rejectUnauthorized: false, timeout: 2_000 }, (res) => {
      res.resume();
      resolve(res.statusCode === 200);
    });
    req.on('error', () => resolve(false));
    req.on('timeout', () => req.destroy());
  });
}

export async function startKubeApiServer(): Promise<TestKubeApiServer> {
  const dir = await mkdtemp(join(tmpdir(), 'sf-kube-'));
  const [etcdClient, etcdPeer, apiPort] = [await freePort(), await freePort(), await freePort()];
  const token = randomBytes(24).toString('hex');
  const { privateKey, publicKey } = generateKeyPairSync('rsa', { modulusLength: 2048, privateKeyEncoding: { type: 'pkcs8', format: 'pem' }, publicKeyEncoding: { type: 'spki', format: 'pem' } });
  await writeFile(join(dir, 'sa.key'), privateKey, { mode: 0o600 });
  await writeFile(join(dir, 'sa.pub'), publicKey);
  await writeFile(join(dir, 'tokens.csv'), `${token},admin,admin-uid,system:masters\n`, { mode: 0o600 });
  let etcd: ChildProcess | undefined;
  let api: ChildProcess | undefined;
  const stop = async (): Promise<void> => {
    await stopProcess(api);
    await stopProcess(etcd);
    await rm(dir, { recursive: true, force: true });
  };
  try {
    etcd = run(toolPath('etcd'), [
      '--name', 'default', '--data-dir', join(dir, 'etcd'),
      '--listen-client-urls', `http://127.0.0.1:${etcdClient}`, '--advertise-client-urls', `http://127.0.0.1:${etcdClient}`,
      '--listen-peer-urls', `http://127.0.0.1:${etcdPeer}`, '--initial-advertise-peer-urls', `http://127.0.0.1:${etcdPeer}`,
      '--initial-cluster', `default=http://127.0.0.1:${etcdPeer}`,
    ], join(dir, 'etcd.log'));
    api = run(toolPath('kube-apiserver'), [
      `--etcd-servers=http://127.0.0.1:${etcdClient}`,
      '--bind-address=127.0.0.1', `--secure-port=${apiPort}`, '--advertise-address=127.0.0.1', '--endpoint-reconciler-type=none',
      `--cert-dir=${join(dir, 'certs')}`, `--token-auth-file=${join(dir, 'tokens.csv')}`, '--authorization-mode=RBAC',
      '--service-account-issuer=https://kubernetes.default.svc', `--service-account-key-file=${join(dir, 'sa.pub')}`, `--service-account-signing-key-file=${join(dir, 'sa.key')}`,
      // Required by the server; nothing is ever sent to it (no kube-proxy, no pods).
      '--service-cluster-ip-range=10.0.0.0/24',
    ], join(dir, 'kube-apiserver.log'));
    const url = `https://127.0.0.1:${apiPort}`;
    const kubeconfig = [
      'apiVersion: v1', 'kind: Config', 'current-context: test',
      'clusters:', `- name: test`, '  cluster:', `    server: ${url}`, '    insecure-skip-tls-verify: true',
      'users:', '- name: admin', '  user:', `    token: ${token}`,
      'contexts:', '- name: test', '  context:', '    cluster: test', '    user: admin', '',
    ].join('\n');
    const kubeconfigPath = join(dir, 'kubeconfig');
    await writeFile(kubeconfigPath, kubeconfig, { mode: 0o600 });
    const kubeConfig = (): KubeConfig => {
      const kc = new KubeConfig();
      kc.loadFromFile(kubeconfigPath);
      return kc;
    };
    // Ready when /readyz passes every check (etcd, RBAC bootstrap roles, ...).
    const deadline = Date.now() + 60_000;
    for (;;) {
      if (api.exitCode !== null) throw new Error(`kube-apiserver exited (${api.exitCode}); see ${join(dir, 'kube-apiserver.log')}`);
      const ok = await readyz(`${url}/readyz`, token);
      if (ok) break;
      if (Date.now() > deadline) throw new Error(`kube-apiserver not ready within 60 s; see ${join(dir, 'kube-apiserver.log')}`);
      await new Promise((r) => setTimeout(r, 250));
    }
    return { url, kubeconfigPath, kubeConfig, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}
