// Lists that must name every member of a string union (metric labels pre-created at 0, reasons
// mirrored elsewhere): a missing member is a compile error at the list, never a silent gap.

/**
 * `everyMemberOf<U>()([...])` returns the list as a readonly tuple, and does not compile when a
 * member of U is missing from it (the error names the missing members as `missing`).
 */
export function everyMemberOf<U extends string>() {
  return <const L extends readonly U[]>(list: L & ([Exclude<U, L[number]>] extends [never] ? unknown : { readonly missing: Exclude<U, L[number]> })): L => list;
}
