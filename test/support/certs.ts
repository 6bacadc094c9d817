// Test helper: a throwaway PKI made with the real `openssl` CLI in a temp dir (R-R5 tests). One
// fleet CA signs a server certificate for 127.0.0.1/localhost and client certificates per role
// (runner, admin, host, and one naming no role); an unrelated second CA signs its own "runner"
// certificate, so tests can show that a well-formed certificate from the wrong CA is refused.
// Roles are carried both as the subject OU and as a SPIFFE URI SAN, like a production CA would.
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface CertPair {
  readonly cert: Buffer;
  readonly key: Buffer;
}

export interface TestPki {
  readonly dir: string;
  /** The fleet CA (PEM): trusted by the server for clients and by clients for the server. */
  readonly ca: Buffer;
  readonly server: CertPair;
  readonly runner: CertPair;
  readonly admin: CertPair;
  readonly host: CertPair;
  /** Signed by the fleet CA but names no sandboxfleet role. */
  readonly noRole: CertPair;
  /** An unrelated CA and a runner certificate it signed. */
  readonly rogueCa: Buffer;
  readonly rogueRunner: CertPair;
  cleanup(): Promise<void>;
}

async function openssl(dir: string, args: string[]): Promise<void> {
  await run('openssl', args, { cwd: dir });
}

async function makeCa(dir: string, name: string): Promise<void> {
  await openssl(dir, [
    'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes',
    '-keyout', `${name}.key`, '-out', `${name}.crt`, '-days', '2', '-subj', `/O=sandboxfleet-test/CN=${name}`,
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign',
  ]);
}

async function makeLeaf(dir: string, ca: string, name: string, subject: string, extensions: string[]): Promise<CertPair> {
  await openssl(dir, ['req', '-new', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', subject]);
  await writeFile(join(dir, `${name}.ext`), `${['basicConstraints=CA:FALSE', 'keyUsage=critical,digitalSignature,keyEncipherment', ...extensions].join('\n')}\n`);
  await openssl(dir, [
    // A random serial per certificate: a shared .srl file races when leaves are signed in parallel.
    'x509', '-req', '-in', `${name}.csr`, '-CA', `${ca}.crt`, '-CAkey', `${ca}.key`, '-set_serial', `0x${randomBytes(16).toString('hex')}`,
    '-out', `${name}.crt`, '-days', '2', '-extfile', `${name}.ext`,
  ]);
  return { cert: await readFile(join(dir, `${name}.crt`)), key: await readFile(join(dir, `${name}.key`)) };
}

function clientCert(dir: string, ca: string, name: string, role: string | undefined): Promise<CertPair> {
  const subject = role === undefined ? `/O=sandboxfleet-test/CN=${name}` : `/O=sandboxfleet-test/OU=${role}/CN=${name}`;
  const san = role === undefined ? [] : [`subjectAltName=URI:spiffe://sandboxfleet/${role}/${name}`];
  return makeLeaf(dir, ca, name, subject, ['extendedKeyUsage=clientAuth', ...san]);
}

export async function createTestPki(): Promise<TestPki> {
  const dir = await mkdtemp(join(tmpdir(), 'sf-pki-'));
  try {
    await makeCa(dir, 'fleet-ca');
    await makeCa(dir, 'rogue-ca');
    const server = await makeLeaf(dir, 'fleet-ca', 'server', '/O=sandboxfleet-test/OU=control-plane/CN=localhost', [
      'extendedKeyUsage=serverAuth',
      'subjectAltName=IP:127.0.0.1,DNS:localhost',
    ]);
    const [runner, admin, host, noRole, rogueRunner] = await Promise.all([
      clientCert(dir, 'fleet-ca', 'runner-1', 'runner'),
      clientCert(dir, 'fleet-ca', 'admin-1', 'admin'),
      clientCert(dir, 'fleet-ca', 'host-a', 'host'),
      clientCert(dir, 'fleet-ca', 'nobody', undefined),
      clientCert(dir, 'rogue-ca', 'rogue-runner', 'runner'),
    ]);
    return {
      dir,
      ca: await readFile(join(dir, 'fleet-ca.crt')),
      server,
      runner,
      admin,
      host,
      noRole,
      rogueCa: await readFile(join(dir, 'rogue-ca.crt')),
      rogueRunner,
      cleanup: () => rm(dir, { recursive: true, force: true }),
    };
  } catch (error) {
    await rm(dir, { recursive: true, force: true });
    throw error;
  }
}
