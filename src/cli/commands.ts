// The `sandboxctl` / `kubectl sandbox` command tree (R-I7, R-H7): hosts, groups, turns, checkpoints,
// drain, remove, migrate, destroy, verify, events; nats-permissions (offline); preflight (a model
// gateway, not the control plane: R-P3). Each fleet command is one AdminService call (events:
// one server stream) printed as a table, JSON or YAML. Exit codes: 0 success, 1 a failed call or
// a failed verification (any mismatch), 2 a usage error. Mutating commands send a fresh
// idempotency key unless --idempotency-key repeats one (R-I1), so a retry after a timeout is safe.
import { Command, InvalidArgumentError, Option } from 'commander';
import { randomBytes, randomUUID } from 'node:crypto';
import {
  CheckpointInfo,
  DestroyGroupResponse,
  DrainHostResponse,
  GetGroupResponse,
  GetHostResponse,
  ListCheckpointsResponse,
  ListEventsRequest,
  ListEventsResponse,
  ListGroupsResponse,
  ListHostsResponse,
  MigrateGroupResponse,
  RemoveHostResponse,
  VerifyResponse,
  type AdminServiceClient,
  type Host,
  type HostVerification,
  type TurnRecord,
} from '../gen/sandboxfleet/v1/admin.ts';
import {
  GroupState,
  HostState,
  cliKindToJSON,
  contextStateToJSON,
  groupStateFromJSON,
  groupStateToJSON,
  hostStateFromJSON,
  hostStateToJSON,
  stopOutcomeToJSON,
  turnEndKindToJSON,
  type Event,
  type Group,
} from '../gen/sandboxfleet/v1/common.ts';
import { hostPermissions } from '../core/agent-subjects.ts';
import { protection } from '../core/idle-stop.ts';
import { RunnerError, toRunnerError } from '../runner-sdk/client.ts';
import { adminClient, call, resolveConnection, UsageError, type ConnectionOptions } from './connection.ts';
import { boundedInt, isLoopback, LIMITS, parseGateway, parseModel, proxyFor, readKeyFile, redactor, renderPreflight, runPreflight, type ThinkingSetting } from './preflight.ts';
import { age, bytes, isoTime, OUTPUT_FORMATS, short, streamed, structured, table, type OutputFormat } from './output.ts';

/**
 * A nats-server authorization user entry (JSON, which the server's config format accepts) for a
 * host's nkey and its allow-lists: what the chart's `nats.server.authorization.users` holds.
 */
export function natsUserEntry(nkey: string, perms: ReturnType<typeof hostPermissions>): { nkey: string; permissions: { publish: { allow: string[] }; subscribe: { allow: string[] }; allow_responses: boolean } } {
  return { nkey, permissions: { publish: { allow: [...perms.publish] }, subscribe: { allow: [...perms.subscribe] }, allow_responses: perms.allowResponses } };
}

/** Every group, page by page (for the host list's UNPROTECTED column). */
async function listAllGroups(client: AdminServiceClient, timeoutMs: number): Promise<Group[]> {
  const groups: Group[] = [];
  let pageToken = '';
  do {
    const res = await call(client, client.listGroups, { hostId: '', state: GroupState.UNSPECIFIED, pageSize: 1000, pageToken }, timeoutMs);
    groups.push(...res.groups);
    pageToken = res.nextPageToken;
  } while (pageToken !== '');
  return groups;
}

/** Where a command writes; tests and the binary pass process streams. */
export interface CliIo {
  readonly out: (text: string) => void;
  readonly err: (text: string) => void;
  readonly now?: () => number;
}

interface GlobalOptions extends ConnectionOptions {
  readonly output: OutputFormat;
}

/** Thrown by a command that ran but must exit non-zero (e.g. verify found a mismatch). */
export class ExitCode extends Error {
  constructor(readonly code: number, message = '') {
    super(message);
  }
}

const stateName = (s: string, prefix: string) => (s.startsWith(prefix) ? s.slice(prefix.length) : s);
const hostState = (s: HostState) => stateName(hostStateToJSON(s), 'HOST_STATE_');
const groupState = (s: GroupState) => stateName(groupStateToJSON(s), 'GROUP_STATE_');

function parseHostStateFilter(v: string): HostState {
  const s = hostStateFromJSON(`HOST_STATE_${v.toUpperCase()}`);
  if (s === HostState.UNSPECIFIED || (s as number) === -1) throw new InvalidArgumentError(`unknown host state ${v}`);
  return s;
}

function parseGroupStateFilter(v: string): GroupState {
  const s = groupStateFromJSON(`GROUP_STATE_${v.toUpperCase()}`);
  if (s === GroupState.UNSPECIFIED || (s as number) === -1) throw new InvalidArgumentError(`unknown group state ${v}`);
  return s;
}

function parseNonNegativeInt(v: string): number {
  if (!/^\d{1,15}$/.test(v)) throw new InvalidArgumentError('must be a non-negative integer');
  return Number(v);
}

/**
 * Whether a host loss would make the group LOST now (core `protection`): anything but a clean stop
 * with a checkpoint, or a migration. From the API's view the latest checkpoint is taken as of the
 * group's state (a stop whose checkpoint failed keeps pointing at an older one).
 */
export function unprotected(g: Group): boolean {
  const state = stateName(groupStateToJSON(g.state), 'GROUP_STATE_') as Parameters<typeof protection>[0]['state'];
  if (!['PENDING', 'RUNNING', 'STOPPING', 'STOPPED', 'MIGRATING', 'LOST', 'DESTROYED'].includes(state)) return false;
  const p = protection({
    state,
    stopClean: stopOutcomeToJSON(g.stopOutcome) === 'STOP_OUTCOME_CLEAN',
    activityVersion: g.activityVersion,
    lastActivityAtMs: g.lastActivityAtUnixMs,
    createdAtMs: g.createdAtUnixMs,
    checkpointActivityVersion: g.latestCheckpointId !== '' ? g.activityVersion : undefined,
  });
  return p.protected === false;
}

function hostRows(hosts: readonly Host[], now: number, unprotectedByHost?: ReadonlyMap<string, number>): string[][] {
  return hosts.map((h) => [
    h.hostId,
    hostState(h.state),
    String(h.hostEpoch),
    String(h.groupCount),
    ...(unprotectedByHost !== undefined ? [String(unprotectedByHost.get(h.hostId) ?? 0)] : []),
    h.lastHeartbeatAtUnixMs > 0 ? age(now - h.lastHeartbeatAtUnixMs) : '-',
    h.leaseExpiresAtUnixMs > 0 ? isoTime(h.leaseExpiresAtUnixMs) : '-',
    short(h.attestation?.agentBuildSha ?? ''),
    h.attestation?.bridge?.helperVersion || '-',
    [...h.refusalReasons, h.removalSource].filter((r) => r !== '').join(',') || '-',
  ]);
}
const HOST_HEADER = ['HOST', 'STATE', 'EPOCH', 'GROUPS', 'HEARTBEAT', 'LEASE-END', 'AGENT-SHA', 'BRIDGE', 'REASONS'];
/** The host list: UNPROTECTED = its groups a loss of the host would make LOST now. */
const HOST_LIST_HEADER = ['HOST', 'STATE', 'EPOCH', 'GROUPS', 'UNPROTECTED', 'HEARTBEAT', 'LEASE-END', 'AGENT-SHA', 'BRIDGE', 'REASONS'];

function groupRows(groups: readonly Group[], now: number): string[][] {
  return groups.map((g) => [
    g.groupId,
    g.conversationId,
    groupState(g.state),
    g.hostId,
    String(g.placementGeneration),
    stateName(stopOutcomeToJSON(g.stopOutcome), 'STOP_OUTCOME_').replace('UNSPECIFIED', '-'),
    String(g.members.length),
    g.latestCheckpointId || '-',
    unprotected(g) ? 'no' : g.state === GroupState.LOST || g.state === GroupState.DESTROYED ? '-' : 'yes',
    g.lastActivityAtUnixMs > 0 ? age(now - g.lastActivityAtUnixMs) : '-',
    g.lossReason || '-',
  ]);
}
/** PROTECTED: survives the loss of its host (stopped cleanly with a checkpoint, or moving); IDLE: since its last activity. */
const GROUP_HEADER = ['GROUP', 'CONVERSATION', 'STATE', 'HOST', 'GEN', 'STOP', 'MEMBERS', 'CHECKPOINT', 'PROTECTED', 'IDLE', 'LOSS'];

function checkpointRows(cps: readonly CheckpointInfo[], now: number): string[][] {
  return cps.map((c) => [
    c.manifest?.checkpointId ?? '-',
    c.manifest?.groupId ?? '-',
    c.manifest?.sourceHostId ?? '-',
    c.manifest && c.manifest.createdAtUnixMs > 0 ? age(now - c.manifest.createdAtUnixMs) : '-',
    bytes(c.totalBytes),
    c.latest ? 'yes' : 'no',
    c.unusableReason === '' ? 'yes' : c.unusableReason,
  ]);
}

/**
 * One stored turn end per row (`sandboxctl turns`): what was sent (context state, input bytes),
 * how it ended as the driver reported it (end kind and its confirmations, exit, observed session),
 * and what the control plane decided (outcome, or the refusal).
 */
export function turnRows(turns: readonly TurnRecord[]): string[][] {
  return turns.map((t) => {
    const confirmed = [
      t.nativeTurnEnded ? 'ended' : 'not-ended',
      ...(t.succeeded ? ['ok'] : t.nativeTurnEnded ? ['failed'] : []),
      ...(t.cleanupFinished ? [] : ['cleanup-unfinished']),
      ...(t.transportUsable ? [] : ['transport-unusable']),
      ...(t.locatorUsable ? [] : ['locator-unusable']),
    ].join(',');
    const exit = t.processExited ? `exited ${t.exitCode ?? '?'}${t.exitConfirmed ? '' : ' (unconfirmed)'}` : t.exitConfirmed ? `exit ${t.exitCode ?? '?'}` : 'kept';
    return [
      t.turnId,
      stateName(contextStateToJSON(t.contextState), 'CONTEXT_STATE_'),
      String(t.placementGeneration),
      isoTime(t.beganAtUnixMs),
      age(t.completedAtUnixMs - t.beganAtUnixMs),
      `${stateName(turnEndKindToJSON(t.endKind), 'TURN_END_KIND_').toLowerCase()} ${confirmed}`,
      exit,
      t.observedLocator || '-',
      t.inputBytes === undefined ? '-' : bytes(t.inputBytes),
      t.outputBytes === undefined ? '-' : bytes(t.outputBytes),
      t.refusal === '' ? t.outcome : t.refusal === t.outcome ? `refused ${t.refusal}` : `${t.outcome} (refused ${t.refusal})`,
    ];
  });
}
const TURN_HEADER = ['TURN', 'CONTEXT', 'GEN', 'BEGAN', 'TOOK', 'END', 'PROCESS', 'OBSERVED', 'IN', 'OUT', 'OUTCOME'];

/** A value printed in full ('-' when empty): R-H7 asks for the exact SHA, and a prefix can hide a mismatch. */
const exact = (v: string) => (v === '' ? '-' : v);

function verifyRows(hosts: readonly HostVerification[]): string[][] {
  const mark = (ok: boolean, v: string) => `${v}${ok ? '' : ' ✗'}`;
  return hosts.map((h) => [
    h.hostId,
    hostState(h.state),
    mark(h.agentBuildShaOk, exact(h.agentBuildSha)),
    mark(h.apiShaOk, exact(h.apiSha)),
    // The image id (not a build SHA) stays short: a refused one is named in full in the mismatch
    // lines printed under the table.
    mark(h.imageDigestOk, short(h.imageDigest)),
    mark(h.bridgeVersionOk, h.bridgeVersion === 0 ? '-' : String(h.bridgeVersion)),
    h.probe?.ok ? `ok ${h.probe.roundTripMs}ms (cb ${h.probe.callbackRoundTripMs}ms via ${h.probe.answeredBy})` : `FAILED${h.probe?.error ? `: ${h.probe.error}` : ''}`,
    mark(h.heartbeatOk, h.heartbeatAgeMs < 0 ? 'never' : age(h.heartbeatAgeMs)),
    h.ok ? 'OK' : 'MISMATCH',
  ]);
}

function eventLine(e: Event): string {
  const transition = e.fromState !== '' || e.toState !== '' ? ` ${e.fromState || '∅'}→${e.toState || '∅'}` : '';
  const detail = Object.entries(e.detail).map(([k, v]) => `${k}=${v}`).join(' ');
  return `${String(e.seq).padStart(6)}  ${isoTime(e.timeUnixMs)}  ${e.subjectKind}/${e.subjectId}  ${e.type}${transition}${e.reason ? `  reason=${e.reason}` : ''}${detail ? `  ${detail}` : ''}`;
}

/** Builds the program. `io` receives all output; errors surface as exceptions for main() to map. */
export function buildProgram(io: CliIo, env: NodeJS.ProcessEnv = process.env): Command {
  const now = io.now ?? Date.now;
  const program = new Command('sandboxctl')
    .description('Operate a Sandbox Fleet control plane (also installed as `kubectl sandbox`).')
    .showHelpAfterError()
    .configureOutput({
      writeOut: (s) => io.out(s.trimEnd()),
      writeErr: (s) => io.err(s.trimEnd()),
      // `--api-key=sk-…` mistyped for an option we do not have must not echo the value (a secret
      // passed the wrong way would land in logs); every subcommand inherits this.
      outputError: (s, write) => write(s.replace(/(unknown option '[^'=\s]*=)[^']*'/g, "$1<redacted>'")),
    })
    .exitOverride()
    .option('-s, --server <host:port>', 'control plane gRPC address [env SANDBOXFLEET_SERVER, default 127.0.0.1:7443]')
    .option('--ca <file>', 'CA bundle that signed the server certificate [env SANDBOXFLEET_CA]')
    .option('--cert <file>', 'admin client certificate (PEM) [env SANDBOXFLEET_CERT]')
    .option('--key <file>', 'admin client key (PEM) [env SANDBOXFLEET_KEY]')
    .option('--insecure', 'plaintext, no client certificate: loopback dev control plane only [env SANDBOXFLEET_INSECURE=1]')
    .option('--timeout <ms>', 'deadline of each call in milliseconds', parseNonNegativeInt, 30_000)
    .addOption(new Option('-o, --output <format>', 'output format').choices(OUTPUT_FORMATS as string[]).default('table'));

  const globals = (cmd: Command): GlobalOptions => cmd.optsWithGlobals<GlobalOptions>();
  const withClient = async <T>(cmd: Command, fn: (client: AdminServiceClient, g: GlobalOptions, timeoutMs: number) => Promise<T>): Promise<T> => {
    const g = globals(cmd);
    const conn = resolveConnection(g, env);
    const client = adminClient(conn);
    try {
      return await fn(client, g, conn.timeoutMs);
    } finally {
      client.close();
    }
  };
  const print = (g: GlobalOptions, json: unknown, render: () => string) => io.out(g.output === 'table' ? render() : structured(json, g.output));
  const key = (cmd: Command) => (cmd.opts<{ idempotencyKey?: string }>().idempotencyKey ?? `sandboxctl-${randomUUID()}`);

  program.command('hosts')
    .description('list hosts with state, epoch, unprotected groups (a loss of the host would make them LOST), heartbeat age, lease and attestation')
    .argument('[host]', 'show one host in detail')
    .option('--state <state>', 'only hosts in this state (ready, draining, unattested, ...)', parseHostStateFilter)
    .action(async (host: string | undefined, opts: { state?: HostState }, cmd: Command) => withClient(cmd, async (client, g, t) => {
      if (host !== undefined) {
        const res = await call(client, client.getHost, { hostId: host }, t);
        print(g, GetHostResponse.toJSON(res), () => {
          const h = res.host!;
          const a = h.attestation;
          return [
            table(HOST_HEADER, hostRows([h], now())),
            '',
            `agent sha:     ${a?.agentBuildSha || '-'}`,
            `api sha:       ${a?.apiSha || '-'}`,
            `image:         ${a?.imageRef || '-'} (${a?.imageDigest || '-'})`,
            `docker:        ${a?.engineVersion || '-'} / ${a?.storageDriver || '-'}`,
            `capacity:      ${h.capacity?.usedMembers ?? 0}/${h.capacity?.maxMembers ?? 0} members`,
            `mismatches:    ${h.attestationMismatches.join('; ') || '-'}`,
          ].join('\n');
        });
        return;
      }
      const hosts: Host[] = [];
      let pageToken = '';
      do {
        const res = await call(client, client.listHosts, { state: opts.state ?? HostState.UNSPECIFIED, pageSize: 1000, pageToken }, t);
        hosts.push(...res.hosts);
        pageToken = res.nextPageToken;
      } while (pageToken !== '');
      // The table's UNPROTECTED column: one pass over the groups (JSON/YAML keep the API's shape).
      const byHost = new Map<string, number>();
      if (g.output === 'table') {
        for (const grp of await listAllGroups(client, t)) if (unprotected(grp)) byHost.set(grp.hostId, (byHost.get(grp.hostId) ?? 0) + 1);
      }
      print(g, ListHostsResponse.toJSON({ hosts, nextPageToken: '' }), () => table(HOST_LIST_HEADER, hostRows(hosts, now(), byHost)));
    }));

  program.command('groups')
    .description('list sandbox groups: whether each is protected (stopped cleanly with a checkpoint, so it survives its host) and how long it has been idle')
    .argument('[group]', 'show one group with its members')
    .option('--host <host>', 'only groups placed on this host')
    .option('--state <state>', 'only groups in this state (running, stopped, lost, ...)', parseGroupStateFilter)
    .action(async (group: string | undefined, opts: { host?: string; state?: GroupState }, cmd: Command) => withClient(cmd, async (client, g, t) => {
      if (group !== undefined) {
        const res = await call(client, client.getGroup, { groupId: group }, t);
        print(g, GetGroupResponse.toJSON(res), () => [
          table(GROUP_HEADER, groupRows([res.group!], now())),
          '',
          table(['MEMBER', 'STATE', 'LOCATOR', 'TURNS', 'CONTAINER', 'LOSS'], (res.group?.members ?? []).map((m) => [
            m.memberId, String(m.state), m.savedLocator || '-', String(m.completedTurns), short(m.containerId), m.lossReason || '-',
          ])),
        ].join('\n'));
        return;
      }
      const groups: Group[] = [];
      let pageToken = '';
      do {
        const res = await call(client, client.listGroups, { hostId: opts.host ?? '', state: opts.state ?? GroupState.UNSPECIFIED, pageSize: 1000, pageToken }, t);
        groups.push(...res.groups);
        pageToken = res.nextPageToken;
      } while (pageToken !== '');
      print(g, ListGroupsResponse.toJSON({ groups, nextPageToken: '' }), () => table(GROUP_HEADER, groupRows(groups, now())));
    }));

  program.command('turns')
    .description("a group's last turn ends per member (the last 8): what each turn end reported and what was decided")
    .argument('<group>')
    .addHelpText('after', '\nBefore blaming a checkpoint or a restore for a forgotten conversation, compare what was sent (CONTEXT,\nIN and the saved locator) with how each turn ended (END, PROCESS, OBSERVED, OUTCOME).')
    .action(async (group: string, _opts: unknown, cmd: Command) => withClient(cmd, async (client, g, t) => {
      const res = await call(client, client.getGroup, { groupId: group, includeTurns: true }, t);
      print(g, GetGroupResponse.toJSON(res), () => {
        const members = res.group?.members ?? [];
        return (res.turns?.members ?? []).map((m) => {
          const member = members.find((x) => x.memberId === m.memberId);
          const title = `member ${m.memberId} (${stateName(cliKindToJSON(member?.kind ?? 0), 'CLI_KIND_').toLowerCase()}), saved locator ${member?.savedLocator || '-'}, ${member?.completedTurns ?? 0} completed turn(s)`;
          return [title, m.turns.length === 0 ? '  no turn end recorded' : table(TURN_HEADER, turnRows(m.turns))].join('\n');
        }).join('\n\n') || `group ${group}: no members`;
      });
    }));

  program.command('checkpoints')
    .description('list checkpoints and whether each could be used now')
    .option('--group <group>', 'only checkpoints of this group')
    .action(async (opts: { group?: string }, cmd: Command) => withClient(cmd, async (client, g, t) => {
      const checkpoints: CheckpointInfo[] = [];
      let pageToken = '';
      do {
        const res = await call(client, client.listCheckpoints, { groupId: opts.group ?? '', pageSize: 1000, pageToken }, t);
        checkpoints.push(...res.checkpoints);
        pageToken = res.nextPageToken;
      } while (pageToken !== '');
      print(g, ListCheckpointsResponse.toJSON({ checkpoints, nextPageToken: '' }), () =>
        table(['CHECKPOINT', 'GROUP', 'SOURCE-HOST', 'AGE', 'SIZE', 'LATEST', 'USABLE'], checkpointRows(checkpoints, now())));
    }));

  program.command('drain')
    .description('stop, checkpoint and move every group off a host, then keep it out of placement')
    .argument('<host>')
    .option('--reason <text>', 'why, for the event log', '')
    .option('--idempotency-key <key>', 'repeat a previous call safely')
    .action(async (host: string, opts: { reason: string }, cmd: Command) => withClient(cmd, async (client, g, t) => {
      const res = await call(client, client.drainHost, { idempotencyKey: key(cmd), hostId: host, reason: opts.reason }, t);
      print(g, DrainHostResponse.toJSON(res), () => `host ${host} ${hostState(res.host?.state ?? HostState.UNSPECIFIED)}: ${res.host?.groupCount ?? 0} group(s) to move`);
    }));

  program.command('remove')
    .description('drain a host, then remove it (its epoch is revoked)')
    .argument('<host>')
    .option('--force', 'skip the drain: groups on the host are handled as unplanned loss (restored from a checkpoint elsewhere, or LOST)')
    .option('--reason <text>', 'why, for the event log', '')
    .option('--idempotency-key <key>', 'repeat a previous call safely')
    .action(async (host: string, opts: { force?: boolean; reason: string }, cmd: Command) => withClient(cmd, async (client, g, t) => {
      const res = await call(client, client.removeHost, { idempotencyKey: key(cmd), hostId: host, reason: opts.reason, force: opts.force === true }, t);
      print(g, RemoveHostResponse.toJSON(res), () => `host ${host} ${hostState(res.host?.state ?? HostState.UNSPECIFIED)}`);
    }));

  program.command('migrate')
    .description('move a cleanly stopped group to another host via a checkpoint')
    .argument('<group>')
    .option('--to <host>', 'target host (default: placement chooses a READY host)')
    .option('--idempotency-key <key>', 'repeat a previous call safely')
    .action(async (group: string, opts: { to?: string }, cmd: Command) => withClient(cmd, async (client, g, t) => {
      // A migration moves whole writable layers: give it at least five minutes.
      const res = await call(client, client.migrateGroup, { idempotencyKey: key(cmd), groupId: group, targetHostId: opts.to ?? '' }, t, Math.max(t, 300_000));
      print(g, MigrateGroupResponse.toJSON(res), () =>
        `group ${group} ${groupState(res.group?.state ?? GroupState.UNSPECIFIED)} on ${res.group?.hostId ?? '-'} (checkpoint ${res.checkpointId}, ${res.durationMs} ms)${res.group?.lossReason ? ` loss=${res.group.lossReason}` : ''}`);
      if (res.group?.state === GroupState.LOST) throw new ExitCode(1);
    }));

  program.command('destroy')
    .description('destroy a group: containers removed, checkpoints garbage-collected')
    .argument('<group>')
    .option('--idempotency-key <key>', 'repeat a previous call safely')
    .action(async (group: string, _opts: unknown, cmd: Command) => withClient(cmd, async (client, g, t) => {
      const res = await call(client, client.destroyGroup, { idempotencyKey: key(cmd), groupId: group }, t);
      print(g, DestroyGroupResponse.toJSON(res), () => `group ${group} ${groupState(res.group?.state ?? GroupState.UNSPECIFIED)}`);
    }));

  program.command('verify')
    .description('deployment verification: SHAs vs expected, reverse probe, heartbeat age; exits 1 on any mismatch')
    .argument('[hosts...]', 'hosts to verify (default: every host not REMOVED)')
    .option('--probe-timeout <ms>', 'reverse probe timeout per host', parseNonNegativeInt, 5_000)
    .action(async (hosts: string[], opts: { probeTimeout: number }, cmd: Command) => withClient(cmd, async (client, g, t) => {
      const res = await call(client, client.verify, { hostIds: hosts, probeTimeoutMs: opts.probeTimeout }, t, Math.max(t, opts.probeTimeout * 2 + 5_000));
      print(g, VerifyResponse.toJSON(res), () => {
        // Exact SHAs (R-H7), one per line so they compare by eye with the table below.
        const lines = [
          `control plane:      ${res.controlPlaneReplica} build ${exact(res.controlPlaneBuildSha)}`,
          `expected api sha:   ${exact(res.expectedApiSha)}`,
          `allowed agent shas: ${res.allowedAgentBuildShas.join(',') || '-'}`,
          `expected bridge:    ${res.expectedBridgeVersion}`,
          '',
          table(['HOST', 'STATE', 'AGENT-SHA', 'API-SHA', 'IMAGE', 'BRIDGE', 'REVERSE-PROBE', 'HEARTBEAT', 'RESULT'], verifyRows(res.hosts)),
        ];
        for (const h of res.hosts) for (const m of h.mismatches) lines.push(`${h.hostId}: ${m}`);
        if (res.hosts.length === 0) lines.push('no hosts to verify');
        lines.push('', res.ok ? 'verify: OK' : 'verify: MISMATCH');
        return lines.join('\n');
      });
      if (!res.ok) throw new ExitCode(1);
    }));

  program.command('nats-permissions')
    .description("a host's NATS publish/subscribe allow-lists for its own credentials; offline, no server needed")
    .argument('<host>', 'host id (the Kubernetes node name in-cluster)')
    .option('--nkey <public-key>', "the host user's nkey public key (U…) for the nats-server user entry")
    .option('--nsc', 'print `nsc edit user` flags for an operator-mode (JWT) user instead')
    .option('--chart-user', 'print the user entry as JSON, for the Helm chart\'s nats.server.authorization.users list (needs --nkey)')
    .action((host: string, opts: { nkey?: string; nsc?: boolean; chartUser?: boolean }, cmd: Command) => {
      const g = globals(cmd);
      let perms;
      try {
        perms = hostPermissions(host);
      } catch (err) {
        throw new UsageError(`host id: ${(err as Error).message}`);
      }
      if (opts.nkey !== undefined && !/^U[A-Z2-7]{55}$/.test(opts.nkey)) throw new UsageError('--nkey must be an nkey user public key (U…)');
      const q = (s: string): string => JSON.stringify(s);
      if (opts.chartUser) {
        if (opts.nkey === undefined) throw new UsageError('--chart-user needs --nkey');
        io.out(JSON.stringify(natsUserEntry(opts.nkey, perms)));
        return;
      }
      print(g, { host, ...perms }, () => {
        if (opts.nsc) {
          // Single quotes: the subjects hold `$` and `>`, which a shell would expand or redirect.
          const sq = (s: string): string => `'${s}'`;
          const flags = [...perms.publish.map((s) => `--allow-pub ${sq(s)}`), ...perms.subscribe.map((s) => `--allow-sub ${sq(s)}`), '--allow-pub-response'];
          return `nsc edit user --name ${sq(host)} \\\n  ${flags.join(' \\\n  ')}`;
        }
        return [
          `# nats-server authorization entry of host ${host} (inside authorization { users = [ ... ] })`,
          `{ nkey: ${q(opts.nkey ?? '<public key of the host user>')}, permissions: {`,
          `    publish: { allow: [${perms.publish.map(q).join(', ')}] },`,
          `    subscribe: { allow: [${perms.subscribe.map(q).join(', ')}] },`,
          '    allow_responses: true } }',
        ].join('\n');
      });
    });

  program.command('preflight')
    .summary('model-context preflight against an Anthropic Messages gateway; exits 1 unless every call passed')
    .description('optional pre-release model-context preflight against an Anthropic Messages-compatible gateway, not the control plane: '
      + '5 case kinds (greeting, repeated_question, task, fact_update, no_history) × --repetitions streamed calls; reports recall_passed and '
      + `thinking_observed; exits 0 only if every call passed. --timeout is the deadline of each call (default ${LIMITS.timeoutMs.default} ms here)`)
    .requiredOption('--gateway <url>', 'gateway base URL, http(s), no credentials or query; calls POST <url>/v1/messages')
    .requiredOption('--model <id>', 'model id to ask (required: no default is guessed)')
    .requiredOption('--key-file <file>', 'file holding the gateway API key, mode 0600 or stricter (refused otherwise); the key is never taken from argv or env')
    .option('--repetitions <n>', `repetitions of the 5 cases, ${LIMITS.repetitions.min}..${LIMITS.repetitions.max}`, String(LIMITS.repetitions.default))
    .option('--allow-plain-http', 'allow an http:// gateway that is not on loopback (the key would cross the network unencrypted)')
    .option('--max-tokens <n>', `max_tokens of each call, ${LIMITS.maxTokens.min}..${LIMITS.maxTokens.max} (stop_reason max_tokens is a failure)`, String(LIMITS.maxTokens.default))
    .option('--thinking <setting>', 'adaptive-high: ask for the pinned Claude Code\'s own thinking setting (thinking adaptive, effort high); off: send none', 'adaptive-high')
    .option('--proxy <url>', 'reach the gateway through this http:// proxy (CONNECT for https); default HTTPS_PROXY/HTTP_PROXY unless NO_PROXY names the gateway; none: no proxy')
    // Only to refuse it, without echoing the value: a key on the command line is in ps and shell history.
    .addOption(new Option('--api-key <key>').hideHelp())
    .action(async (opts: { gateway: string; model: string; keyFile: string; repetitions: string; maxTokens: string; thinking: string; proxy?: string; allowPlainHttp?: boolean; apiKey?: string }, cmd: Command) => {
      const g = globals(cmd);
      if (opts.apiKey !== undefined) throw new UsageError('the gateway key is never taken from the command line (ps and shell history show it): put it in a file (chmod 600) and pass --key-file');
      if (g.key !== undefined) throw new UsageError('--key is the admin client TLS key and preflight does not use it; the gateway key is read only from --key-file');
      const gateway = parseGateway(opts.gateway);
      const model = parseModel(opts.model);
      const repetitions = boundedInt(opts.repetitions, '--repetitions', LIMITS.repetitions.min, LIMITS.repetitions.max);
      const maxTokens = boundedInt(opts.maxTokens, '--max-tokens', LIMITS.maxTokens.min, LIMITS.maxTokens.max);
      if (opts.thinking !== 'adaptive-high' && opts.thinking !== 'off') throw new UsageError('--thinking must be adaptive-high or off');
      const thinking: ThinkingSetting = opts.thinking;
      const proxy = proxyFor(gateway, opts.proxy, env);
      const timeoutMs = program.getOptionValueSource('timeout') === 'cli'
        ? boundedInt(String(g.timeout), '--timeout', LIMITS.timeoutMs.min, LIMITS.timeoutMs.max)
        : LIMITS.timeoutMs.default;
      // Refused before the key is even read: a plain-http gateway off loopback would carry it in clear.
      if (gateway.protocol === 'http:' && !isLoopback(gateway)) {
        if (opts.allowPlainHttp !== true) throw new UsageError(`${gateway.host} is plain http: the key would cross the network unencrypted; use https, or --allow-plain-http`);
        io.err(`sandboxctl: warning: ${gateway.host} is plain http: the key crosses the network unencrypted`);
      }
      const key = await readKeyFile(opts.keyFile);
      const redact = redactor(key);
      let report;
      try {
        report = await runPreflight({ gateway, model, repetitions, maxTokens, timeoutMs, thinking, ...(proxy !== undefined ? { proxy } : {}) }, key, { randomBytes: (n) => randomBytes(n), now: () => Date.now() });
      } catch (err) {
        throw new Error(redact((err as Error).message ?? String(err)));
      }
      io.out(redact(g.output === 'table' ? renderPreflight(report) : structured(report, g.output)));
      if (!report.ok) throw new ExitCode(1);
    });

  program.command('events')
    .description('the audit log, oldest first; -f keeps following')
    .option('-f, --follow', 'keep streaming new events')
    .option('--from <seq>', 'first sequence number', parseNonNegativeInt, 0)
    .option('--subject <kind/id>', 'only events about one subject, e.g. group/g-1234 or host/host-a')
    .option('--limit <n>', 'stop after n events (default 1000 without -f)', parseNonNegativeInt, 0)
    .action(async (opts: { follow?: boolean; from: number; subject?: string; limit: number }, cmd: Command) => withClient(cmd, async (client, g, t) => {
      let subjectKind = '';
      let subjectId = '';
      if (opts.subject !== undefined) {
        const slash = opts.subject.indexOf('/');
        subjectKind = slash < 0 ? opts.subject : opts.subject.slice(0, slash);
        subjectId = slash < 0 ? '' : opts.subject.slice(slash + 1);
        if (subjectKind === '') throw new UsageError('--subject must be KIND or KIND/ID');
      }
      const request = ListEventsRequest.fromPartial({ fromSeq: opts.from, follow: opts.follow === true, subjectKind, subjectId, limit: opts.limit });
      // Following has no deadline (it ends on Ctrl-C); a plain read gets the usual one.
      const stream = client.listEvents(request, opts.follow ? {} : { deadline: Date.now() + t });
      const stop = () => stream.cancel();
      process.once('SIGINT', stop);
      try {
        await new Promise<void>((resolve, reject) => {
          stream.on('data', (msg: ListEventsResponse) => {
            const e = msg.event;
            if (e === undefined) return;
            io.out(g.output === 'table' ? eventLine(e) : streamed(ListEventsResponse.toJSON(msg), g.output));
          });
          stream.on('error', (err: { code?: number }) => (err.code === 1 /* CANCELLED by us */ ? resolve() : reject(toRunnerError(err))));
          stream.on('end', () => resolve());
        });
      } finally {
        process.removeListener('SIGINT', stop);
      }
    }));

  return program;
}

/** Runs argv (without node and script) and returns the exit code; never calls process.exit. */
export async function runCli(argv: readonly string[], io: CliIo, env: NodeJS.ProcessEnv = process.env): Promise<number> {
  const program = buildProgram(io, env);
  try {
    await program.parseAsync([...argv], { from: 'user' });
    return 0;
  } catch (err) {
    if (err instanceof ExitCode) return err.code;
    const e = err as { code?: string; exitCode?: number };
    if (typeof e.code === 'string' && e.code.startsWith('commander.')) {
      // Help and version exit 0; parse errors were already printed by commander.
      return e.exitCode === 0 ? 0 : 2;
    }
    if (err instanceof UsageError) {
      io.err(`sandboxctl: ${err.message}`);
      return 2;
    }
    if (err instanceof RunnerError) {
      io.err(`sandboxctl: ${err.codeName} ${err.reason}: ${err.message}`);
      return 1;
    }
    io.err(`sandboxctl: ${(err as Error).message ?? String(err)}`);
    return 1;
  }
}
