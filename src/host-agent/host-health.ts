// What the agent knows about its engine between commands: the inventory of member containers
// (R-H3) and of the CLI processes it keeps between turns (ExecSessions.turnProcesses, given by the
// agent, R-S1), free capacity, and whether the Docker data directory was lost (R-H5) — the data root
// vanished from disk, or the engine failed to answer several checks in a row. Data loss is sticky
// for the life of the process: a dockerd that comes back on an empty data root has not brought
// the writable layers back.
import { existsSync } from 'node:fs';
import { statfs } from 'node:fs/promises';
import { freemem } from 'node:os';
import type { DockerRuntime } from '../docker/runtime.ts';
import type { Capacity } from '../gen/sandboxfleet/v1/common.ts';
import type { Inventory, TurnProcessInfo } from '../gen/sandboxfleet/v1/agent.ts';
import { layerPresent } from './group-ops.ts';
import { toWireContainer } from './wire.ts';

export interface HealthSnapshot {
  /** Undefined when the engine did not answer: "unknown", never "empty". */
  readonly inventory: Inventory | undefined;
  readonly capacity: Capacity;
  readonly dataLost: boolean;
  readonly dataLostReason: string | undefined;
}

export class HostHealth {
  private failures = 0;
  private lostReason: string | undefined;
  private lastUsed = 0;

  constructor(
    private readonly runtime: DockerRuntime,
    /** The engine's data root as it reported at start (DockerRootDir). */
    private readonly dataRoot: string,
    private readonly maxMembers: number,
    private readonly failuresForLoss: number,
    private readonly nowMs: () => number,
    /** The CLI processes the agent keeps between turns (ExecSessions.turnProcesses). */
    private readonly turnProcesses: () => TurnProcessInfo[],
  ) {}

  get dataLost(): boolean {
    return this.lostReason !== undefined;
  }

  async inventory(): Promise<Inventory> {
    // Turn processes first: one listed in a container the listing then shows restarted or stopped is
    // judged against that newer container state (the control plane matches its container run).
    const turnProcesses = this.turnProcesses();
    const containers = await this.runtime.listMembers();
    return { containers: containers.map((c) => toWireContainer(c, layerPresent(c))), takenAtUnixMs: this.nowMs(), turnProcesses };
  }

  /** One check: inventory, capacity, data-root presence. Never throws. */
  async snapshot(): Promise<HealthSnapshot> {
    let inventory: Inventory | undefined;
    try {
      inventory = await this.inventory();
      this.failures = 0;
      this.lastUsed = inventory.containers.length;
    } catch {
      this.failures += 1;
      if (this.failures >= this.failuresForLoss) this.lostReason ??= `engine unreachable for ${this.failures} consecutive checks`;
    }
    if (!existsSync(this.dataRoot)) this.lostReason ??= `docker data root ${this.dataRoot} is gone`;
    let diskFreeBytes = 0;
    try {
      const fs = await statfs(this.dataRoot);
      diskFreeBytes = fs.bavail * fs.bsize;
    } catch {
      // data root unreadable: reported as 0 free
    }
    return {
      inventory,
      capacity: { maxMembers: this.maxMembers, usedMembers: this.lastUsed, diskFreeBytes, memoryAvailableBytes: freemem() },
      dataLost: this.lostReason !== undefined,
      dataLostReason: this.lostReason,
    };
  }
}
