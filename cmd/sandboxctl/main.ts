// `sandboxctl` (R-I7): the operator CLI over the control plane's AdminService. Installed as
// `kubectl-sandbox` too (a symlink to ./sandboxctl.mjs, the launcher), so `kubectl sandbox hosts` works as a plugin.
// Exit codes: 0 success, 1 failed call or failed verification, 2 usage error.
import { runCli } from '../../src/cli/commands.ts';

// grpc-js sets the TLS SNI to the server address even when it is an IP (`-s 127.0.0.1:7443`), and
// Node warns about that on every connection (DEP0123). Harmless for us; keep operators' output clean.
const emitWarning = process.emitWarning.bind(process) as (...args: unknown[]) => void;
process.emitWarning = ((...args: unknown[]) => {
  const [warning, second] = args;
  const code = typeof second === 'object' && second !== null ? (second as { code?: string }).code : args[2];
  if (code === 'DEP0123' || (warning instanceof Error && (warning as Error & { code?: string }).code === 'DEP0123')) return;
  emitWarning(...args);
}) as typeof process.emitWarning;

const code = await runCli(process.argv.slice(2), {
  out: (text) => process.stdout.write(`${text}\n`),
  err: (text) => process.stderr.write(`${text}\n`),
});
// Let stdout drain before exiting (large -o json outputs through a pipe).
process.stdout.write('', () => process.exit(code));
