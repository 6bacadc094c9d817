// The proto comments name exactly the reasons the code has (issue 13: runner.proto and common.proto
// named `member_lost`, `no_recoverable_locator` and `ABORTED/idempotency_conflict`, which no code
// answers). Both sides are built, not listed by hand:
// - the code's reasons: the everyMemberOf lists of core's reason unions (a union member missing
//   from its list does not compile) and the agent protocol's union in src/wire;
// - the proto's: every lower_snake_case word (with an underscore) in a comment of proto/*.proto,
//   minus the protocol's own identifiers (field names) and the few words below that are not
//   reasons. Single words without an underscore (e.g. `malformed`) cannot be told from English
//   there, so the proto side checks them only in the other direction (each is named somewhere).
// And the API layer's own reasons (ApiError calls in src/) are core's ApiReason.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  API_REASONS,
  ATTESTATION_REASONS,
  COPY_DELETE_REASONS,
  COPY_KEEP_REASONS,
  COPY_STOP_REASONS,
  FENCED_NOTICE_REASONS,
  LOSS_REASONS,
  MEMBER_LOSS_REASONS,
  REASONS,
  REMOVAL_SOURCES,
  STORE_WIRE_REASONS,
  TURN_OUTCOMES,
} from '../../src/core/index.ts';
import { AGENT_REFUSAL_REASONS } from '../../src/wire/agent-protocol.ts';

const PROTO_DIR = 'proto/sandboxfleet/v1';

/** Words in proto comments that look like reasons and are not, each with what it is. */
const NOT_REASONS: Readonly<Record<string, string>> = {
  lower_snake_case: 'the naming rule of reasons',
  is_error: "a field of Claude Code's result event",
  api_retry: "Claude Code's system/api_retry event (TurnEndKind API_RETRY)",
  agent_end: "Pi's agent_end event (TurnEndKind AGENT_END)",
  control_plane: 'an Event.subject_kind value',
};

/** Every reason vocabulary of the code, by where it appears on the wire. */
const CODE_REASONS: Readonly<Record<string, readonly string[]>> = {
  'FleetError reasons (core errors.ts)': REASONS,
  'API layer (core ApiReason)': API_REASONS,
  'state store on the wire (core StoreWireReason)': STORE_WIRE_REASONS,
  'group loss (core LossReason)': LOSS_REASONS,
  'member loss (core MemberLossReason)': MEMBER_LOSS_REASONS,
  'turn outcomes (core TurnOutcome)': TURN_OUTCOMES,
  'attestation (core AttestationReason)': ATTESTATION_REASONS,
  'removal sources (core RemovalSource)': REMOVAL_SOURCES,
  'copy verdicts (core host-copy.ts)': [...COPY_KEEP_REASONS, ...COPY_STOP_REASONS, ...COPY_DELETE_REASONS],
  'fenced notices (core FencedNoticeReason)': FENCED_NOTICE_REASONS,
  'agent refusals (wire AgentRefusalReason)': AGENT_REFUSAL_REASONS,
};

interface ProtoText {
  /** Field names declared anywhere in proto/. */
  readonly fields: ReadonlySet<string>;
  /** lower_snake_case words with an underscore in comments → the files naming them. */
  readonly snakeWords: ReadonlyMap<string, readonly string[]>;
  /** All comment text, for single-word reasons. */
  readonly comments: string;
}

const SNAKE_WORD = /(?<![\w.*<-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?![\w/<-])/g;
const FIELD = /^\s*(?:optional\s+|repeated\s+)?[A-Za-z_][\w.]*(?:<[^>]*>)?\s+([a-z][a-z0-9_]*)\s*=\s*\d+/;

/** Reads every .proto file: field names, and the words of its comments. */
export function readProtoText(dir = PROTO_DIR): ProtoText {
  const fields = new Set<string>();
  const snakeWords = new Map<string, string[]>();
  const comments: string[] = [];
  for (const file of readdirSync(dir).filter((f) => f.endsWith('.proto')).sort()) {
    for (const line of readFileSync(join(dir, file), 'utf8').split('\n')) {
      const at = line.indexOf('//');
      const field = FIELD.exec(at < 0 ? line : line.slice(0, at));
      if (field?.[1] !== undefined) fields.add(field[1]);
      if (at < 0) continue;
      const comment = line.slice(at + 2);
      comments.push(comment);
      for (const [word] of comment.matchAll(SNAKE_WORD)) snakeWords.set(word, [...(snakeWords.get(word) ?? []), file]);
    }
  }
  return { fields, snakeWords, comments: comments.join('\n') };
}

/** The reasons a proto comment names: snake words that are neither a field name nor a known non-reason. */
export function protoReasons(p: ProtoText): Map<string, readonly string[]> {
  return new Map([...p.snakeWords].filter(([w]) => !p.fields.has(w) && NOT_REASONS[w] === undefined));
}

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return name === 'gen' ? [] : sourceFiles(path);
    return path.endsWith('.ts') ? [path] : [];
  });
}

describe('reasons named in proto/ and the reason unions of the code', () => {
  const proto = readProtoText();
  const code = new Set(Object.values(CODE_REASONS).flat());

  it('every reason a proto comment names exists in the code', () => {
    const unknown = [...protoReasons(proto)].filter(([w]) => !code.has(w)).map(([w, files]) => `${w} (${[...new Set(files)].join(', ')})`);
    expect(unknown, 'reasons named in proto comments that no code answers').toEqual([]);
  });

  it('every reason of the code is named in proto/ (the ErrorDetail catalogue in common.proto, or its field)', () => {
    const words = new Set(proto.comments.match(/[a-z][a-z0-9_]*/g) ?? []);
    const missing = Object.entries(CODE_REASONS).flatMap(([where, reasons]) => reasons.filter((r) => !words.has(r)).map((r) => `${r} [${where}]`));
    expect(missing, 'reasons of the code that no proto comment names').toEqual([]);
  });

  it('no proto comment claims the retired names or the metadata key the code never sets', () => {
    for (const stale of ['member_lost', 'no_recoverable_locator', 'idempotency_conflict', 'context_state"']) expect(proto.comments).not.toContain(stale);
  });

  it('every ApiError raised in src/ carries one of core\'s ApiReason', () => {
    const raised = sourceFiles('src').flatMap((file) => [...readFileSync(file, 'utf8').matchAll(/new ApiError\(\s*[\w.]+,\s*'([^']+)'/g)].map((m) => `${m[1]} (${file})`));
    expect(raised.length).toBeGreaterThan(0);
    expect(raised.filter((r) => !(API_REASONS as readonly string[]).includes(r.split(' ')[0]!))).toEqual([]);
  });

  it('the parser finds what it must (a test that cannot fail is no test)', () => {
    const sample = join(PROTO_DIR, 'common.proto');
    expect(readFileSync(sample, 'utf8')).toContain('conversation_lost');
    expect(protoReasons(proto).has('conversation_lost')).toBe(true);
    // A field name is not a reason, even when it is also written in a comment.
    expect(proto.fields.has('idempotency_key')).toBe(true);
    expect(protoReasons(proto).has('idempotency_key')).toBe(false);
    // What the defect looked like: a comment naming a reason no code has is caught.
    const planted: ProtoText = { ...proto, snakeWords: new Map([...proto.snakeWords, ['member_lost', ['runner.proto']]]) };
    expect([...protoReasons(planted).keys()].filter((w) => !code.has(w))).toEqual(['member_lost']);
  });
});
