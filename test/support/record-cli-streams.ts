// Records the turn-end detectors' fixtures from the REAL pinned binaries (issue 16 item 3), as
// processes on this machine against the loopback fake model API, with a throw-away HOME:
//   test/fixtures/cli-streams/opencode/recorded-*.jsonl, kilo/recorded-*.jsonl — what
//     `live-bridge turn` printed (the project's bridge, bridge/live-bridge.ts, in front of
//     `<cli> serve`): a new session, a resumed one, a Task child whose permission the bridge
//     answers, a failed call (HTTP 400), a call the CLI retried by itself (HTTP 500 once), and a
//     turn whose stream the runner dropped (cut where it was dropped);
//   test/fixtures/cli-streams/codex-exec/*.jsonl — `codex exec --json` stdout: a new thread, a
//     resumed one, a call Codex retried by itself, a turn that failed after its retries.
// The first line of each file is a `{"recorded": …}` note (every detector ignores it as invalid input).
// test/unit/runner-sdk/recorded-streams.test.ts replays them through the detectors.
// Run: npx tsx test/support/record-cli-streams.ts [opencode|kilo|codex-exec ...]
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { codexConfigToml, codexImageFiles, CODEX_VERSION } from './codex-cli.ts';
import { ackMarker, startFakeModelApi, type FakeModelApi, type ReplyScript } from './fake-model-api.ts';
import { transpiledBridge } from './live-bridge-image.ts';
import { KILO_VERSION, OPENCODE_VERSION, kiloBinary, openCodeBinary, openCodeConfigJson } from './opencode-cli.ts';

const OUT = new URL('../fixtures/cli-streams/', import.meta.url).pathname;

const replies: ReplyScript = (last) => {
  if (last.includes('CHILD-TASK')) return { text: 'running it', toolUse: { id: 'toolu_child_bash_1', name: 'bash', input: { command: 'echo child', description: 'echo' } } };
  if (last.includes('MARK-TASK')) return { text: 'delegating', toolUse: { id: 'toolu_root_task_1', name: 'task', input: { description: 'child work', prompt: 'CHILD-TASK run echo', subagent_type: 'general' } } };
  if (last === '') return 'done';
  return ackMarker(last);
};

function run(argv: string[], env: NodeJS.ProcessEnv, options: { cancelWhen?: (out: string) => boolean } = {}): Promise<{ out: string; code: number | null }> {
  return new Promise((resolve) => {
    const p = spawn(argv[0]!, argv.slice(1), { env, cwd: '/', stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let cancelled = false;
    p.stdout.on('data', (c: Buffer) => {
      out += c.toString('utf8');
      if (!cancelled && options.cancelWhen?.(out) === true) {
        cancelled = true;
        p.kill('SIGINT');
      }
    });
    p.stderr.resume();
    p.on('exit', (code) => resolve({ out, code }));
  });
}

function save(dir: string, name: string, note: Record<string, unknown>, out: string): void {
  mkdirSync(join(OUT, dir), { recursive: true });
  writeFileSync(join(OUT, dir, `${name}.jsonl`), `${JSON.stringify({ recorded: 'test/support/record-cli-streams.ts', ...note })}\n${out.endsWith('\n') || out === '' ? out : `${out}\n`}`);
}

async function bridgeStreams(cli: 'opencode' | 'kilo', api: FakeModelApi, home: string): Promise<void> {
  mkdirSync(join(home, '.config', cli), { recursive: true });
  writeFileSync(join(home, '.config', cli, `${cli}.json`), openCodeConfigJson(api.url, { permission: { bash: 'ask' } }));
  const script = transpiledBridge();
  const socket = join(home, 'bridge.sock');
  const env = { PATH: process.env.PATH ?? '', HOME: home };
  const bridge = spawn(process.execPath, [script, 'serve', '--cli', cli, '--binary', cli === 'kilo' ? kiloBinary() : openCodeBinary(), '--socket', socket], { env, cwd: '/', stdio: ['ignore', 'ignore', 'pipe'] });
  bridge.stderr.resume();
  const version = cli === 'kilo' ? KILO_VERSION : OPENCODE_VERSION;
  let session = '';
  const turn = (turnId: string, text: string, options: { cancelWhen?: (out: string) => boolean } = {}) =>
    run([process.execPath, script, 'turn', '--socket', socket, '--turn-id', turnId, ...(session !== '' ? ['--session', session] : []), '--', text], env, options);
  try {
    const steps: Array<{ name: string; turnId: string; text: string; before?: () => void; cancelWhen?: (out: string) => boolean }> = [
      { name: 'recorded-new-session', turnId: 'turn-1', text: 'Please remember MARK-ONE.' },
      { name: 'recorded-resumed', turnId: 'turn-2', text: 'Please remember MARK-TWO.' },
      { name: 'recorded-task-child-permission', turnId: 'turn-3', text: 'Please remember MARK-TASK.' },
      { name: 'recorded-failed-call', turnId: 'turn-4', text: 'Please remember MARK-FOUR.', before: () => api.failNext(1_000, 400) },
      { name: 'recorded-internal-retry', turnId: 'turn-5', text: 'Please remember MARK-FIVE.', before: () => api.failNext(1, 500) },
      { name: 'recorded-stream-dropped', turnId: 'turn-6', text: 'Please remember MARK-SIX.', cancelWhen: (out) => out.includes('"type":"busy"') },
    ];
    for (const s of steps) {
      s.before?.();
      const release = s.cancelWhen !== undefined ? api.holdRequestsWith('MARK-SIX') : undefined;
      const r = await turn(s.turnId, s.text, s.cancelWhen !== undefined ? { cancelWhen: s.cancelWhen } : {});
      release?.();
      api.failNext(0, 500);
      if (session === '') session = (JSON.parse(r.out.split('\n')[0]!) as { properties: { sessionID: string } }).properties.sessionID;
      save(cli, s.name, { cli, version, bridge: 4, turnId: s.turnId, prompt: s.text, exit: r.code }, r.out);
      console.log(`${cli} ${s.name}: exit ${r.code}, ${r.out.split('\n').length - 1} lines`);
      // A dropped stream leaves the native turn aborting: wait until the session is idle again.
      await new Promise((x) => setTimeout(x, s.cancelWhen !== undefined ? 2_000 : 0));
    }
  } finally {
    bridge.kill('SIGTERM');
    await new Promise((r) => bridge.on('exit', r));
  }
}

async function codexExecStreams(api: FakeModelApi, home: string): Promise<void> {
  mkdirSync(join(home, '.codex'), { recursive: true });
  const codex = codexImageFiles()[0]!.source;
  const env = { PATH: process.env.PATH ?? '', HOME: home };
  const exec = (args: string[]) => run([codex, 'exec', '--json', '--skip-git-repo-check', ...args], env);
  writeFileSync(join(home, '.codex', 'config.toml'), codexConfigToml(api.url));
  const first = await exec(['Please remember MARK-ONE.']);
  const thread = (JSON.parse(first.out.split('\n')[0]!) as { thread_id: string }).thread_id;
  const note = (name: string, r: { code: number | null }) => ({ cli: 'codex', version: CODEX_VERSION, command: 'codex exec --json', name, exit: r.code });
  save('codex-exec', 'new-thread', note('new-thread', first), first.out);
  const resumed = await exec(['resume', thread, 'Please remember MARK-TWO.']);
  save('codex-exec', 'resumed', note('resumed', resumed), resumed.out);
  api.failNext(1, 500);
  const retried = await exec(['resume', thread, 'Please remember MARK-THREE.']);
  save('codex-exec', 'internal-retry', note('internal-retry', retried), retried.out);
  // Retries cut short so the failure comes at once (the default costs ~25 s of reconnects).
  writeFileSync(join(home, '.codex', 'config.toml'), `${codexConfigToml(api.url)}request_max_retries = 0\nstream_max_retries = 1\n`);
  api.failNext(1_000, 500);
  const failed = await exec(['resume', thread, 'Please remember MARK-FOUR.']);
  api.failNext(0, 500);
  save('codex-exec', 'failed', note('failed', failed), failed.out);
  console.log('codex-exec: 4 streams');
}

const wanted = process.argv.slice(2).length > 0 ? process.argv.slice(2) : ['opencode', 'kilo', 'codex-exec'];
for (const what of wanted) {
  const api = await startFakeModelApi(replies);
  const home = mkdtempSync(join(tmpdir(), `sf-streams-${what}-`));
  try {
    if (what === 'codex-exec') await codexExecStreams(api, home);
    else await bridgeStreams(what as 'opencode' | 'kilo', api, home);
  } finally {
    await api.close();
    rmSync(home, { recursive: true, force: true });
  }
}
