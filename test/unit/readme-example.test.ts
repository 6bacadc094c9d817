// The README's runner example must be the code in examples/runner-turn.ts, which the typecheck
// compiles against the real SDK: documentation that cannot silently rot.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';

function readmeSnippet(source: string): string {
  const regions = [...source.matchAll(/\/\* README:start \*\/\n([\s\S]*?)\n\s*\/\* README:end \*\//g)].map((m) => m[1] ?? '');
  const dedent = (region: string) => {
    const lines = region.split('\n');
    const indent = Math.min(...lines.filter((l) => l.trim() !== '').map((l) => l.length - l.trimStart().length));
    return lines.map((l) => l.slice(indent)).join('\n');
  };
  return regions.map(dedent).join('\n').replace("'../src/runner-sdk/index.ts'", "'sandbox-fleet/runner-sdk'");
}

describe('README runner example', () => {
  it('is exactly the typechecked example in examples/runner-turn.ts', () => {
    const snippet = readmeSnippet(readFileSync('examples/runner-turn.ts', 'utf8'));
    expect(snippet.split('\n').length).toBeGreaterThan(5);
    const readme = readFileSync('README.md', 'utf8');
    expect(readme).toContain('```ts\n' + snippet + '\n```');
  });
});
