// Conversions between the Docker adapter's view and the agent wire protocol (proto), kept in one
// place: CLI kind names, container states, inventory entries. No I/O here.
import { ContainerState, type ContainerInfo as WireContainer } from '../gen/sandboxfleet/v1/agent.ts';
import type { ContainerInfo, ContainerStatus } from '../docker/runtime.ts';

const STATES: Readonly<Record<ContainerStatus, ContainerState>> = {
  created: ContainerState.CREATED,
  running: ContainerState.RUNNING,
  paused: ContainerState.PAUSED,
  restarting: ContainerState.RESTARTING,
  exited: ContainerState.EXITED,
  removing: ContainerState.REMOVING,
  dead: ContainerState.DEAD,
};

function ms(iso: string | undefined): number {
  if (iso === undefined) return 0;
  const t = Date.parse(iso);
  return Number.isFinite(t) ? t : 0;
}

export function isoToMs(iso: string | undefined): number | undefined {
  const t = ms(iso);
  return t === 0 ? undefined : t;
}

/** A member container as reported in heartbeats and inventory results (R-H3). */
export function toWireContainer(c: ContainerInfo, writableLayerPresent: boolean): WireContainer {
  const exited = c.status === 'exited' || c.status === 'dead';
  return {
    containerId: c.id,
    name: c.name,
    groupId: c.member?.groupId ?? '',
    memberId: c.member?.memberId ?? '',
    placementGeneration: c.member?.placementGeneration ?? 0,
    state: STATES[c.status] ?? ContainerState.UNSPECIFIED,
    exitCode: exited ? c.exitCode : undefined,
    writableLayerPresent,
    imageDigest: c.imageId,
    startedAtUnixMs: ms(c.startedAt),
    finishedAtUnixMs: ms(c.finishedAt),
    oomKilled: c.oomKilled,
  };
}

/** Bound a human-readable message to the 4 KiB the protocol allows. */
export function boundMessage(text: string): string {
  return text.length <= 4000 ? text : `${text.slice(0, 3990)}…`;
}
