// The control plane's public surface for cmd/ and src/api: the service, its factory inputs, the
// bucket set it needs, and the RunnerBackend implementation.
export { ControlPlane, HEARTBEAT_READ_BATCH_MS, type ControlPlaneOptions } from './control-plane.ts';
export { CONTROL_PLANE_BUCKETS, type ControlPlaneBuckets } from './buckets.ts';
export { ControlPlaneRunnerBackend } from './runner-backend.ts';
export type { GroupRecord, HostRecord, CheckpointRecord } from './records.ts';
