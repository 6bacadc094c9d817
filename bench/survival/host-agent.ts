// The survival scenario's host agents: the real agent binary as a child process (so a host can be
// SIGKILLed), like test/support/agent.ts's spawnAgent, plus the member network mode. Conversations
// that run the real Claude Code CLI need `host` networking (the CLI inside the member container
// reaches the loopback fake Messages API, as in the cli-history tests), and spawnAgent passes only
// a fixed set of settings to the child's environment, not that one.
import { spawn } from 'node:child_process';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { TEST_AGENT_SHA, type ChildAgent } from '../../test/support/agent.ts';
import type { DockerHost } from '../../test/support/docker.ts';

const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');

export interface SurvivalAgentSetup {
  readonly hostId: string;
  readonly natsUrl: string;
  readonly host: DockerHost;
  readonly imageRef: string;
  readonly heartbeatIntervalMs: number;
  readonly reclaimNoticeFile: string;
  /** `host` where member containers must reach the loopback fake model API; `none` otherwise. */
  readonly memberNetworkMode: 'none' | 'host';
}

/** `node --import tsx cmd/host-agent/main.ts` with its settings in the environment, as deployed. */
export function spawnSurvivalAgent(s: SurvivalAgentSetup): ChildAgent {
  const env: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    HOME: process.env.HOME,
    SANDBOXFLEET_HOST_ID: s.hostId,
    SANDBOXFLEET_NATS_URL: s.natsUrl,
    SANDBOXFLEET_DOCKER_SOCKET: s.host.socketPath,
    SANDBOXFLEET_IMAGE_REF: s.imageRef,
    SANDBOXFLEET_AGENT_SHA: TEST_AGENT_SHA,
    SANDBOXFLEET_HEARTBEAT_INTERVAL_MS: String(s.heartbeatIntervalMs),
    // Each host its own chunk cache, removed with the host's directory.
    SANDBOXFLEET_LAYER_CACHE_DIR: `${s.host.dir}/chunk-cache`,
    SANDBOXFLEET_RECLAIM_NOTICE_FILE: s.reclaimNoticeFile,
    SANDBOXFLEET_MEMBER_NETWORK_MODE: s.memberNetworkMode,
    LOG_LEVEL: 'info',
    // Several agents share this machine: let each ops listener take a free port.
    SANDBOXFLEET_HTTP_PORT: '0',
  };
  const child = spawn(process.execPath, ['--import', 'tsx', 'cmd/host-agent/main.ts'], { cwd: REPO_ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout!.setEncoding('utf8').on('data', (t: string) => (out += t));
  child.stderr!.setEncoding('utf8').on('data', (t: string) => (out += t));
  const exited = new Promise<number | string>((res) => child.on('exit', (code, signal) => res(code ?? signal ?? 'unknown')));
  if (child.pid === undefined) throw new Error('host agent did not spawn');
  return { child, pid: child.pid, output: () => out, exited, kill: (signal = 'SIGTERM') => void child.kill(signal) };
}
