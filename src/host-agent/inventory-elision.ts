// Which heartbeats carry the inventory's container entries. A host's containers rarely change
// between beats, yet they were most of a beat's bytes and most of what the control plane spent on
// it (bench/scale: 100 containers per host, 1,000 hosts every 2 s: ~5% of a core for the
// inventories alone, decoded or compared on every replica). So a beat leaves them out when they are
// byte for byte those of the latest beat that carried them, and names that beat's entries by their
// SHA-256 (Heartbeat.containers_digest); a control plane holding entries with that digest reuses
// them, one that does not treats the beat's containers as unknown. The entries go out again when
// they change, after a new epoch, and at least every `fullEvery` beats, so a control-plane replica
// that starts (or missed a beat: core NATS publishes at most once) knows them again soon. The
// kubelet's node status works the same way: reported on change, and at least every few minutes.
import { createHash } from 'node:crypto';
import { Inventory } from '../gen/sandboxfleet/v1/agent.ts';

/** Beats at most between two that carry the container entries: 30 s at the default 2-s interval. */
export const FULL_INVENTORY_EVERY_BEATS = 15;

/** The containers part of one beat. */
export interface ContainersToSend {
  /** The inventory as the beat carries it: with its containers, or with none when omitted. */
  readonly inventory: Inventory;
  readonly containersDigest: Buffer;
  readonly containersOmitted: boolean;
}

/** SHA-256 of an inventory's container entries as encoded (every Inventory field 1, in order). */
export function containersDigest(containers: Inventory['containers']): Buffer {
  return createHash('sha256').update(Inventory.encode({ containers, takenAtUnixMs: 0, turnProcesses: [] }).finish()).digest();
}

export class InventoryElision {
  #lastDigest: Buffer | undefined;
  #lastEpoch: number | undefined;
  #beatsSinceFull = 0;

  constructor(private readonly fullEvery: number = FULL_INVENTORY_EVERY_BEATS) {}

  /** The containers part of the next beat of `epoch`. */
  next(epoch: number, inventory: Inventory): ContainersToSend {
    const digest = containersDigest(inventory.containers);
    const omit = this.#lastDigest !== undefined && this.#lastEpoch === epoch && this.#beatsSinceFull + 1 < this.fullEvery && digest.equals(this.#lastDigest);
    if (omit) {
      this.#beatsSinceFull += 1;
      return { inventory: { ...inventory, containers: [] }, containersDigest: digest, containersOmitted: true };
    }
    this.#lastDigest = digest;
    this.#lastEpoch = epoch;
    this.#beatsSinceFull = 0;
    return { inventory, containersDigest: digest, containersOmitted: false };
  }

  /** The beat could not be sent: the next one carries the containers whatever they are. */
  forget(): void {
    this.#lastDigest = undefined;
  }
}
