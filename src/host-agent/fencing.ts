// The agent's fencing state (R-H6): the current host epoch (from the last RegistrationAck) and the
// newest placement generation seen per group. A command runs only if it carries exactly the current
// epoch and, for a group command, a generation not older than the one known for that group; a
// newer generation is adopted (the control plane moved the group forward, e.g. a restore here).
// Generations are re-learned from container labels at start, so a restarted agent still refuses
// commands of an earlier placement.
import { checkFence } from '../core/lease.ts';
import type { FencedReason } from '../core/errors.ts';

export type FenceVerdict = { readonly ok: true } | { readonly ok: false; readonly reason: FencedReason | 'not_registered'; readonly detail: string };

export class FenceState {
  private epochValue: number | undefined;
  private revoked = false;
  private readonly generations = new Map<string, number>();

  /** The current epoch, or undefined before the first RegistrationAck. */
  get epoch(): number | undefined {
    return this.epochValue;
  }

  /** Adopt the epoch of a new registration. Epochs only grow (R-H4); a smaller one is a control-plane bug. */
  setEpoch(epoch: number): void {
    if (!Number.isSafeInteger(epoch) || epoch <= 0) throw new RangeError(`host epoch must be a positive integer, got ${epoch}`);
    if (this.epochValue !== undefined && epoch < this.epochValue) throw new RangeError(`host epoch went backwards: ${this.epochValue} → ${epoch}`);
    this.epochValue = epoch;
    this.revoked = false;
  }

  /**
   * The control plane fenced the current epoch: refuse every command until the next registration
   * sets a new epoch (the epoch itself is kept so that one can only grow).
   */
  revoke(): void {
    this.revoked = true;
  }

  generationOf(groupId: string): number | undefined {
    return this.generations.get(groupId);
  }

  /** Remember a generation seen on the engine or in an accepted command (keeps the newest). */
  observe(groupId: string, generation: number): void {
    const known = this.generations.get(groupId);
    if (known === undefined || generation > known) this.generations.set(groupId, generation);
  }

  forget(groupId: string): void {
    this.generations.delete(groupId);
  }

  /** Judge a command's tokens. `groupId` undefined for host-scoped commands (inventory, probe). */
  check(epoch: number, groupId: string | undefined, generation: number): FenceVerdict {
    if (this.epochValue === undefined) return { ok: false, reason: 'not_registered', detail: 'no registration acknowledged yet' };
    if (this.revoked) return { ok: false, reason: 'stale_epoch', detail: `epoch ${this.epochValue} was fenced by the control plane; registering again` };
    const epochOnly = checkFence({ epoch }, { epoch: this.epochValue });
    if (!epochOnly.ok) return { ok: false, reason: epochOnly.error.reason, detail: `${epochOnly.error.message} (command ${epoch}, agent ${this.epochValue})` };
    if (groupId === undefined) return { ok: true };
    const known = this.generations.get(groupId);
    if (known !== undefined && generation < known) {
      return { ok: false, reason: 'stale_generation', detail: `group ${groupId}: command generation ${generation} < known ${known}` };
    }
    return { ok: true };
  }
}
