// Three projects: `unit` (pure, fast, no services), `seam` (the API server bound to a named seam
// backend: in-memory store, simulated host; real sockets but no real services, so not
// "integration") and `integration` (real nats-server, dockerd, helm, promtool). Integration files
// run one at a time: they start real daemons on a 2-core box.
import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    reporters: ['default'],
    projects: [
      { test: { name: 'unit', include: ['test/unit/**/*.test.ts'], testTimeout: 60_000 } },
      { test: { name: 'seam', include: ['test/seam/**/*.test.ts'], testTimeout: 120_000 } },
      {
        test: {
          name: 'integration',
          include: ['test/integration/**/*.test.ts'],
          testTimeout: 180_000,
          hookTimeout: 180_000,
          fileParallelism: false,
          pool: 'forks',
        },
      },
    ],
  },
});
