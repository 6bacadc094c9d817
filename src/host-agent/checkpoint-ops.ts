// Checkpoint and restore of a group's writable layers (R-G3, R-G4, R-G5).
// Checkpoint: only after a clean stop (evidence re-judged by core, never the flag alone), only while
// every member container is stopped and not restarted since; each member's upper dir is captured
// layer-only into the chunk store (streamed, chunked and hashed while streaming; with version-2
// manifests only the files changed since this container's last checkpoint on this host are read,
// layer/capture-store.ts, the index of what was read kept in layer/capture-index.ts), and the
// manifest is written LAST — a checkpoint exists only once its manifest does; the capture indexes
// are saved only after it. A retried command finds the manifest and answers it again instead of
// capturing twice.
// Restore: validate the manifest, check it fits this host (same base image id, same proven bridge
// version), check it is the stored one; then VALIDATE every member's layer (one streaming pass per
// layer: every chunk digest, the whole-layer digest and every tar header against the configured
// limits, on a worker thread, nothing written but the host's chunk cache) before any container is
// created; only then recreate each member from the same image id with its layer extracted into the
// new container's upper dir BEFORE any start, and prove the native session files (cold-start check).
// Anything less removes what was created and reports why: a refused layer is REFUSED with its data
// reason (wire/agent-protocol.ts LayerDataReason: no host can restore it), a failure of this host is
// FAILED with its own reason (layer/errors.ts restoreFailureOf).
import { createHash } from 'node:crypto';
import { basename, dirname } from 'node:path';
import { decideStopCleanliness } from '../core/clean-stop.ts';
import {
  ManifestError,
  checkManifestCompatible,
  layerDigestKind,
  serializeCheckpointManifest,
  type CheckpointManifest as CoreManifest,
  type CheckpointMember,
  type ManifestSchemaVersion,
} from '../core/checkpoint-manifest.ts';
import { LayerRuleError } from '../core/layer-rules.ts';
import type { ContainerInfo, DockerRuntime } from '../docker/runtime.ts';
import type { CheckpointCommand, CheckpointManifest, RestoreCommand, RestoredMember } from '../gen/sandboxfleet/v1/agent.ts';
import type { Logger } from '../observability/logger.ts';
import type { FleetMetrics } from '../observability/metrics.ts';
import { ChunkStoreError, type ChunkStore } from '../store/chunk-store.ts';
import type { WorkerConnection } from '../store/nats-auth.ts';
import { CommandError, failed, refused } from './command-error.ts';
import { DEFAULT_LAYER_RESTORE_SETTINGS, type LayerRestoreSettings } from './config.ts';
import type { GroupOps } from './group-ops.ts';
import { CaptureIndexStore, type CaptureIndex } from './layer/capture-index.ts';
import { ChunkCache } from './layer/chunk-cache.ts';
import { restoreFailureOf } from './layer/errors.ts';
import { RetainBudget, extractVerifiedLayer, storeLayer, verifyLayer, type FetchLayerOptions, type VerifiedLayer } from './layer/layer-transfer.ts';
import { removeStaleStaging, type EarlyStaging } from './layer/restore.ts';
import { coreCleanStop, fromWireManifest, toWireManifest } from '../wire/checkpoint-manifest.ts';
import { proveSessionFiles, type SessionFileProblem } from './session-proof.ts';
import { discoverSessionFiles } from './session-discovery.ts';
import { NATIVE_SESSION_LAYOUTS, SESSION_HOMES } from '../core/native-session-layout.ts';
import { CLI_KINDS, type CliKind } from '../core/turn-end-evidence.ts';
import { isoToMs } from './wire.ts';
import { cliKindName, coreCliKind } from '../wire/cli-kind.ts';

export interface CheckpointOpsDeps {
  readonly runtime: DockerRuntime;
  readonly store: ChunkStore;
  readonly groups: GroupOps;
  readonly metrics: FleetMetrics;
  readonly hostId: string;
  readonly epoch: () => number;
  readonly imageId: () => string;
  readonly imageRef: string;
  /** The live-bridge version this host proved at attestation; undefined when unproven. */
  readonly bridgeVersion: () => number | undefined;
  readonly nowMs: () => number;
  /** Where the chunk publish/fetch worker threads connect (their own connections); none = inline. */
  readonly workerConnection?: WorkerConnection | undefined;
  readonly logger?: Logger | undefined;
  /** Layer limits, chunk cache, manifest version and capture indexes (config.ts layerRestoreSettingsOf); default: every config default. */
  readonly layerRestore?: LayerRestoreSettings | undefined;
}

export interface RestoreOutcome {
  readonly members: RestoredMember[];
  readonly problems: readonly (SessionFileProblem & { memberId: string })[];
  /** Every member's session files are proven; false means the created containers were removed. */
  readonly verified: boolean;
}

/** A failed restore step as the command's answer: REFUSED for the layer's fault, FAILED for this host's. */
function restoreError(memberId: string | undefined, err: unknown): CommandError {
  if (err instanceof CommandError) return err;
  const f = restoreFailureOf(err);
  const message = memberId === undefined ? `restore: ${f.message}` : `restore of member ${memberId}: ${f.message}`;
  return f.layerRefusal ? refused(f.reason, message) : failed(f.reason, message, err);
}

function sameManifest(a: CoreManifest, b: CoreManifest): boolean {
  return Buffer.from(serializeCheckpointManifest(a)).equals(Buffer.from(serializeCheckpointManifest(b)));
}

export class CheckpointOps {
  private cache: Promise<ChunkCache | undefined> | undefined;
  private readonly indexes: CaptureIndexStore;
  /** Restores' background cache writes of the chunks they kept in memory (VerifiedLayer.release). */
  private readonly cacheFills = new Set<Promise<void>>();
  /** Bytes those writes still hold in memory, over all restores: at most one restore budget. */
  private fillBytes = 0;
  /**
   * Where a restore extracts while its container is being created: the engine's overlay2 root,
   * learned from the first upper dir this process sees (stale staging dirs of this host removed
   * first). Until then, or when that failed, extraction waits for the container.
   */
  private earlyStaging: Promise<EarlyStaging | undefined> | undefined;
  /** The same once its stale dirs are gone (restores do not wait for that); undefined after EXDEV. */
  private stagingReady: EarlyStaging | undefined;

  constructor(private readonly deps: CheckpointOpsDeps) {
    this.indexes = new CaptureIndexStore(this.layerRestore.indexDir ?? DEFAULT_LAYER_RESTORE_SETTINGS.indexDir!);
  }

  /** The newest manifest version this agent writes (its setting; a command may ask for older). */
  private get manifestVersion(): ManifestSchemaVersion {
    return this.layerRestore.manifestVersion ?? DEFAULT_LAYER_RESTORE_SETTINGS.manifestVersion ?? 2;
  }

  private get layerRestore(): LayerRestoreSettings {
    return this.deps.layerRestore ?? DEFAULT_LAYER_RESTORE_SETTINGS;
  }

  /** Resolves when the chunk cache writes of the restores answered so far are done (tests). */
  async cacheFilled(): Promise<void> {
    await Promise.all([...this.cacheFills]);
  }

  /** Where restores extract while creating the container; undefined until learned (tests). */
  async stagingParent(): Promise<string | undefined> {
    return (await this.earlyStaging)?.parent;
  }

  /** Learn the overlay2 root from a container's upper dir (`<root>/overlay2/<layer id>/diff`), once. */
  private learnStaging(upper: string): void {
    const parent = dirname(dirname(upper));
    if (this.earlyStaging !== undefined || basename(upper) !== 'diff' || basename(parent) !== 'overlay2') return;
    // Host ids are DNS names; a long one is shortened so that every staging name fits NAME_MAX.
    const hostId = this.deps.hostId;
    const id = /^[a-z0-9.-]{1,64}$/.test(hostId) ? hostId : createHash('sha256').update(hostId).digest('hex').slice(0, 16);
    const early: EarlyStaging = {
      parent,
      prefix: `.sf-restore-${id}-`,
      crossDevice: () => {
        if (this.stagingReady === undefined) return;
        this.stagingReady = undefined;
        this.deps.logger?.warn({ parent }, 'a staging dir in the overlay2 root cannot be renamed into a container (project quotas?); restores extract after creating the container');
      },
    };
    this.earlyStaging = removeStaleStaging(early).then(
      (removed) => {
        if (removed.length > 0) this.deps.logger?.info({ removed, parent }, 'removed staging dirs of restores interrupted earlier');
        this.stagingReady = early;
        return early;
      },
      (err: unknown) => {
        this.deps.logger?.warn({ err, parent: early.parent }, 'overlay2 root unusable for early extraction; restores extract after creating the container');
        return undefined;
      },
    );
  }

  /** The host's chunk cache, opened once; none when disabled or when its directory is unusable. */
  private chunkCache(): Promise<ChunkCache | undefined> {
    const { cacheDir, cacheMaxBytes } = this.layerRestore;
    if (cacheMaxBytes === 0) return Promise.resolve(undefined);
    this.cache ??= ChunkCache.open({ dir: cacheDir, maxBytes: cacheMaxBytes }).catch((err: unknown) => {
      // A restore without the cache still works (its extraction pass fetches the layer again).
      this.deps.logger?.warn({ err, cacheDir }, 'chunk cache unusable; restores fetch every layer twice');
      this.cache = undefined; // try again next time
      return undefined;
    });
    return this.cache;
  }

  async checkpoint(cmd: CheckpointCommand, generation: number, deadlineUnixMs = 0): Promise<CheckpointManifest> {
    const { runtime, store } = this.deps;
    const cs = cmd.cleanStop;
    if (cs === undefined) throw refused('unclean_stop', 'checkpoint command carries no clean-stop evidence');
    const containers = await this.deps.groups.membersAt(cmd.groupId, generation);
    if (containers.size === 0) throw refused('group_not_found', `no containers of group ${cmd.groupId} at generation ${generation}`);
    const specIds = cmd.members.map((m) => m.memberId);
    if (specIds.length !== containers.size || !specIds.every((id) => containers.has(id))) {
      throw refused('member_mismatch', `command names members [${specIds.join(', ')}], host has [${[...containers.keys()].join(', ')}]`);
    }
    // R-G2 re-judged from the evidence: a clean flag alone is not enough.
    const verdict = decideStopCleanliness({
      graceMs: cs.graceMs,
      memberIds: specIds,
      members: cs.members.map((e) => ({
        memberId: e.memberId,
        turnInFlight: e.turnInFlight || !cs.noTurnInFlight,
        sigtermAtMs: e.sigtermAtUnixMs || undefined,
        exitedAtMs: e.exitedAtUnixMs || undefined,
        exitCode: e.exitCode,
        killed: e.killed || !e.exitedByItself,
        containerExists: e.containerPresent,
        writableLayerExists: e.writableLayerPresent,
      })),
    });
    if (!verdict.clean) {
      throw refused('unclean_stop', `stop was not clean: ${verdict.findings.map((f) => `${f.memberId}:${f.reason}`).join(', ')}`);
    }
    const bridge = this.deps.bridgeVersion();
    if (bridge === undefined) throw refused('bridge_unproven', 'this host has no proven live-bridge version');
    for (const [memberId, c] of containers) this.assertFrozen(memberId, c, cs.stoppedAtUnixMs);

    const sourceContainerIds = new Map([...containers].map(([id, c]) => [id, c.id]));
    const extras = (entryCounts: ReadonlyMap<string, number>) => ({
      baseImageRef: this.deps.imageRef,
      activityVersion: cmd.activityVersion,
      lastCompletedTurnId: cmd.lastCompletedTurnId,
      cleanStop: cs,
      sourceContainerIds,
      entryCounts,
    });
    // Idempotent retry: the manifest is written last, so its presence means the checkpoint is complete.
    const existing = await store.getManifest(this.deps.hostId, cmd.groupId, cmd.checkpointId).catch((err: unknown) => {
      if (err instanceof ChunkStoreError && err.reason === 'manifest_missing') return undefined;
      throw failed('transfer_failed', `reading the existing manifest: ${(err as Error).message}`, err);
    });
    if (existing !== undefined) {
      if (existing.placementGeneration !== generation || existing.source.hostId !== this.deps.hostId) {
        throw refused('checkpoint_exists', `checkpoint ${cmd.checkpointId} already exists for another placement`);
      }
      return toWireManifest(existing, extras(new Map()));
    }

    const started = this.deps.nowMs();
    const members: CheckpointMember[] = [];
    const entryCounts = new Map<string, number>();
    // Verify before emitting (R-G3 "freeze → verify → emit"): every member's native session is in
    // its layer, found by its CLI's layout and proven to carry the saved locator; otherwise the
    // checkpoint could never restore the session, so none is made.
    const prepared = [];
    for (const spec of cmd.members) {
      const c = containers.get(spec.memberId)!;
      const kind = cliKindName(spec.kind);
      const core = coreCliKind(spec.kind);
      if (kind === undefined || core === undefined) throw refused('invalid_argument', `member ${spec.memberId}: unknown CLI kind ${spec.kind}`);
      if (c.member?.cliKind !== kind) throw refused('member_mismatch', `member ${spec.memberId} runs ${c.member?.cliKind}, command says ${kind}`);
      const upper = await runtime.upperDir(c.id);
      this.learnStaging(upper);
      prepared.push({ spec, kind, upper, sessionPaths: await this.#sessionFiles(spec.memberId, core, spec.savedLocator, spec.nativeSessionPaths, upper) });
    }
    // No newer than the control plane that asked verifies (0: one older than the field, version 1).
    const version: ManifestSchemaVersion = Math.min(this.manifestVersion, cmd.maxManifestSchemaVersion || 1) === 2 ? 2 : 1;
    const indexes: { memberId: string; index: CaptureIndex }[] = [];
    for (const { spec, kind, upper, sessionPaths } of prepared) {
      const t0 = this.deps.nowMs();
      const containerId = containers.get(spec.memberId)!.id;
      // What this container's last checkpoint on this host read (a hint: none means a full read).
      const previous = version === 2 ? await this.indexes.load(cmd.groupId, spec.memberId, containerId) : undefined;
      const stored = await storeLayer(upper, store, {
        schemaVersion: version,
        previous,
        containerId,
        fullCaptureEvery: this.layerRestore.fullCaptureEvery,
        ...(this.deps.workerConnection ? { publishWorker: this.deps.workerConnection } : {}),
      }).catch((err: unknown) => {
        throw failed(err instanceof LayerRuleError ? 'layer_refused' : 'capture_failed', `capture of member ${spec.memberId}: ${(err as Error).message}`, err);
      });
      if (version === 2) indexes.push({ memberId: spec.memberId, index: stored.index });
      this.deps.logger?.info({ groupId: cmd.groupId, memberId: spec.memberId, ...stored.capture, storedBytes: stored.stats.storedBytes, layerBytes: stored.stats.bytes }, 'member layer captured');
      this.deps.metrics.checkpointDuration.observe({ phase: 'capture' }, (this.deps.nowMs() - t0) / 1000);
      this.deps.metrics.checkpointBytes.inc({ kind: 'layer' }, stored.stats.bytes);
      this.deps.metrics.checkpointBytes.inc({ kind: 'stored' }, stored.stats.storedBytes);
      this.deps.metrics.checkpointBytes.inc({ kind: 'reused_unread' }, stored.capture.reusedBytes);
      this.deps.metrics.layerCaptures.inc({ mode: stored.capture.mode, why: stored.capture.why });
      entryCounts.set(spec.memberId, stored.entries);
      members.push({
        memberId: spec.memberId,
        cliKind: kind,
        savedLocator: spec.savedLocator === '' ? null : spec.savedLocator,
        nativeSessionPaths: sessionPaths,
        layer: stored.layer,
      });
    }
    // The layers were captured from stopped containers; one restarted meanwhile would make them torn.
    const after = await this.deps.groups.membersAt(cmd.groupId, generation);
    for (const [memberId, c] of containers) {
      const now = after.get(memberId);
      if (now === undefined || now.id !== c.id) throw failed('state_changed', `member ${memberId} disappeared during the checkpoint`);
      this.assertFrozen(memberId, now, cs.stoppedAtUnixMs);
    }
    const manifest: CoreManifest = {
      schemaVersion: version,
      checkpointId: cmd.checkpointId,
      groupId: cmd.groupId,
      placementGeneration: generation,
      source: { hostId: this.deps.hostId, epoch: this.deps.epoch() },
      createdAtMs: this.deps.nowMs(),
      cleanStop: coreCleanStop(cs, cmd.activityVersion),
      members,
      baseImageDigest: this.deps.imageId(),
      bridgeVersion: String(bridge),
    };
    // No manifest after the command's deadline: the control plane has given up on this checkpoint by
    // then, and its chunk garbage collection relies on no checkpoint appearing after its deadline
    // (control-plane/chunk-gc-locks.ts). The chunks already stored are swept like any unreferenced ones.
    if (deadlineUnixMs > 0 && this.deps.nowMs() > deadlineUnixMs) throw refused('deadline_exceeded', 'the checkpoint finished after its command deadline; no manifest written');
    try {
      await store.putManifest(manifest); // LAST (R-G3)
    } catch (err) {
      if (err instanceof ManifestError) throw refused(err.reason, err.message);
      throw failed('manifest_write_failed', `writing the manifest: ${(err as Error).message}`, err);
    }
    // Only now may the next capture rely on these layers: their chunks are named by a manifest.
    for (const { memberId, index } of indexes) {
      await this.indexes.save(cmd.groupId, memberId, index, this.deps.nowMs()).catch((err: unknown) => {
        this.deps.logger?.warn({ err, groupId: cmd.groupId, memberId }, 'capture index not saved; the next checkpoint reads the whole layer');
      });
    }
    this.deps.metrics.checkpointDuration.observe({ phase: 'checkpoint' }, (this.deps.nowMs() - started) / 1000);
    return toWireManifest(manifest, extras(entryCounts));
  }

  /** A member must be stopped and not started again since the clean stop the checkpoint relies on. */
  private assertFrozen(memberId: string, c: ContainerInfo, stoppedAtMs: number): void {
    if (c.running || c.status === 'restarting' || c.status === 'paused') throw refused('group_running', `member ${memberId} is ${c.status}`);
    const startedAt = isoToMs(c.startedAt);
    if (startedAt !== undefined && startedAt > stoppedAtMs) throw refused('state_changed', `member ${memberId} was started after the clean stop`);
  }

  /**
   * A member's native session files for the manifest: those the command names plus those its CLI's
   * layout finds in the layer, each proven to exist (regular file, no symlink) and to carry the saved
   * locator. A member without a saved locator has no session yet. Refused `session_files_missing`
   * when a proof fails, or when a verified layout finds nothing (core/native-session-layout.ts).
   */
  async #sessionFiles(memberId: string, kind: CliKind, savedLocator: string, named: readonly string[], upper: string): Promise<string[]> {
    // No saved locator: the member never completed a turn, so there is no session to find (named
    // files must still exist).
    const locator = savedLocator === '' ? null : savedLocator;
    const found = locator === null ? [] : await discoverSessionFiles(upper, kind, locator);
    const paths = [...new Set([...named, ...found])].sort();
    if (locator !== null && paths.length === 0) {
      const layout = NATIVE_SESSION_LAYOUTS[kind];
      if (layout.enforced) {
        throw refused('session_files_missing', `member ${memberId}: no ${kind} session file for locator ${locator} under ${SESSION_HOMES.join(', ')} (${layout.root}) in its writable layer`);
      }
      this.deps.logger?.warn({ memberId, cli: kind }, 'no native session file found for an unverified CLI layout; the checkpoint cannot prove this session');
      return [];
    }
    const problems = await proveSessionFiles(upper, paths, locator);
    if (problems.length > 0) {
      throw refused('session_files_missing', `member ${memberId}: ${problems.map((p) => `${p.path} ${p.problem}`).join(', ')}`.slice(0, 1024));
    }
    return paths;
  }

  async restore(cmd: RestoreCommand, generation: number): Promise<RestoreOutcome> {
    const { runtime, store } = this.deps;
    if (cmd.manifest === undefined) throw refused('manifest_invalid', 'restore command carries no manifest');
    let manifest: CoreManifest;
    try {
      manifest = fromWireManifest(cmd.manifest);
    } catch (err) {
      if (err instanceof ManifestError) throw refused(err.reason, err.message);
      throw err;
    }
    if (manifest.groupId !== cmd.groupId) throw refused('manifest_invalid', `manifest is for group ${manifest.groupId}, command for ${cmd.groupId}`);
    // R-G4/R-G5: the exact base image and the same proven bridge version, or nothing.
    const bridge = this.deps.bridgeVersion();
    const fit = checkManifestCompatible(manifest, { baseImageDigest: this.deps.imageId(), bridgeVersion: bridge === undefined ? '(unproven)' : String(bridge) });
    if (!fit.ok) throw refused(fit.reason, fit.detail);
    // The manifest must be the one that makes the checkpoint exist, not a look-alike.
    const stored = await store.getManifest(manifest.source.hostId, manifest.groupId, manifest.checkpointId).catch((err: unknown) => {
      if (err instanceof ChunkStoreError && err.reason === 'manifest_missing') throw refused('no_checkpoint', err.message);
      if (err instanceof ManifestError) throw refused('checkpoint_corrupt', `stored manifest: ${err.message}`);
      throw failed('transfer_failed', `reading the stored manifest: ${(err as Error).message}`, err);
    });
    if (!sameManifest(stored, manifest)) throw refused('checkpoint_mismatch', `manifest differs from the stored checkpoint ${manifest.checkpointId}`);

    // A retry after an agent crash may find containers of this generation: reuse none of them
    // unless they never started (then they are ours, half-made: remove and redo).
    const leftovers = await this.deps.groups.membersAt(cmd.groupId, generation);
    for (const [memberId, c] of leftovers) {
      if (c.startedAt !== undefined) throw refused('restore_target_in_use', `member ${memberId} at generation ${generation} already ran`);
    }
    for (const c of leftovers.values()) await runtime.remove(c.id, { force: true });
    await this.deps.groups.assertCapacity(manifest.members.length);

    const t0 = this.deps.nowMs();
    const layerOptions: FetchLayerOptions = {
      digestOf: layerDigestKind(manifest.schemaVersion),
      limits: this.layerRestore.limits,
      // Shared by every member's layer of this restore: what pass 1 may keep in memory for pass 2.
      retain: new RetainBudget(this.layerRestore.restoreMemoryBytes ?? DEFAULT_LAYER_RESTORE_SETTINGS.restoreMemoryBytes!),
      cache: await this.chunkCache(),
      ...(this.deps.workerConnection ? { fetchWorker: this.deps.workerConnection } : {}),
    };
    // Pass 1 for every member BEFORE anything is created: a hostile, oversized or corrupt layer is
    // refused with nothing made and nothing written (only verified chunks in the host's cache).
    const verified: VerifiedLayer[] = [];
    const created: string[] = [];
    try {
      for (const m of manifest.members) {
        try {
          const v = await verifyLayer(m.layer, store, layerOptions);
          verified.push(v);
          this.deps.metrics.checkpointBytes.inc({ kind: 'restore_cached' }, v.cachedBytes);
          this.deps.metrics.checkpointBytes.inc({ kind: 'restore_fetched' }, v.fetchedBytes);
        } catch (err) {
          throw restoreError(m.memberId, err);
        }
      }
      this.deps.metrics.checkpointDuration.observe({ phase: 'restore_validate' }, (this.deps.nowMs() - t0) / 1000);

      const members: RestoredMember[] = [];
      const problems: (SessionFileProblem & { memberId: string })[] = [];
      for (const [i, m] of manifest.members.entries()) {
        let made: Promise<{ id: string; upper: string }> | undefined;
        try {
          // Extraction into a staging dir starts at once when the overlay2 root is known; the
          // container is created meanwhile and its upper dir replaced by the staging dir at the end.
          made = runtime.createMember({
            groupId: manifest.groupId,
            memberId: m.memberId,
            cliKind: m.cliKind,
            placementGeneration: generation,
            imageId: manifest.baseImageDigest,
            cmd: this.deps.groups.memberCommand(m.cliKind),
            env: { SANDBOXFLEET_GROUP_ID: manifest.groupId, SANDBOXFLEET_MEMBER_ID: m.memberId, SANDBOXFLEET_CLI: m.cliKind },
            networkMode: this.deps.groups.memberNetworkMode,
          }).then(async (c) => {
            created.push(c.id);
            const upper = await runtime.upperDir(c.id);
            this.learnStaging(upper);
            return { id: c.id, upper };
          });
          made.catch(() => undefined); // awaited below, and before any cleanup
          await extractVerifiedLayer(verified[i]!, store, made.then((x) => x.upper), { ...layerOptions, earlyStaging: this.stagingReady }); // applied BEFORE any start (R-G5)
          const c = await made;
          const upper = c.upper;
          const found = [...(await proveSessionFiles(upper, m.nativeSessionPaths, m.savedLocator)), ...unnamedSessionProblem(m)];
          problems.push(...found.map((p) => ({ ...p, memberId: m.memberId })));
          members.push({ memberId: m.memberId, containerId: c.id, sessionFilesPresent: found.length === 0, missingPaths: found.map((p) => p.path) });
        } catch (err) {
          await made?.catch(() => undefined); // its container, if any, is in `created` for the cleanup
          throw restoreError(m.memberId, err);
        }
      }
      this.deps.metrics.checkpointDuration.observe({ phase: 'restore' }, (this.deps.nowMs() - t0) / 1000);
      if (problems.length > 0) {
        // Not proven, not placed: remove what was made, report which files failed (R-G5).
        await Promise.allSettled(created.map((id) => runtime.remove(id, { force: true })));
        return { members, problems, verified: false };
      }
      return { members, problems, verified: true };
    } catch (err) {
      // Leave nothing half-restored behind (the control plane retries elsewhere on a host failure, R-G5).
      await Promise.allSettled(created.map((id) => runtime.remove(id, { force: true })));
      throw restoreError(undefined, err);
    } finally {
      // Frees the kept chunks once they are in the host's cache (background writes: not waited for).
      // Restores back to back on a slow disk would pile them up: beyond one restore budget of
      // pending writes, a layer's kept chunks are freed at once and not cached.
      const budget = this.layerRestore.restoreMemoryBytes ?? DEFAULT_LAYER_RESTORE_SETTINGS.restoreMemoryBytes!;
      for (const v of verified) {
        const bytes = this.fillBytes + v.uncachedBytes <= budget ? v.uncachedBytes : 0;
        this.fillBytes += bytes;
        const fill = v.release({ cache: bytes > 0 }).finally(() => (this.fillBytes -= bytes));
        this.cacheFills.add(fill);
        void fill.finally(() => this.cacheFills.delete(fill));
      }
    }
  }
}

/**
 * A manifest that names a saved session but no session file proves nothing about it: for a CLI
 * whose layout is verified, capture never writes one (it refuses `session_files_missing`), so such
 * a manifest is damaged or forged and the restore is not proven.
 */
function unnamedSessionProblem(m: CoreManifest['members'][number]): SessionFileProblem[] {
  if (m.savedLocator === null || m.nativeSessionPaths.length > 0) return [];
  const kind = CLI_KINDS.find((k) => k === m.cliKind.replaceAll('-', '_'));
  if (kind === undefined || !NATIVE_SESSION_LAYOUTS[kind].enforced) return [];
  return [{ path: `(no ${kind} session file named for ${m.savedLocator})`, problem: 'missing' }];
}
