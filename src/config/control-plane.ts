// Control-plane configuration: one zod schema, parsed once by loadControlPlaneConfig() from cmd/,
// never at import time. Each field says why it exists.
import { z } from 'zod';
import { CODEX_KEEP_REFUSED } from '../core/turn-command.ts';

const port = z.coerce.number().int().min(0).max(65_535);
const durationMs = (min: number, max: number) => z.coerce.number().int().min(min).max(max);
/** A JSON-valued variable: parsed when it parses; otherwise left as the string, which the schema then refuses. */
function parseJsonEnv(v: unknown): unknown {
  if (typeof v !== 'string' || v === '') return v === '' ? undefined : v;
  try {
    return JSON.parse(v) as unknown;
  } catch {
    return v;
  }
}
const cliProfile = z.object({
  binary: z.string().min(1).max(4096).regex(/^[^\0\s]+$/),
  env: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]{0,127}$/), z.string().max(32 * 1024)).refine((e) => Object.keys(e).length <= 64, 'at most 64 variables').default({}),
  args: z.array(z.string().max(4096)).max(32).optional(),
  /** Keep the CLI running between turns (LIVE next turn); default true for Claude Code and Pi. */
  keepProcess: z.boolean().optional(),
}).strict();
/** Comma-separated list from an env var (empty entries dropped). */
const csv = z.preprocess(
  (v) => (typeof v === 'string' ? v.split(',').map((s) => s.trim()).filter((s) => s.length > 0) : v),
  z.array(z.string().min(1).max(128)).max(64),
);

/** An optional file path from env: empty means unset. */
const optionalPath = z.preprocess((v) => (typeof v === 'string' && v.trim() === '' ? undefined : v), z.string().trim().min(1).max(4096).optional());
/** Boolean env flag: 1/true/yes or 0/false/no (case-insensitive); anything else is an error. */
const flag = z.preprocess((v) => {
  if (typeof v !== 'string') return v;
  const t = v.trim().toLowerCase();
  if (t === '') return false;
  if (['1', 'true', 'yes'].includes(t)) return true;
  if (['0', 'false', 'no'].includes(t)) return false;
  return v;
}, z.boolean());

export const ControlPlaneConfigSchema = z.object({
  /** NATS URL of the state store. Empty: launch an embedded local nats-server (dev / `npm start`). */
  natsUrl: z.string().trim().default(''),
  /** Where the embedded nats-server keeps JetStream data, and other local state. */
  stateDir: z.string().min(1).default('.state'),
  /** The control plane's NATS credentials (R-R5): a `.creds` file or an nkey user seed (store/nats-auth.ts). */
  natsCredsFile: optionalPath,
  /** PEM CA of the NATS server certificate; set to require TLS to NATS. */
  natsCaFile: optionalPath,
  /** Replicas for KV buckets and streams: 1 locally, 3 on a production NATS cluster. */
  storeReplicas: z.coerce.number().int().min(1).max(5).default(1),
  /** Health (/healthz, /readyz) and Prometheus (/metrics) listener. 127.0.0.1 unless exposed on purpose. */
  httpHost: z.string().default('127.0.0.1'),
  httpPort: port.default(9464),
  logLevel: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  /** This replica's name in leader election and the event log (defaults to hostname-pid in cmd/). */
  replicaId: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/).optional(),

  // ---- attestation policy (R-H2) ----
  /** Agent build SHAs allowed to run (exact git SHAs). Empty: only the control plane's own build SHA. */
  allowedAgentShas: csv.default([]),
  /** Sandbox image digests (`sha256:…`) hosts may run. Empty: no host becomes READY. */
  allowedImageDigests: csv.default([]),
  /** Writable-layer capture reads overlay upper dirs (overlay2; docs/measured-facts.md). */
  allowedStorageDrivers: csv.default(['overlay2']),

  // ---- heartbeats and liveness (R-H3) ----
  /** Told to agents in RegistrationAck. */
  heartbeatIntervalMs: durationMs(100, 60_000).default(2_000),
  /** Silence that makes a host SUSPECT. */
  heartbeatTtlMs: durationMs(300, 600_000).default(10_000),
  /** Further silence that makes a SUSPECT host DEAD. */
  deadGraceMs: durationMs(0, 3_600_000).default(10_000),
  /** A gap between liveness ticks above this is a control-plane stall: DEAD decisions pause. */
  stallThresholdMs: durationMs(100, 600_000).default(5_000),
  /** How often the leader runs its reconcile loops. */
  reconcileIntervalMs: durationMs(50, 60_000).default(1_000),

  // ---- leases and drain (R-H4, R-H5) ----
  /** Default host term; 0 = no term end unless the agent reports one. */
  leaseTermMs: durationMs(0, 365 * 24 * 3_600_000).default(0),
  /** Drain starts this long before a host's term end. */
  drainMarginMs: durationMs(0, 24 * 3_600_000).default(300_000),
  /** Planned departure: how long to wait for an in-flight turn to end before stopping anyway. */
  turnWaitMs: durationMs(0, 3_600_000).default(60_000),
  /** How long a group may wait for an eligible target host before it is declared LOST. */
  evacuationDeadlineMs: durationMs(1_000, 24 * 3_600_000).default(600_000),

  // ---- groups, checkpoints, migration (R-G2..R-G7) ----
  /** SIGTERM grace for clean stops (R-G2). */
  stopGraceMs: durationMs(100, 600_000).default(10_000),
  /** R-G4: a checkpoint older than this is stale. */
  checkpointMaxAgeMs: durationMs(1_000, 30 * 24 * 3_600_000).default(24 * 3_600_000),
  /**
   * R-G4/R-G6: a group that stays cleanly STOPPED keeps its checkpoint, which would age past the
   * maximum and leave the group LOST `stale_checkpoint` on a host loss. Its checkpoint is retaken
   * (incremental: only the manifest and changed chunks are new) once older than this fraction of
   * `checkpointMaxAgeMs`; 0 turns refreshing off.
   */
  checkpointRefreshFraction: z.coerce.number().min(0).max(0.9).default(0.5),
  /**
   * The newest checkpoint manifest schema version agents are told to write (CheckpointCommand
   * max_manifest_schema_version). 2 (default): a checkpoint reuses the chunks of unchanged files
   * without reading them (its layer digests hash the chunk list); 1: every checkpoint reads and
   * hashes the whole layer. Set 1 before rolling back to a release that verifies version 1 only.
   */
  checkpointManifestVersion: z.coerce.number().int().min(1).max(2).default(2),
  /** Checkpoint refreshes started per retention pass (each reads its group's layers on the host). */
  checkpointRefreshPerPass: z.coerce.number().int().min(1).max(64).default(4),
  /** R-G7: valid checkpoints kept per group. */
  checkpointKeep: z.coerce.number().int().min(1).max(100).default(2),
  /**
   * How long a LOST group's containers (and checkpoints) are kept for an operator to examine or
   * recover by hand before they are deleted (R-R6); 0 = until an operator destroys the group.
   */
  lostRetentionMs: durationMs(0, 366 * 24 * 3_600_000).default(7 * 24 * 3_600_000),
  /**
   * Safety-net resync: every key of the reconcile queues is looked at again this often even when no
   * change announced it (controller-runtime's resync period). Changes, not this, drive the loops.
   */
  resyncIntervalMs: durationMs(10_000, 24 * 3_600_000).default(10 * 60_000),
  /**
   * How the fleet runs each CLI's turns itself (RunTurn, R-I9): per CLI kind, the binary inside the
   * member container, extra environment (e.g. the model gateway's base URL), fixed arguments, and
   * whether its process is kept between turns (keepProcess, default true: LIVE turns; false: one
   * process per turn, RESTORED every turn after the first, no idle CLI holding memory).
   * Codex runs one `codex exec` process per turn: its keepProcess: true is refused.
   * JSON in SANDBOXFLEET_CLI_PROFILES, e.g. {"claude_code":{"binary":"/opt/claude/claude","env":{}}}.
   */
  cliProfiles: z.preprocess(parseJsonEnv, z.object({
    claude_code: cliProfile.optional(),
    pi: cliProfile.optional(),
    codex: cliProfile.refine((p) => p.keepProcess !== true, { message: CODEX_KEEP_REFUSED, path: ['keepProcess'] }).optional(),
  }).strict()).default({ claude_code: { binary: 'claude', env: {} }, pi: { binary: 'pi', env: {} }, codex: { binary: 'codex', env: {} } }),
  /**
   * The longest a turn run by the fleet (RunTurn) may stay in flight: past it, a turn whose driver
   * went away (its replica restarted) is completed as not ended instead of blocking the member.
   */
  runTurnMaxMs: durationMs(60_000, 48 * 3_600_000).default(2 * 3_600_000),
  /**
   * Idle auto-stop (R-G2, R-G3, R-G6): a RUNNING group with no turn in flight, every member's last
   * process exit confirmed and no activity for this long is stopped cleanly and checkpointed, so it
   * survives the loss of its host (a running group does not). 0 = right after every completed turn,
   * on the turn's path: CompleteTurn (and RunTurn's end) answers only once the group is stopped and
   * checkpointed; `never` turns it off. A group's own OpenGroup setting wins.
   */
  idleStopAfterMs: z.preprocess((v) => (typeof v === 'string' && v.trim().toLowerCase() === 'never' ? 'never' : v), z.union([z.literal('never'), durationMs(0, 7 * 24 * 3_600_000)])).default(600_000),
  /** A group started with no turn completed since is not idle-stopped before this (its turn must begin). */
  idleStopStartGraceMs: durationMs(0, 3_600_000).default(30_000),
  /** Idle stops (stop + checkpoint) run at once. */
  idleStopParallelism: z.coerce.number().int().min(1).max(64).default(4),
  /** Idle stops started per second at most (the rest wait their turn): stops and checkpoints load the hosts. */
  idleStopsPerSecond: z.coerce.number().min(0.01).max(1_000).default(10),
  /** Unprotected groups (running, or stopped without a clean stop and checkpoint) older than this are counted apart for the alert. */
  unprotectedAlertAfterMs: durationMs(60_000, 30 * 24 * 3_600_000).default(3_600_000),
  /**
   * Spot/preemption notice (R-H5): the time the provider gives when the notice does not say. Running
   * groups are stopped cleanly and checkpointed off the host first (least recently active first),
   * restores follow; the host's summary event says how many made it before this deadline.
   */
  spotNoticeMs: durationMs(1_000, 3_600_000).default(30_000),
  /**
   * Spot evacuation: clean stops + checkpoints run at once on a noticed host. Few: captures share the
   * host's CPU, so many at once all finish late (bench/survival: 100 groups × 20 MiB at load 10-17 on
   * 2 cores, 60 checkpointed within a 30 s notice at 4, 6 at 16) and the ones cut off by the deadline
   * are wasted work.
   */
  spotEvacuationParallelism: z.coerce.number().int().min(1).max(256).default(4),
  /** R-G5: restore attempts (each on another host) before LOST restore_failed. */
  restoreMaxAttempts: z.coerce.number().int().min(1).max(10).default(3),
  /** Groups migrated at once (bounded parallelism). */
  migrationParallelism: z.coerce.number().int().min(1).max(64).default(4),
  /** Deadline of one agent command (checkpoint/restore of large layers take longest). */
  agentCommandTimeoutMs: durationMs(500, 3_600_000).default(120_000),
  /** Leader lease renewal period; the lease expires server-side (leadership bucket TTL). */
  leaderRenewMs: durationMs(100, 10_000).default(3_000),

  // ---- gRPC API (R-I1, R-R5) ----
  /** gRPC listen host. Loopback unless exposed on purpose (the chart sets 0.0.0.0 with mTLS). */
  grpcHost: z.string().trim().min(1).max(253).default('127.0.0.1'),
  /** gRPC port (the chart's controlPlane.grpcPort, 7443); 0 picks a free one (tests). */
  grpcPort: port.default(7443),
  /** PEM files of the server certificate chain and key. */
  tlsCertFile: optionalPath,
  tlsKeyFile: optionalPath,
  /**
   * CAs of client certificates (R-R5). When both are set and differ, the CA that signed a client
   * certificate decides its role (runner CA → runner, admin CA → admin) and a role the certificate
   * names itself (SPIFFE URI SAN / OU) must agree; when they are the same file (or only one is
   * set) the certificate's SAN/OU role decides.
   */
  tlsRunnerCaFile: optionalPath,
  tlsAdminCaFile: optionalPath,
  /** Plaintext gRPC without client authentication: loopback local dev only (`npm start`). */
  grpcInsecure: flag.default(false),
  /** R-H7: how long `verify` waits for one host's reverse probe by default. */
  verifyProbeTimeoutMs: durationMs(100, 60_000).default(5_000),
  /**
   * R-H5/R-I6 Kubernetes Node watch: `off`, `in-cluster` (the pod's service account; the chart's
   * setting), or the absolute path of a kubeconfig file. A deleted, cordoned, autoscaler-tainted
   * or spot-noticed Node drains the host of the same name.
   */
  /**
   * R-I6 leader election: `nats-kv` (default; works anywhere), or `kubernetes-lease` in-cluster
   * (the chart's setting: a coordination.k8s.io Lease, `leaseName` in `leaseNamespace`).
   */
  leaderElection: z.enum(['nats-kv', 'kubernetes-lease']).default('nats-kv'),
  leaseName: z.string().regex(/^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/).default('sandbox-fleet-leader'),
  leaseNamespace: z.string().regex(/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/).default('default'),
  leaseDurationSeconds: z.coerce.number().int().min(2).max(300).default(15),
  kubernetesNodes: z.union([z.literal('off'), z.literal('in-cluster'), z.string().regex(/^\/.+/, 'an absolute kubeconfig path')]).default('off'),
});

export type ControlPlaneConfig = z.infer<typeof ControlPlaneConfigSchema>;

/** Reads SANDBOXFLEET_* environment variables; a bad value fails start-up with every problem listed. */
export function loadControlPlaneConfig(env: NodeJS.ProcessEnv = process.env): ControlPlaneConfig {
  const parsed = ControlPlaneConfigSchema.safeParse({
    natsUrl: env.SANDBOXFLEET_NATS_URL,
    natsCredsFile: env.SANDBOXFLEET_NATS_CREDS,
    natsCaFile: env.SANDBOXFLEET_NATS_CA,
    stateDir: env.SANDBOXFLEET_STATE_DIR,
    storeReplicas: env.SANDBOXFLEET_STORE_REPLICAS,
    httpHost: env.SANDBOXFLEET_HTTP_HOST,
    httpPort: env.SANDBOXFLEET_HTTP_PORT,
    logLevel: env.LOG_LEVEL,
    // In a pod, the pod name (unique per pod): a restarted pod never inherits leadership.
    replicaId: env.SANDBOXFLEET_REPLICA_ID ?? env.SANDBOXFLEET_POD_NAME,
    allowedAgentShas: env.SANDBOXFLEET_ALLOWED_AGENT_SHAS,
    allowedImageDigests: env.SANDBOXFLEET_ALLOWED_IMAGE_DIGESTS,
    allowedStorageDrivers: env.SANDBOXFLEET_ALLOWED_STORAGE_DRIVERS,
    heartbeatIntervalMs: env.SANDBOXFLEET_HEARTBEAT_INTERVAL_MS,
    heartbeatTtlMs: env.SANDBOXFLEET_HEARTBEAT_TTL_MS,
    deadGraceMs: env.SANDBOXFLEET_DEAD_GRACE_MS,
    stallThresholdMs: env.SANDBOXFLEET_STALL_THRESHOLD_MS,
    reconcileIntervalMs: env.SANDBOXFLEET_RECONCILE_INTERVAL_MS,
    leaseTermMs: env.SANDBOXFLEET_LEASE_TERM_MS,
    drainMarginMs: env.SANDBOXFLEET_DRAIN_MARGIN_MS,
    turnWaitMs: env.SANDBOXFLEET_TURN_WAIT_MS,
    evacuationDeadlineMs: env.SANDBOXFLEET_EVACUATION_DEADLINE_MS,
    stopGraceMs: env.SANDBOXFLEET_STOP_GRACE_MS,
    checkpointMaxAgeMs: env.SANDBOXFLEET_CHECKPOINT_MAX_AGE_MS,
    checkpointRefreshFraction: env.SANDBOXFLEET_CHECKPOINT_REFRESH_FRACTION,
    checkpointRefreshPerPass: env.SANDBOXFLEET_CHECKPOINT_REFRESH_PER_PASS,
    checkpointManifestVersion: env.SANDBOXFLEET_CHECKPOINT_MANIFEST_VERSION,
    checkpointKeep: env.SANDBOXFLEET_CHECKPOINT_KEEP,
    lostRetentionMs: env.SANDBOXFLEET_LOST_RETENTION_MS,
    cliProfiles: env.SANDBOXFLEET_CLI_PROFILES,
    runTurnMaxMs: env.SANDBOXFLEET_RUN_TURN_MAX_MS,
    resyncIntervalMs: env.SANDBOXFLEET_RESYNC_INTERVAL_MS,
    restoreMaxAttempts: env.SANDBOXFLEET_RESTORE_MAX_ATTEMPTS,
    idleStopAfterMs: env.SANDBOXFLEET_IDLE_STOP_AFTER_MS,
    idleStopStartGraceMs: env.SANDBOXFLEET_IDLE_STOP_START_GRACE_MS,
    idleStopParallelism: env.SANDBOXFLEET_IDLE_STOP_PARALLELISM,
    idleStopsPerSecond: env.SANDBOXFLEET_IDLE_STOPS_PER_SECOND,
    unprotectedAlertAfterMs: env.SANDBOXFLEET_UNPROTECTED_ALERT_AFTER_MS,
    spotNoticeMs: env.SANDBOXFLEET_SPOT_NOTICE_MS,
    spotEvacuationParallelism: env.SANDBOXFLEET_SPOT_EVACUATION_PARALLELISM,
    migrationParallelism: env.SANDBOXFLEET_MIGRATION_PARALLELISM,
    agentCommandTimeoutMs: env.SANDBOXFLEET_AGENT_COMMAND_TIMEOUT_MS,
    leaderRenewMs: env.SANDBOXFLEET_LEADER_RENEW_MS,
    grpcHost: env.SANDBOXFLEET_GRPC_HOST,
    grpcPort: env.SANDBOXFLEET_GRPC_PORT,
    tlsCertFile: env.SANDBOXFLEET_TLS_CERT_FILE,
    tlsKeyFile: env.SANDBOXFLEET_TLS_KEY_FILE,
    tlsRunnerCaFile: env.SANDBOXFLEET_TLS_RUNNER_CA_FILE,
    tlsAdminCaFile: env.SANDBOXFLEET_TLS_ADMIN_CA_FILE,
    grpcInsecure: env.SANDBOXFLEET_GRPC_INSECURE,
    verifyProbeTimeoutMs: env.SANDBOXFLEET_VERIFY_PROBE_TIMEOUT_MS,
    kubernetesNodes: env.SANDBOXFLEET_KUBERNETES_NODES,
    leaderElection: env.SANDBOXFLEET_LEADER_ELECTION,
    leaseName: env.SANDBOXFLEET_LEASE_NAME,
    leaseNamespace: env.SANDBOXFLEET_LEASE_NAMESPACE,
    leaseDurationSeconds: env.SANDBOXFLEET_LEASE_DURATION_SECONDS,
  });
  if (!parsed.success) {
    const problems = parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ');
    throw new Error(`invalid control-plane configuration: ${problems}`);
  }
  if (parsed.data.heartbeatTtlMs <= parsed.data.heartbeatIntervalMs) {
    throw new Error('invalid control-plane configuration: heartbeatTtlMs must exceed heartbeatIntervalMs');
  }
  return parsed.data;
}

/** True for addresses only this machine can reach (R-R5: the one place plaintext is tolerated). */
export function isLoopbackHost(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '');
  return h === 'localhost' || h === '::1' || /^127(?:\.\d{1,3}){3}$/.test(h);
}

/**
 * R-R5: the gRPC transport must be mTLS (server cert + key + at least one client CA), or
 * explicitly insecure on a loopback host. cmd/control-plane checks this before serving (kept out of
 * loadControlPlaneConfig so tools that only read the other settings need no TLS material). Anything in between refuses to start: a control plane
 * that silently served plaintext, or served TLS without client authentication, would be worse
 * than one that does not start.
 */
export function grpcSecurityProblem(c: ControlPlaneConfig): string | undefined {
  const tlsParts = [c.tlsCertFile, c.tlsKeyFile, c.tlsRunnerCaFile, c.tlsAdminCaFile].filter((p) => p !== undefined).length;
  if (c.grpcInsecure) {
    if (tlsParts > 0) return 'SANDBOXFLEET_GRPC_INSECURE is set together with SANDBOXFLEET_TLS_* files: choose one';
    if (!isLoopbackHost(c.grpcHost)) return `SANDBOXFLEET_GRPC_INSECURE is allowed only on a loopback SANDBOXFLEET_GRPC_HOST, not ${c.grpcHost}`;
    return undefined;
  }
  if (c.tlsCertFile === undefined || c.tlsKeyFile === undefined) {
    return 'gRPC needs mTLS: set SANDBOXFLEET_TLS_CERT_FILE and SANDBOXFLEET_TLS_KEY_FILE (and a client CA), or SANDBOXFLEET_GRPC_INSECURE=1 with a loopback SANDBOXFLEET_GRPC_HOST for local dev';
  }
  if (c.tlsRunnerCaFile === undefined && c.tlsAdminCaFile === undefined) {
    return 'gRPC mTLS needs a client CA: set SANDBOXFLEET_TLS_RUNNER_CA_FILE and/or SANDBOXFLEET_TLS_ADMIN_CA_FILE';
  }
  return undefined;
}
