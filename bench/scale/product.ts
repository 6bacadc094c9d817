// The code under test of bench/scale, loaded from a source tree given at run time: this checkout by
// default, or another one (`--baseline-root`, e.g. a `git worktree` of the commit before the read
// model) so the same benchmark measures the old control plane against the new one. Every process of
// the benchmark (control plane, load generator, the parent that plants records) loads the SAME tree,
// so records, protobuf messages and the attestation's API SHA match the control plane they talk to.
// Typed as this checkout's modules; an older tree is used only through what both have in common
// (the ControlPlane options, StateStore.open, repositories, the agent protobuf messages).
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type * as ConfigModule from '../../src/config/control-plane.ts';
import type * as BucketsModule from '../../src/control-plane/buckets.ts';
import type * as ControlPlaneModule from '../../src/control-plane/control-plane.ts';
import type * as RecordsModule from '../../src/control-plane/records.ts';
import type * as StateModule from '../../src/control-plane/state.ts';
import type * as SubjectsModule from '../../src/core/agent-subjects.ts';
import type * as AgentProtoModule from '../../src/gen/sandboxfleet/v1/agent.ts';
import type * as InventoryElisionModule from '../../src/host-agent/inventory-elision.ts';
import type * as ApiShaModule from '../../src/gen/api-sha.ts';
import type * as LoggerModule from '../../src/observability/logger.ts';
import type * as MetricsModule from '../../src/observability/metrics.ts';
import type * as ChunkStoreModule from '../../src/store/chunk-store.ts';
import type * as ConnectionModule from '../../src/store/connection.ts';

/** This checkout (the tree the benchmark itself lives in). */
export const THIS_ROOT = fileURLToPath(new URL('../../', import.meta.url));

export interface Product {
  readonly root: string;
  readonly config: typeof ConfigModule;
  readonly buckets: typeof BucketsModule;
  readonly controlPlane: typeof ControlPlaneModule;
  readonly records: typeof RecordsModule;
  readonly state: typeof StateModule;
  readonly subjects: typeof SubjectsModule;
  readonly proto: typeof AgentProtoModule;
  readonly apiSha: typeof ApiShaModule;
  readonly logger: typeof LoggerModule;
  readonly metrics: typeof MetricsModule;
  readonly chunkStore: typeof ChunkStoreModule;
  readonly connection: typeof ConnectionModule;
  /** How the agent leaves unchanged container entries out of its beats; absent in trees before it (every beat carries them). */
  readonly inventoryElision: typeof InventoryElisionModule | undefined;
}

export async function loadProduct(root: string = THIS_ROOT): Promise<Product> {
  const abs = resolve(root);
  const load = <T>(rel: string): Promise<T> => import(pathToFileURL(join(abs, rel)).href) as Promise<T>;
  return {
    root: abs,
    config: await load('src/config/control-plane.ts'),
    buckets: await load('src/control-plane/buckets.ts'),
    controlPlane: await load('src/control-plane/control-plane.ts'),
    records: await load('src/control-plane/records.ts'),
    state: await load('src/control-plane/state.ts'),
    subjects: await load('src/core/agent-subjects.ts'),
    proto: await load('src/gen/sandboxfleet/v1/agent.ts'),
    apiSha: await load('src/gen/api-sha.ts'),
    logger: await load('src/observability/logger.ts'),
    metrics: await load('src/observability/metrics.ts'),
    chunkStore: await load('src/store/chunk-store.ts'),
    connection: await load('src/store/connection.ts'),
    inventoryElision: existsSync(join(abs, 'src/host-agent/inventory-elision.ts')) ? await load('src/host-agent/inventory-elision.ts') : undefined,
  };
}
