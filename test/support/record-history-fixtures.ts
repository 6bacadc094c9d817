// Records test/fixtures/cli-history/<cli>.json: the request bodies the pinned CLIs send to the
// loopback fake model API over two turns of one session (a new session, then a resumed one), run as
// processes on this machine with a throw-away HOME. The unit test of the history checker
// (test/unit/history-checker.test.ts) replays them, negative controls included. `tools` are left
// out of the stored bodies (the checker compares messages; the tool schemas are most of the bytes).
// For OpenCode and Kilo it also keeps their SQLite session store as the CLI left it (database and
// write-ahead log, gzipped) and the CLI's own `session list --format json`, in
// test/fixtures/sqlite/: the SQLite reader's unit test proves the sessions by the CLI's listing.
// Run: npx tsx test/support/record-history-fixtures.ts [claude-code|pi|codex|opencode|kilo ...]
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { gzipSync } from 'node:zlib';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { claudeCodeBinary, claudeCodeEnv } from './claude-code.ts';
import { codexConfigToml, codexImageFiles } from './codex-cli.ts';
import { ackMarker, startFakeModelApi, type RecordedRequest } from './fake-model-api.ts';
import { kiloBinary, openCodeBinary, openCodeConfigJson } from './opencode-cli.ts';
import { piInstallDir, piModelsJson } from './pi-cli.ts';

const OUT = new URL('../fixtures/cli-history/', import.meta.url).pathname;
const SQLITE_OUT = new URL('../fixtures/sqlite/', import.meta.url).pathname;
const PROMPTS = ['Please remember MARK-ONE.', 'Please remember MARK-TWO.'];

/** Runs two turns; `turnEnded()` after each marks which requests belong to which turn. */
type Runner = (home: string, apiUrl: string, turnEnded: () => void) => Promise<void>;

// Asynchronous: the fake model API answers from this same process.
const run = async (argv: string[], env: Record<string, string>): Promise<string> => {
  const child = promisify(execFile)(argv[0]!, argv.slice(1), { env: { PATH: process.env.PATH ?? '', ...env }, cwd: '/', encoding: 'utf8', timeout: 120_000, maxBuffer: 64 * 1024 * 1024 });
  child.child.stdin?.end();
  return (await child).stdout;
};
const firstJson = (out: string, key: string): string => String((JSON.parse(out.split('\n')[0]!) as Record<string, unknown>)[key]);

const runners: Record<string, Runner> = {
  'claude-code': async (home, url, turnEnded) => {
    const env = { ...claudeCodeEnv(url), HOME: home };
    const claude = claudeCodeBinary();
    const id = firstJson(await run([claude, '-p', '--output-format', 'stream-json', '--verbose', '--', PROMPTS[0]!], env), 'session_id');
    turnEnded();
    await run([claude, '-p', '--output-format', 'stream-json', '--verbose', '--resume', id, '--', PROMPTS[1]!], env);
  },
  pi: async (home, url, turnEnded) => {
    mkdirSync(join(home, '.pi', 'agent'), { recursive: true });
    writeFileSync(join(home, '.pi', 'agent', 'models.json'), piModelsJson(url));
    const cli = [process.execPath, join(piInstallDir(), 'node_modules', '@mariozechner', 'pi-coding-agent', 'dist', 'cli.js'), '--mode', 'json', '-p', '--provider', 'fake', '--model', 'fake-model'];
    const id = firstJson(await run([...cli, PROMPTS[0]!], { HOME: home }), 'id');
    turnEnded();
    await run([...cli, '--session', id, PROMPTS[1]!], { HOME: home });
  },
  codex: async (home, url, turnEnded) => {
    mkdirSync(join(home, '.codex'), { recursive: true });
    writeFileSync(join(home, '.codex', 'config.toml'), codexConfigToml(url));
    const codex = codexImageFiles()[0]!.source;
    const id = firstJson(await run([codex, 'exec', '--json', '--skip-git-repo-check', PROMPTS[0]!], { HOME: home }), 'thread_id');
    turnEnded();
    await run([codex, 'exec', '--json', '--skip-git-repo-check', 'resume', id, PROMPTS[1]!], { HOME: home });
  },
  opencode: (home, url, turnEnded) => openCodeRuns(openCodeBinary(), 'opencode', home, url, turnEnded),
  kilo: (home, url, turnEnded) => openCodeRuns(kiloBinary(), 'kilo', home, url, turnEnded),
};

/** OpenCode and Kilo through `run` (the bridge drives their server API; `run` sends the same requests). */
async function openCodeRuns(binary: string, name: 'opencode' | 'kilo', home: string, url: string, turnEnded: () => void): Promise<void> {
  mkdirSync(join(home, '.config', name), { recursive: true });
  writeFileSync(join(home, '.config', name, `${name === 'kilo' ? 'kilo' : 'opencode'}.json`), openCodeConfigJson(url));
  const env = { HOME: home };
  await run([binary, 'run', PROMPTS[0]!], env);
  turnEnded();
  const sessions = JSON.parse(await run([binary, 'session', 'list', '--format', 'json'], env)) as Array<{ id: string }>;
  await run([binary, 'run', '--session', sessions[0]!.id, PROMPTS[1]!], env);
  // The session store as the CLI left it, and its own listing of it.
  mkdirSync(SQLITE_OUT, { recursive: true });
  const db = join(home, '.local', 'share', name, `${name}.db`);
  writeFileSync(join(SQLITE_OUT, `${name}.db.gz`), gzipSync(readFileSync(db), { level: 9 }));
  if (existsSync(`${db}-wal`)) writeFileSync(join(SQLITE_OUT, `${name}.db-wal.gz`), gzipSync(readFileSync(`${db}-wal`), { level: 9 }));
  else rmSync(join(SQLITE_OUT, `${name}.db-wal.gz`), { force: true });
  writeFileSync(join(SQLITE_OUT, `${name}.sessions.json`), await run([binary, 'session', 'list', '--format', 'json'], env));
}

const strip = (r: RecordedRequest): unknown => ({ path: r.path, api: r.api, raw: { ...(r.raw as Record<string, unknown>), tools: undefined } });

const wanted = process.argv.slice(2).length > 0 ? process.argv.slice(2) : Object.keys(runners);
mkdirSync(OUT, { recursive: true });
for (const cli of wanted) {
  const api = await startFakeModelApi(ackMarker);
  const home = mkdtempSync(join(tmpdir(), `sf-record-${cli}-`));
  try {
    const ends: number[] = [];
    await runners[cli]!(home, api.url, () => ends.push(api.requests.length));
    ends.push(api.requests.length);
    // `opencode run` and `kilo run` send their message argument quoted; the bridge sends it as is.
    const prompts = cli === 'opencode' || cli === 'kilo' ? PROMPTS.map((p) => `"${p}"`) : PROMPTS;
    const turns = prompts.map((prompt, i) => ({ prompt, requests: api.requests.slice(i === 0 ? 0 : ends[i - 1], ends[i]).map(strip) }));
    writeFileSync(join(OUT, `${cli}.json`), `${JSON.stringify({ recorded: 'test/support/record-history-fixtures.ts', turns }, null, 1)}\n`);
    console.log(`${cli}: ${api.requests.length} requests`);
  } finally {
    await api.close();
    rmSync(home, { recursive: true, force: true });
  }
}
