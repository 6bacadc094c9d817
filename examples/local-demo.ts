// `npm run demo` (with `npm start` running): give the local fleet something to move. Opens a few
// conversations through the runner SDK, reports one successful turn in each (no model runs: the
// session file is written as the CLI would, and the turn-end evidence is what a detector would
// produce), and stops every other group cleanly so it
// is checkpointed. Then drain a host and watch the status page: stopped groups are restored
// elsewhere, running ones are stopped cleanly, checkpointed and moved; the next turn of each is
// RESTORED.
//   node --import tsx examples/local-demo.ts [--groups 6] [--address 127.0.0.1:7443]
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import Docker from 'dockerode';
import { DockerRuntime } from '../src/docker/runtime.ts';
import { RunnerClient, WireTurnEndKind } from '../src/runner-sdk/index.ts';

// The demo plays the members' CLIs too: each turn appends to the session file Claude Code would
// write when run from `/` (the checkpoint must find it, or the group could not move: R-G3).
const hosts = JSON.parse(readFileSync(join(process.env.SANDBOXFLEET_STATE_DIR ?? '.state', 'hosts.json'), 'utf8')) as Record<string, { dockerSocket: string }>;
async function writeSession(hostId: string, containerId: string, locator: string): Promise<void> {
  const socketPath = hosts[hostId]?.dockerSocket;
  if (socketPath === undefined) throw new Error(`no docker socket for ${hostId} in .state/hosts.json (is npm start running?)`);
  const script = 'mkdir -p /root/.claude/projects/- && printf \'{"type":"user","sessionId":"%s","message":"hello"}\\n\' "$1" >> "/root/.claude/projects/-/$1.jsonl"';
  const r = await new DockerRuntime(new Docker({ socketPath })).exec(containerId, ['/bin/sh', '-c', script, 'sh', locator]);
  if (r.exitCode !== 0) throw new Error(`writing the session file failed: ${r.stderr}`);
}

const { values } = parseArgs({ options: { groups: { type: 'string', default: '6' }, address: { type: 'string', default: '127.0.0.1:7443' } } });
const fleet = new RunnerClient({ address: values.address, insecureLocalDev: true });
// What a turn-end detector reports for a native turn that ended with success (R-S5).
const evidence = { kind: WireTurnEndKind.RESULT, nativeTurnEnded: true, succeeded: true, cleanupFinished: true, transportUsable: true, locatorUsable: true, processExited: false, exitConfirmed: false, nativeTurnId: '', errorMessage: '' };
const count = Number(values.groups);
// New conversations on every run: state outlives `npm start` (./.state), Docker hosts do not, so a
// conversation of an earlier run may have been recovered, or be LOST, by now.
const run = Date.now().toString(36);
try {
  for (let i = 1; i <= count; i++) {
    const conversationId = `demo-${run}-${i}`;
    const { group } = await fleet.openGroup({ conversationId, members: [{ memberId: 'claude', cli: 'claude-code' }] });
    const groupId = group!.groupId;
    const turn = await fleet.beginTurn({ groupId, memberId: 'claude' });
    await writeSession(turn.hostId, turn.containerId, `session-${run}-${i}`);
    await fleet.completeTurn({ groupId, memberId: 'claude', turnId: turn.turnId, observedLocator: `session-${run}-${i}`, evidence });
    let note = 'running';
    if (i % 2 === 0) {
      const stopped = await fleet.stopGroup({ groupId });
      note = stopped.checkpointId ? `stopped cleanly, checkpoint ${stopped.checkpointId}` : 'stopped';
    }
    console.log(`${conversationId}  ${groupId}  on ${turn.hostId}  (${note})`);
  }
  console.log('\nnow: sandboxctl --insecure -s 127.0.0.1:7443 drain <host>   and watch http://127.0.0.1:8090/');
} finally {
  fleet.close();
}
