// The smoke-mode registry: one line per benchmark. test/integration/bench/smoke.test.ts runs
// `node --import tsx bench/<name>/run.ts --smoke --out <temp dir> ...args` for each entry (so
// `npm test` fails when a change breaks a benchmark), then checks that `<temp dir>/<name>.json` is
// a result of that benchmark with the common fields of bench/common.ts and every figure named here
// as a finite number. A new benchmark: accept BENCH_OPTIONS, call startBench/writeResult, pick tiny
// sizes under --smoke, and add its line below (see bench/README.md).

export interface SmokeBench {
  /** Directory under bench/ holding run.ts; also the result file's name (<name>.json). */
  readonly name: string;
  /** Top-level keys of the result that must be finite numbers (the figures the bench exists for). */
  readonly figures: readonly string[];
  /** Upper bound for the smoke run, start-up of its real services included. */
  readonly timeoutS: number;
  /** Extra command-line arguments after `--smoke --out DIR`. */
  readonly args?: readonly string[];
}

export const SMOKE_BENCHES: readonly SmokeBench[] = [
  { name: 'checkpoint', timeoutS: 240, figures: ['capture_store_s', 'docker_commit_save_s', 'restore_s', 'docker_load_create_s', 'capture_speedup_vs_commit_save', 'restore_speedup_vs_load_create', 'incremental_bytes_fraction', 'raw_tar_openssl_s', 'incremental_time_fraction', 'restore_cached_speedup'] },
  { name: 'drain', timeoutS: 300, figures: ['drain_total_s', 'group_p50_s', 'group_p99_s', 'bytes_moved', 'raw_copy_s', 'drain_throughput_mib_s', 'detection_latency_s', 'dead_latency_s', 'cpu_ms_per_heartbeat', 'pure_cpu_ms_per_heartbeat', 'placement_decision_ms', 'sessions_on_target', 'checkpointed_before_drain'] },
  { name: 'exec', timeoutS: 240, figures: ['first_byte_p50_ms_fleet', 'first_byte_p50_ms_direct', 'first_byte_p99_ms_fleet', 'throughput_mb_s_fleet', 'throughput_mb_s_direct', 'throughput_fraction_of_direct'] },
  { name: 'restore-bounds', timeoutS: 240, figures: ['bomb_seconds', 'bomb_max_heartbeat_gap_ms', 'bomb_agent_peak_rss_bytes', 'bomb_refused', 'big_seconds', 'big_max_heartbeat_gap_ms', 'big_agent_peak_rss_bytes', 'big_restored'] },
  { name: 'survival', timeoutS: 300, figures: ['survived_fraction_not_mid_turn_idle0', 'survived_fraction_not_mid_turn_idle0_background', 'restored_older_than_last_turn', 'turn_overhead_p50_ms_idle0', 'turn_overhead_p99_ms_idle0', 'turn_overhead_p50_ms_idle0_background', 'spot_groups_saved_30s'] },
  { name: 'scale', timeoutS: 180, figures: ['cp_cpu_fraction_100k', 'cp_cpu_ratio_100k_over_10k', 'dead_to_decisions_s', 'catchup_s_100k', 'read_model_mib_100k', 'cpu_ms_per_heartbeat'] },
  { name: 'turns', timeoutS: 300, figures: ['pairs_per_s_c1', 'call_p99_ms_c1', 'pairs_per_s_c8', 'call_p99_ms_c8', 'echo_pairs_per_s_c8', 'fraction_of_echo', 'raw_cas_per_s', 'raw_cas_per_s_sharded', 'jetstream_writes_per_pair_c8', 'pairs_per_s_c8_fsync_interval', 'fraction_of_echo_fsync_interval'] },
];
