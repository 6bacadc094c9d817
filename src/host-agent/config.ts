// Host-agent configuration: one zod schema, parsed once by loadHostAgentConfig() from cmd/, never
// at import time. Each field says why it exists. (src/config belongs to the control plane's lead;
// the agent keeps its own schema next to the code that uses it.)
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { z } from 'zod';
import { hostInboxPrefix } from '../core/agent-subjects.ts';
import { ID_RULES, parseHostId } from '../core/ids.ts';
import { DEFAULT_LAYER_LIMITS, layerLimits, type LayerLimits } from '../core/layer-rules.ts';
import type { NatsAuthOptions } from '../store/nats-auth.ts';

const IMAGE_ID_RE = /^sha256:[0-9a-f]{64}$/;
const command = z.array(z.string().min(1).max(4096)).min(1).max(64);

/** JSON-encoded env values (argv lists, maps); a parse failure names the variable. */
function jsonEnv(name: string, value: string | undefined): unknown {
  if (value === undefined || value === '') return undefined;
  try {
    return JSON.parse(value) as unknown;
  } catch (err) {
    throw new Error(`invalid host-agent configuration: ${name} is not JSON: ${(err as Error).message}`);
  }
}

/**
 * The member container's PID 1 when no per-CLI command is configured: an idle supervisor that exits
 * 0 on SIGTERM, so a stop is observed as "exited by itself" (R-G2). PID 1 ignores signals without a
 * handler, hence the explicit trap. Turns run as `docker exec` processes beside it.
 */
export const DEFAULT_MEMBER_COMMAND = ['/bin/sh', '-c', "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"];

/** Under the system temp dir: the chart mounts a writable volume there (the root file system is read-only). */
const DEFAULT_LAYER_CACHE_DIR = join(tmpdir(), 'sandboxfleet-chunk-cache');
const DEFAULT_LAYER_CACHE_MAX_BYTES = 1024 ** 3;
/** Next to the chunk cache: the capture indexes (host-agent/layer/capture-index.ts). */
const DEFAULT_LAYER_INDEX_DIR = join(tmpdir(), 'sandboxfleet-layer-index');
/**
 * The newest manifest schema version checkpoints are written in. Version-2 layer digests cover the
 * chunk list, not the tar bytes (core/checkpoint-manifest.ts): only they let a checkpoint reuse the
 * chunks of unchanged files without reading them. A checkpoint command caps it with the version its
 * control plane verifies (CheckpointCommand.max_manifest_schema_version; 1 from an older one).
 */
const DEFAULT_LAYER_MANIFEST_VERSION = 2;
const DEFAULT_LAYER_FULL_CAPTURE_EVERY = 10;
/** Chunks a restore keeps in memory between its validation and extraction passes. */
const DEFAULT_LAYER_RESTORE_MEMORY_BYTES = 256 * 1024 ** 2;

export const HostAgentConfigSchema = z
  .object({
    /** Stable host identity (the Kubernetes node name in-cluster); names the NATS subjects (R-I2). */
    hostId: z.string().refine((v) => parseHostId(v).ok, `host id: ${ID_RULES.hostId.describe}, ≤ ${ID_RULES.hostId.maxLength}`),
    /** NATS server(s) of the control plane (comma-separated). */
    natsUrl: z.string().trim().min(1),
    /** Docker engine socket this agent drives (the host's own dockerd). */
    dockerSocket: z.string().min(1).default('/var/run/docker.sock'),
    /**
     * The engine's data root as the operator configured it (the chart mounts it into the agent's
     * pod at the same path). Optional: when set, an engine reporting another DockerRootDir is refused
     * at start (a mount of the wrong directory would make every layer look missing).
     */
    dockerDataRoot: z.string().regex(/^\/./, 'must be an absolute path').optional(),
    /** Sandbox image reference as deployed (reported in attestation, R-H1). */
    imageRef: z.string().min(1).max(512),
    /** The pinned image id the members are created from; when set, the reference must resolve to it. */
    imageId: z.string().regex(IMAGE_ID_RE, 'image id must be sha256:<64 hex>').optional(),
    /** Exact git SHA this agent was built from (baked at build, R-H1). */
    agentSha: z.string().min(1).max(64),
    /** Member command per CLI kind (claude-code, codex, pi, opencode, kilo); default for the rest. */
    memberCommand: command.default(DEFAULT_MEMBER_COMMAND),
    memberCommands: z.record(z.string().regex(/^[a-z][a-z0-9-]{0,31}$/), command).default({}),
    /**
     * Network of member containers: `none` (default; sandboxes reach nothing), or `host` where the
     * CLIs must reach a model API on the host's loopback (a local gateway, or the fake model API of
     * the pinned-CLI history tests). No bridge networks: hosts run dockerd with --bridge=none.
     */
    memberNetworkMode: z.enum(['none', 'host']).default('none'),
    /** Heartbeat cadence (R-H3); the control plane's TTL is a multiple of it. */
    heartbeatIntervalMs: z.coerce.number().int().min(100).max(60_000).default(2000),
    /** Member containers this host accepts (reported as capacity, enforced on create/restore). */
    maxMembers: z.coerce.number().int().min(1).max(10_000).default(64),
    /** Upper bound of a stop's SIGTERM grace, whatever a command asks (R-G2: bounded grace). */
    maxStopGraceMs: z.coerce.number().int().min(0).max(600_000).default(60_000),
    /** Default grace when a stop command carries none. */
    defaultStopGraceMs: z.coerce.number().int().min(0).max(600_000).default(10_000),
    /** Consecutive failed engine checks after which the Docker data dir counts as lost (R-H5). */
    engineFailuresForDataLoss: z.coerce.number().int().min(1).max(1000).default(3),
    /** A file whose appearance means "this machine is being reclaimed" (spot/preemption notice, R-H5). */
    reclaimNoticeFile: z.string().min(1).optional(),
    /** On shutdown, how long in-flight commands may finish before NATS is drained anyway. */
    shutdownTimeoutMs: z.coerce.number().int().min(0).max(600_000).default(30_000),
    /** Registration request timeout and the cap of its retry backoff. */
    registerTimeoutMs: z.coerce.number().int().min(100).max(60_000).default(5000),
    registerMaxBackoffMs: z.coerce.number().int().min(100).max(300_000).default(10_000),
    /** This host's NATS credentials (R-I2, R-R5): a `.creds` file or an nkey user seed (store/nats-auth.ts). */
    natsCredsFile: z.string().min(1).optional(),
    /** PEM CA of the NATS server certificate; set to require TLS to NATS. */
    natsCaFile: z.string().min(1).optional(),
    logLevel: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
    /** A fixed end of this host's term (spot/rental), unix ms; 0 = none. The control plane drains before it (R-H4). */
    leaseEndUnixMs: z.coerce.number().int().min(0).default(0),
    /** Health (/healthz, /readyz) and Prometheus (/metrics) listener for kubelet probes and scraping; port 0 = any. */
    httpHost: z.string().min(1).default('127.0.0.1'),
    httpPort: z.coerce.number().int().min(0).max(65_535).default(9465),
    /**
     * Restore bounds (R-R4): a layer with more tar entries than this is refused (`layer_entry_limit`)
     * in the validation pass, before anything is written. Also bounds the validator's memory.
     */
    layerMaxEntries: z.coerce.number().int().min(1).max(100_000_000).default(DEFAULT_LAYER_LIMITS.maxEntries),
    /** A layer whose file data exceeds this many bytes is refused (`layer_size_limit`); so is a declared tar size above twice it. */
    layerMaxBytes: z.coerce.number().int().min(1).max(2 ** 50).default(DEFAULT_LAYER_LIMITS.maxLayerBytes),
    /** All entry names and link targets of a layer together, in characters (`layer_header_limit`); bounds the validator's memory. */
    layerMaxNameBytesTotal: z.coerce.number().int().min(1).max(2 ** 40).default(DEFAULT_LAYER_LIMITS.maxNameBytesTotal),
    /**
     * Per-host chunk cache (host-agent/layer/chunk-cache.ts): restore's validation pass stores the
     * chunks it fetched here and the extraction pass reads them back (verified on every read), and a
     * group returning to this host fetches only what is missing. One agent process per directory.
     */
    layerCacheDir: z.string().min(1).default(DEFAULT_LAYER_CACHE_DIR),
    /** Bytes the chunk cache keeps at most (least recently used evicted first); 0 = no cache (the extraction pass fetches again). */
    layerCacheMaxBytes: z.coerce.number().int().min(0).max(2 ** 50).default(DEFAULT_LAYER_CACHE_MAX_BYTES),
    /**
     * Newest schema version of the checkpoint manifests this agent writes (it reads both; a
     * checkpoint command may ask for version 1). 2: a checkpoint reads only the files that changed
     * since the last one of the same container on this host (layer/capture-store.ts); 1: every
     * checkpoint reads the whole layer.
     */
    layerManifestVersion: z.coerce.number().int().min(1).max(2).default(DEFAULT_LAYER_MANIFEST_VERSION),
    /** Where the per-container capture indexes are kept (a hint: lost or damaged ones mean a full read). */
    layerIndexDir: z.string().min(1).default(DEFAULT_LAYER_INDEX_DIR),
    /** Every Nth checkpoint of a container reads the whole layer anyway, in case a file's stat lied (1: always). */
    layerFullCaptureEvery: z.coerce.number().int().min(1).max(1000).default(DEFAULT_LAYER_FULL_CAPTURE_EVERY),
    /**
     * Bytes of chunks a restore keeps in memory from its validation pass for its extraction pass
     * (those are extracted from the bytes already verified instead of read back from the chunk cache
     * and hashed again); the rest goes through the cache. 0: none.
     */
    layerRestoreMemoryBytes: z.coerce.number().int().min(0).max(2 ** 40).default(DEFAULT_LAYER_RESTORE_MEMORY_BYTES),
  })
  .refine((c) => c.defaultStopGraceMs <= c.maxStopGraceMs, { message: 'defaultStopGraceMs must be ≤ maxStopGraceMs', path: ['defaultStopGraceMs'] });

export type HostAgentConfig = z.infer<typeof HostAgentConfigSchema>;
/** What a caller must give; everything else has a default. */
export type HostAgentConfigInput = z.input<typeof HostAgentConfigSchema>;

/** Validate an in-process config (tests, embedding); throws listing every problem. */
export function parseHostAgentConfig(input: unknown): HostAgentConfig {
  const parsed = HostAgentConfigSchema.safeParse(input);
  if (!parsed.success) {
    const problems = parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ');
    throw new Error(`invalid host-agent configuration: ${problems}`);
  }
  return parsed.data;
}

function socketFromDockerHost(dockerHost: string | undefined): string | undefined {
  if (dockerHost === undefined || dockerHost === '') return undefined;
  if (!dockerHost.startsWith('unix://')) throw new Error(`DOCKER_HOST must be a unix:// socket for the host agent, got ${dockerHost}`);
  return dockerHost.slice('unix://'.length);
}

/**
 * Read SANDBOXFLEET_* (and DOCKER_HOST) environment variables. `agentSha` falls back to
 * `fallbackAgentSha` (the dev checkout's git SHA, resolved by the caller) when not baked in.
 */
export function loadHostAgentConfig(env: NodeJS.ProcessEnv = process.env, fallbackAgentSha?: string): HostAgentConfig {
  const raw: Record<string, unknown> = {
    hostId: env.SANDBOXFLEET_HOST_ID,
    natsUrl: env.SANDBOXFLEET_NATS_URL,
    dockerSocket: env.SANDBOXFLEET_DOCKER_SOCKET ?? socketFromDockerHost(env.DOCKER_HOST),
    dockerDataRoot: env.SANDBOXFLEET_DOCKER_DATA_ROOT,
    imageRef: env.SANDBOXFLEET_IMAGE_REF ?? env.SANDBOXFLEET_IMAGE,
    imageId: env.SANDBOXFLEET_IMAGE && IMAGE_ID_RE.test(env.SANDBOXFLEET_IMAGE) ? env.SANDBOXFLEET_IMAGE : env.SANDBOXFLEET_IMAGE_ID,
    agentSha: env.SANDBOXFLEET_AGENT_SHA || fallbackAgentSha,
    memberCommand: jsonEnv('SANDBOXFLEET_MEMBER_COMMAND', env.SANDBOXFLEET_MEMBER_COMMAND),
    memberCommands: jsonEnv('SANDBOXFLEET_MEMBER_COMMANDS', env.SANDBOXFLEET_MEMBER_COMMANDS),
    memberNetworkMode: env.SANDBOXFLEET_MEMBER_NETWORK_MODE,
    heartbeatIntervalMs: env.SANDBOXFLEET_HEARTBEAT_INTERVAL_MS,
    maxMembers: env.SANDBOXFLEET_MAX_MEMBERS,
    maxStopGraceMs: env.SANDBOXFLEET_MAX_STOP_GRACE_MS,
    defaultStopGraceMs: env.SANDBOXFLEET_STOP_GRACE_MS,
    engineFailuresForDataLoss: env.SANDBOXFLEET_ENGINE_FAILURES_FOR_DATA_LOSS,
    reclaimNoticeFile: env.SANDBOXFLEET_RECLAIM_NOTICE_FILE,
    shutdownTimeoutMs: env.SANDBOXFLEET_SHUTDOWN_TIMEOUT_MS,
    natsCredsFile: env.SANDBOXFLEET_NATS_CREDS || undefined,
    natsCaFile: env.SANDBOXFLEET_NATS_CA || undefined,
    logLevel: env.LOG_LEVEL,
    leaseEndUnixMs: env.SANDBOXFLEET_LEASE_END_UNIX_MS,
    httpHost: env.SANDBOXFLEET_HTTP_HOST,
    httpPort: env.SANDBOXFLEET_HTTP_PORT,
    layerMaxEntries: env.SANDBOXFLEET_LAYER_MAX_ENTRIES,
    layerMaxBytes: env.SANDBOXFLEET_LAYER_MAX_BYTES,
    layerMaxNameBytesTotal: env.SANDBOXFLEET_LAYER_MAX_NAME_BYTES_TOTAL,
    layerCacheDir: env.SANDBOXFLEET_LAYER_CACHE_DIR,
    layerCacheMaxBytes: env.SANDBOXFLEET_LAYER_CACHE_MAX_BYTES,
    layerManifestVersion: env.SANDBOXFLEET_LAYER_MANIFEST_VERSION,
    layerIndexDir: env.SANDBOXFLEET_LAYER_INDEX_DIR,
    layerFullCaptureEvery: env.SANDBOXFLEET_LAYER_FULL_CAPTURE_EVERY,
    layerRestoreMemoryBytes: env.SANDBOXFLEET_LAYER_RESTORE_MEMORY_BYTES,
  };
  // Empty strings mean "unset" for env vars.
  for (const [k, v] of Object.entries(raw)) if (v === '' || v === undefined) delete raw[k];
  return parseHostAgentConfig(raw);
}

/** How this host authenticates to NATS: its credentials, CA, and its own inbox prefix (R-I2, R-R5). */
export function natsAuthOf(config: Pick<HostAgentConfig, 'hostId' | 'natsCredsFile' | 'natsCaFile'>): NatsAuthOptions {
  return { credsFile: config.natsCredsFile, caFile: config.natsCaFile, inboxPrefix: hostInboxPrefix(config.hostId) };
}

/**
 * What checkpoint and restore need from the configuration (checkpoint-ops.ts): the layer limits and
 * the chunk cache (restore); the manifest version and the capture indexes (checkpoint).
 */
export interface LayerRestoreSettings {
  readonly limits: LayerLimits;
  readonly cacheDir: string;
  /** 0: no cache. */
  readonly cacheMaxBytes: number;
  /** Manifest schema version written (1 or 2); 2 lets checkpoints read only what changed. */
  readonly manifestVersion?: 1 | 2;
  readonly indexDir?: string;
  readonly fullCaptureEvery?: number;
  /** Chunks a restore keeps in memory between its passes (0: none). */
  readonly restoreMemoryBytes?: number;
}

type LayerConfig = Pick<HostAgentConfig, 'layerMaxEntries' | 'layerMaxBytes' | 'layerMaxNameBytesTotal' | 'layerCacheDir' | 'layerCacheMaxBytes'> &
  Partial<Pick<HostAgentConfig, 'layerManifestVersion' | 'layerIndexDir' | 'layerFullCaptureEvery' | 'layerRestoreMemoryBytes'>>;

export function layerRestoreSettingsOf(config: LayerConfig): LayerRestoreSettings {
  return {
    limits: layerLimits({ maxEntries: config.layerMaxEntries, maxLayerBytes: config.layerMaxBytes, maxNameBytesTotal: config.layerMaxNameBytesTotal }),
    cacheDir: config.layerCacheDir,
    cacheMaxBytes: config.layerCacheMaxBytes,
    manifestVersion: (config.layerManifestVersion ?? DEFAULT_LAYER_MANIFEST_VERSION) === 2 ? 2 : 1,
    indexDir: config.layerIndexDir ?? DEFAULT_LAYER_INDEX_DIR,
    fullCaptureEvery: config.layerFullCaptureEvery ?? DEFAULT_LAYER_FULL_CAPTURE_EVERY,
    restoreMemoryBytes: config.layerRestoreMemoryBytes ?? DEFAULT_LAYER_RESTORE_MEMORY_BYTES,
  };
}

/** The settings an agent gets when its configuration is not passed down (every default). */
export const DEFAULT_LAYER_RESTORE_SETTINGS: LayerRestoreSettings = Object.freeze({
  limits: DEFAULT_LAYER_LIMITS,
  cacheDir: DEFAULT_LAYER_CACHE_DIR,
  cacheMaxBytes: DEFAULT_LAYER_CACHE_MAX_BYTES,
  manifestVersion: DEFAULT_LAYER_MANIFEST_VERSION,
  indexDir: DEFAULT_LAYER_INDEX_DIR,
  fullCaptureEvery: DEFAULT_LAYER_FULL_CAPTURE_EVERY,
  restoreMemoryBytes: DEFAULT_LAYER_RESTORE_MEMORY_BYTES,
});
