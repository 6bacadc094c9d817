// Loads the hand-written CLI stream fixtures (test/fixtures/cli-streams/<cli>/*.jsonl) and runs
// them through a detector, either as a real byte stream (driveDetector) or value by value.

import { createReadStream, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { driveDetector, type DriveResult, type TurnEndDetector } from '../../../src/runner-sdk/detectors/index.ts';

const root = fileURLToPath(new URL('../../fixtures/cli-streams/', import.meta.url));

export function fixturePath(cli: string, name: string): string {
  return `${root}${cli}/${name}`;
}

/** Streams the fixture file through the detector as a driver would (stops at the native end). */
export function driveFixture(cli: string, name: string, detector: TurnEndDetector): Promise<DriveResult> {
  // A small highWaterMark splits lines across chunks, like a pipe does.
  return driveDetector(createReadStream(fixturePath(cli, name), { highWaterMark: 97 }), detector);
}

/** The fixture's well-formed JSON lines, in order. */
export function fixtureEvents(cli: string, name: string): unknown[] {
  const out: unknown[] = [];
  for (const line of readFileSync(fixturePath(cli, name), 'utf8').split('\n')) {
    if (line.trim().length === 0) continue;
    try {
      out.push(JSON.parse(line));
    } catch {
      // Deliberately malformed fixture lines are the reader's business, not the detectors'.
    }
  }
  return out;
}
