// Lint rules, including the layer table of ARCHITECTURE.md enforced with no-restricted-imports.
// A folder may import only the layers listed for it; everything else is an error.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

const layers = ['core', 'gen', 'wire', 'config', 'observability', 'store', 'docker', 'kube', 'host-agent', 'control-plane', 'api', 'runner-sdk', 'cli'];
/** What each src/ folder may import (besides itself). Keep in step with ARCHITECTURE.md. */
const allowed = {
  core: [],
  gen: [],
  wire: ['core', 'gen'],
  config: ['core'],
  observability: ['core'],
  store: ['core', 'gen', 'config', 'observability'],
  docker: ['core', 'config', 'observability'],
  kube: ['core', 'config', 'observability'],
  'host-agent': ['core', 'gen', 'wire', 'config', 'observability', 'store', 'docker'],
  // runner-sdk: RunTurn runs the SDK's own turn-end detectors server-side (one rule, R-S5).
  'control-plane': ['core', 'gen', 'wire', 'config', 'observability', 'store', 'kube', 'runner-sdk'],
  api: ['core', 'gen', 'wire', 'config', 'observability', 'control-plane'],
  'runner-sdk': ['gen'],
  cli: ['core', 'gen', 'config', 'runner-sdk'],
};
const ioModules = ['fs', 'net', 'child_process', 'http', 'https', 'http2', 'dgram', 'dns', 'tls', 'os', 'worker_threads', 'cluster', 'process']
  .flatMap((m) => [m, `node:${m}`, `${m}/promises`, `node:${m}/promises`]);

const layerRules = Object.entries(allowed).map(([layer, ok]) => ({
  files: [`src/${layer}/**/*.ts`],
  rules: {
    'no-restricted-imports': ['error', {
      patterns: layers.filter((l) => l !== layer && !ok.includes(l)).map((l) => ({
        group: [`**/${l}/*`, `**/${l}`],
        message: `src/${layer} may not import src/${l} (see ARCHITECTURE.md, "Layers").`,
      })).concat(layer === 'core' ? [{
        group: ['dockerode', '@nats-io/*', '@grpc/*', '@kubernetes/*', 'pino', 'prom-client', 'tar-stream'],
        message: 'src/core is pure domain logic: no I/O libraries.',
      }] : []),
      paths: layer === 'core' ? ioModules.map((name) => ({ name, message: 'src/core is pure: no I/O.' })) : [],
    }],
  },
}));

export default tseslint.config(
  { ignores: ['node_modules/**', 'src/gen/**', 'bench/results/**', 'helm/**', 'coverage/**'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      'no-console': 'off',
    },
  },
  ...layerRules,
  {
    files: ['src/core/**/*.ts'],
    rules: { 'no-restricted-globals': ['error', { name: 'Date', message: 'src/core reads no clock: pass time in.' }, { name: 'process', message: 'src/core reads no env.' }] },
  },
  {
    // The control plane never lists a bucket (R-R7): its loops and queries read the read model
    // (fleet-state.ts, fed by watches) and act per key; a listing is bounded, so a decision made on
    // one can miss records (and a deletion decided on absence destroys state, R-R6).
    files: ['src/control-plane/**/*.ts', 'src/api/**/*.ts'],
    rules: {
      'no-restricted-syntax': ['error',
        { selector: "CallExpression[callee.property.name=/^(list|keys)$/][callee.object.property.name=/^(repo|repos|hosts|groups|checkpoints|conversations|idempotency|gcLocks|heartbeats)$/]", message: 'no bucket listings in the control plane: read the read model (fleet-state.ts) or get by key.' },
        { selector: "CallExpression[callee.property.name=/^(list|keys)$/][callee.object.name=/^(repo|repos|store)$/]", message: 'no bucket listings in the control plane: read the read model (fleet-state.ts) or get by key.' },
        { selector: "CallExpression[callee.name=/^list(Groups|Hosts)$/]", message: 'no bucket listings in the control plane: read the read model (fleet-state.ts).' },
      ],
    },
  },
);
