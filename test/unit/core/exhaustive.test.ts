// everyMemberOf: a list that must name every member of a union does not compile with one missing
// (checked by `npm run typecheck`: an unused @ts-expect-error is itself an error).
import { describe, expect, it } from 'vitest';
import { everyMemberOf } from '../../../src/core/index.ts';

type Colour = 'red' | 'green' | 'blue';

describe('everyMemberOf', () => {
  it('returns a complete list as is, and rejects incomplete or foreign ones at compile time', () => {
    const all = everyMemberOf<Colour>()(['red', 'green', 'blue']);
    expect(all).toEqual(['red', 'green', 'blue']);
    // @ts-expect-error 'blue' is missing
    everyMemberOf<Colour>()(['red', 'green']);
    // @ts-expect-error 'pink' is not a Colour
    everyMemberOf<Colour>()(['red', 'green', 'blue', 'pink']);
  });
});
