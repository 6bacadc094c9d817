// The local fleet's status (R-I8): one snapshot of hosts, groups and the latest events, read straight
// from the state store, rendered two ways: the terminal table `npm start` prints, and the web status
// page it serves (auto-refreshing), so a newcomer can watch a drain move groups host to host. The
// page also lists the latest turn ends recorded in the group records (what each turn end reported
// and what was decided), the same evidence `sandboxctl turns <group>` shows.
// Rendering is pure (snapshot in, text out); everything shown is escaped: ids and reasons come from
// the store.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { decodeTurnFlags, type GroupRecord, type HeartbeatRecord, type HostRecord } from '../../src/control-plane/records.ts';
import type { SequencedEvent } from '../../src/store/event-log.ts';
import { protection } from '../../src/core/idle-stop.ts';

export interface StatusSnapshot {
  readonly nowMs: number;
  readonly hosts: readonly HostRecord[];
  readonly heartbeats: readonly HeartbeatRecord[];
  readonly groups: readonly GroupRecord[];
  /** Newest last. */
  readonly events: readonly SequencedEvent[];
}

interface HostRow {
  readonly hostId: string;
  readonly state: string;
  readonly epoch: string;
  readonly heartbeat: string;
  readonly groups: string;
  /** Its groups a loss of the host would make LOST now (running, or stopped without a clean stop and checkpoint). */
  readonly unprotected: string;
  readonly attestation: string;
}

/**
 * Core's protection rule on a stored record; the snapshot holds no checkpoint records, so a latest
 * checkpoint is taken as of the group's state. Undefined for LOST/DESTROYED.
 */
export function unprotectedSince(g: GroupRecord): number | undefined {
  const lc = g.lifecycle;
  const p = protection({
    state: lc.state, stopClean: lc.stop?.clean, activityVersion: lc.activityVersion, lastActivityAtMs: lc.lastActivityAtMs,
    runningSinceMs: lc.runningSinceMs, createdAtMs: g.createdAtMs, checkpointActivityVersion: g.latestCheckpointId !== undefined ? lc.activityVersion : undefined,
  });
  return p.protected === false ? p.sinceMs : undefined;
}

const TERMINAL_STATES = new Set(['LOST', 'DESTROYED']);

function hostRows(s: StatusSnapshot): HostRow[] {
  return s.hosts.map((h) => {
    const hb = s.heartbeats.find((x) => x.hostId === h.hostId);
    const age = hb && hb.epoch === h.lifecycle.epoch ? `${((s.nowMs - hb.receivedAtMs) / 1000).toFixed(1)}s` : '-';
    const live = s.groups.filter((g) => g.lifecycle.hostId === h.hostId && !TERMINAL_STATES.has(g.lifecycle.state));
    const groups = live.length;
    const exposed = live.map(unprotectedSince).filter((t) => t !== undefined);
    return {
      hostId: h.hostId,
      state: h.lifecycle.state,
      epoch: String(h.lifecycle.epoch),
      heartbeat: age,
      groups: String(groups),
      unprotected: exposed.length === 0 ? '0' : `${exposed.length} (oldest ${Math.round((s.nowMs - Math.min(...exposed)) / 1000)}s)`,
      attestation: h.attestation.mismatches.length === 0 ? 'ok' : h.attestation.mismatches.join('; '),
    };
  });
}

function groupCounts(s: StatusSnapshot): string {
  const byState = new Map<string, number>();
  for (const g of s.groups) byState.set(g.lifecycle.state, (byState.get(g.lifecycle.state) ?? 0) + 1);
  const exposed = s.groups.filter((g) => unprotectedSince(g) !== undefined).length;
  return [...[...byState].map(([state, n]) => `${state}=${n}`), ...(s.groups.length > 0 ? [`unprotected=${exposed}`] : [])].join(' ') || 'none';
}

/** The terminal table. */
export function renderStatusTable(s: StatusSnapshot): string {
  const lines = ['HOST        STATE        EPOCH  HEARTBEAT  GROUPS  UNPROTECTED       ATTESTATION'];
  for (const r of hostRows(s)) lines.push(`${r.hostId.padEnd(12)}${r.state.padEnd(13)}${r.epoch.padEnd(7)}${r.heartbeat.padEnd(11)}${r.groups.padEnd(8)}${r.unprotected.padEnd(18)}${r.attestation.slice(0, 60)}`);
  lines.push(`groups: ${groupCounts(s)}    (${new Date(s.nowMs).toISOString()})`);
  return `${lines.join('\n')}\n`;
}

const escapeHtml = (v: string): string => v.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);

function table(header: readonly string[], rows: readonly (readonly string[])[], rowClass: (row: readonly string[]) => string = () => ''): string {
  const head = `<tr>${header.map((h) => `<th>${escapeHtml(h)}</th>`).join('')}</tr>`;
  const body = rows.length === 0 ? `<tr><td colspan="${header.length}">none</td></tr>` : rows.map((r) => `<tr class="${rowClass(r)}">${r.map((c) => `<td>${escapeHtml(c)}</td>`).join('')}</tr>`).join('\n');
  return `<table>${head}\n${body}</table>`;
}

/** How many of the newest turn ends the page lists (each group record keeps its members' last 8). */
export const STATUS_TURNS = 20;

/** The newest turn ends across every group, newest first: [completed, group/member, turn, context, end, process, observed, outcome]. */
function turnRows(s: StatusSnapshot): string[][] {
  const all = s.groups.flatMap((g) => g.members.flatMap((m) => (m.turns ?? []).map((t) => ({ g, m, t }))));
  const completed = (t: { beganAtMs: number; durationMs: number }): number => t.beganAtMs + t.durationMs;
  all.sort((a, b) => completed(b.t) - completed(a.t));
  return all.slice(0, STATUS_TURNS).map(({ g, m, t }) => {
    const f = decodeTurnFlags(t.flags);
    const end = [t.kind, f.nativeTurnEnded ? 'ended' : 'not ended', ...(f.nativeTurnEnded ? [f.succeeded ? 'ok' : 'failed'] : [])].join(' ');
    const process = f.processExited ? `exited ${t.exitCode ?? '?'}${f.exitConfirmed ? '' : ' (unconfirmed)'}` : 'kept';
    return [
      new Date(completed(t)).toISOString().slice(11, 23),
      `${g.groupId}/${m.session.memberId}`,
      t.turnId,
      `${t.contextState} (gen ${t.generation})`,
      end,
      process,
      t.observedLocator ?? '-',
      t.refusal !== undefined ? `refused ${t.refusal}` : t.outcome,
    ];
  });
}

const stateClass = (state: string): string => (['LOST', 'DEAD', 'UNATTESTED'].includes(state) ? 'bad' : ['DRAINING', 'MIGRATING', 'SUSPECT', 'STOPPING'].includes(state) ? 'moving' : '');

/** The web status page: hosts, groups, the latest events; refreshes itself every `refreshS` seconds. */
export function renderStatusPage(s: StatusSnapshot, refreshS = 2): string {
  const hosts = hostRows(s).map((r) => [r.hostId, r.state, r.epoch, r.heartbeat, r.groups, r.unprotected, r.attestation]);
  const groups = [...s.groups]
    .sort((a, b) => a.groupId.localeCompare(b.groupId))
    .map((g) => {
      const since = unprotectedSince(g);
      const prot = TERMINAL_STATES.has(g.lifecycle.state) ? '' : since === undefined ? 'yes' : `no, ${Math.round((s.nowMs - since) / 1000)}s`;
      return [g.groupId, g.conversationId, g.lifecycle.state, g.lifecycle.hostId, String(g.lifecycle.generation), prot, g.members.map((m) => `${m.session.memberId}:${m.session.phase}`).join(' '), g.lifecycle.lostReason ?? ''];
    });
  const turns = turnRows(s);
  const events = [...s.events].reverse().map(({ seq, event: e }) => [String(seq), new Date(e.timeMs).toISOString().slice(11, 23), `${e.subjectKind}/${e.subjectId}`, e.type, e.toState ?? '', e.reason ?? '']);
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="${refreshS}">
<title>Sandbox Fleet: local fleet</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222 }
table { border-collapse: collapse; margin-bottom: 1.5em } th, td { padding: 2px 10px; text-align: left; border-bottom: 1px solid #ddd }
th { background: #f3f3f3 } tr.bad td { color: #b00020 } tr.moving td { color: #a05a00 } .muted { color: #777 }
</style></head><body>
<h1>Sandbox Fleet: local fleet</h1>
<p class="muted">${escapeHtml(new Date(s.nowMs).toISOString())}, refreshed every ${refreshS} s. Groups: ${escapeHtml(groupCounts(s))}. Try <code>sandboxctl --insecure drain host-a</code> and watch the groups move.</p>
<h2>Hosts</h2>
${table(['host', 'state', 'epoch', 'heartbeat', 'groups', 'unprotected', 'attestation'], hosts, (r) => stateClass(r[1] ?? ''))}
<h2>Groups</h2>
<p class="muted">Protected: stopped cleanly with a checkpoint, so the group survives the loss of its host; a running group does not (idle groups are stopped and checkpointed after SANDBOXFLEET_IDLE_STOP_AFTER_MS).</p>
${table(['group', 'conversation', 'state', 'host', 'generation', 'protected', 'members', 'lost reason'], groups, (r) => stateClass(r[2] ?? ''))}
<h2>Latest turn ends</h2>
<p class="muted">What each turn end reported and what was decided (<code>sandboxctl turns GROUP</code> has every member's last 8). Compare what was sent with how the turn ended before blaming a checkpoint or a restore.</p>
${turns.length === 0 ? '<p class="muted">No turn end recorded yet.</p>' : table(['completed (UTC)', 'group/member', 'turn', 'context', 'end', 'process', 'observed session', 'outcome'], turns, (r) => ((r[7] ?? '').startsWith('refused') || r[7] === 'unconfirmed' ? 'bad' : ''))}
<h2>Latest events</h2>
${table(['seq', 'time (UTC)', 'subject', 'type', 'to state', 'reason'], events, (r) => (r[4] === 'LOST' ? 'bad' : ''))}
</body></html>
`;
}

/** Serves the page at / and the snapshot at /status.json, on loopback. */
export async function startStatusServer(port: number, snapshot: () => Promise<StatusSnapshot>): Promise<{ url: string; close: () => Promise<void> }> {
  const server: Server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    if (req.method !== 'GET' || (path !== '/' && path !== '/status.json')) {
      res.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' }).end('not found\n');
      return;
    }
    snapshot().then(
      (s) => {
        if (path === '/status.json') res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(s));
        else res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' }).end(renderStatusPage(s));
      },
      (err: unknown) => res.writeHead(503, { 'content-type': 'text/plain; charset=utf-8' }).end(`state store unavailable: ${err instanceof Error ? err.message : String(err)}\n`),
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', () => resolve());
  });
  const { port: bound } = server.address() as AddressInfo;
  return { url: `http://127.0.0.1:${bound}/`, close: () => new Promise<void>((r) => server.close(() => r())) };
}
