// The public surface of the pure domain core. Services and adapters import from here (or from the
// individual module when they need only one). checkpoint-manifest.ts and layer-rules.ts are imported
// directly from their own modules.
export * from './errors.ts';
export * from './result.ts';
export * from './exhaustive.ts';
export * from './ids.ts';
export * from './host.ts';
export * from './host-notice.ts';
export * from './attestation.ts';
export * from './liveness.ts';
export * from './lease.ts';
export * from './group.ts';
export * from './clean-stop.ts';
export * from './checkpoint.ts';
export * from './checkpoint-retention.ts';
export * from './loss.ts';
export * from './turn-end-evidence.ts';
export * from './member-session.ts';
export * from './host-copy.ts';
export * from './turn-command.ts';
