// Host ids for property tests, built the way Kubernetes defines a node name (a DNS-1123 subdomain:
// lowercase alphanumeric labels that may hold "-" inside, joined by ".", at most 253 characters) and
// not from the product's own regex, so a test can check the rule against it. Two alphabets: a tiny
// one so that near-identical pairs (`a-b.a` vs `a.b-a`) come up often, and the full one.
import fc from 'fast-check';

function label(chars: string, maxInner: number): fc.Arbitrary<string> {
  const alnum = fc.constantFrom(...chars.split(''));
  const inner = fc.array(fc.constantFrom(...`${chars}-`.split('')), { maxLength: maxInner }).map((a) => a.join(''));
  return fc.oneof(alnum, fc.tuple(alnum, inner, alnum).map(([a, mid, b]) => `${a}${mid}${b}`));
}

const subdomain = (chars: string, maxInner: number, maxLabels: number): fc.Arbitrary<string> =>
  fc.array(label(chars, maxInner), { minLength: 1, maxLength: maxLabels }).map((ls) => ls.join('.')).filter((s) => s.length <= 253);

/** Any Kubernetes node name, biased towards short look-alikes and towards the 253 bound. */
export const hostIdArb: fc.Arbitrary<string> = fc.oneof(
  subdomain('ab0', 3, 4),
  subdomain('abcdefghijklmnopqrstuvwxyz0123456789', 20, 6),
  subdomain('abcdefghijklmnopqrstuvwxyz0123456789', 70, 8),
);

/** Kubernetes' IsDNS1123Subdomain, written without a regex (the reference the rule must equal). */
export function isKubernetesNodeName(s: string): boolean {
  if (s.length === 0 || s.length > 253) return false;
  const alnum = (c: string): boolean => (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
  return s.split('.').every((l) => l.length > 0 && alnum(l[0]!) && alnum(l[l.length - 1]!) && [...l].every((c) => alnum(c) || c === '-'));
}
