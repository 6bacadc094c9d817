// A heartbeat's bytes, read without decoding all of them (the control plane's heartbeat path,
// host-registry.ts): most beats leave their container entries out (host-agent/inventory-elision.ts)
// and are told apart by one pass over the top-level fields; a beat that carries them is split into
// its container entries' bytes and the rest, so entries identical to a host's previous ones are
// compared, not decoded again. Anything of a shape these do not handle answers "don't know", and the
// caller decodes the message in full, which has the last word.
import { BinaryReader } from '@bufbuild/protobuf/wire';

/** One field of an encoded message: its tag and where it starts and ends (tag included). */
interface WireField {
  readonly tag: number;
  readonly start: number;
  /** Where a length-delimited field's payload starts (after tag and length). */
  readonly payload: number;
  readonly end: number;
}

/** The top-level fields of `buf` in order; undefined for anything but plain fields (groups, tag 0, bad data). */
function wireFields(buf: Uint8Array): WireField[] | undefined {
  const reader = new BinaryReader(buf);
  const fields: WireField[] = [];
  while (reader.pos < reader.len) {
    const start = reader.pos;
    const tag = reader.uint32();
    const wireType = tag & 7;
    if (tag === 0 || wireType === 3 || wireType === 4) return undefined;
    let payload = reader.pos;
    if (wireType === 2) {
      const length = reader.uint32();
      payload = reader.pos;
      reader.pos += length;
      if (reader.pos > reader.len) return undefined;
    } else {
      reader.skip(wireType);
    }
    fields.push({ tag, start, payload, end: reader.pos });
  }
  return fields;
}

/** The bytes of `fields` of `buf`, in order (a view when they are contiguous, else a copy). */
function joined(buf: Uint8Array, fields: readonly WireField[]): Uint8Array {
  if (fields.length === 0) return new Uint8Array(0);
  if (fields.every((f, i) => i === 0 || f.start === fields[i - 1]!.end)) return buf.subarray(fields[0]!.start, fields.at(-1)!.end);
  const out = new Uint8Array(fields.reduce((n, f) => n + f.end - f.start, 0));
  let at = 0;
  for (const f of fields) {
    out.set(buf.subarray(f.start, f.end), at);
    at += f.end - f.start;
  }
  return out;
}

/** Heartbeat field 5 (inventory), length-delimited; Inventory field 1 (containers), length-delimited. */
const HEARTBEAT_INVENTORY_TAG = (5 << 3) | 2;
const INVENTORY_CONTAINER_TAG = (1 << 3) | 2;
/** Heartbeat field 10 (containers_omitted), varint. */
const HEARTBEAT_OMITTED_TAG = (10 << 3) | 0;

/**
 * Does the heartbeat's last `containers_omitted` field say true (the last one wins, as in a full
 * decode)? One pass over the top-level fields, skipping payloads unread (no copies); false for anything the
 * scan does not handle, which then takes the path that decodes in full.
 */
export function omitsContainers(data: Uint8Array): boolean {
  try {
    const reader = new BinaryReader(data);
    let omitted = false;
    while (reader.pos < reader.len) {
      const tag = reader.uint32();
      const wireType = tag & 7;
      if (tag === 0 || wireType === 3 || wireType === 4 || wireType > 5) return false;
      if (tag === HEARTBEAT_OMITTED_TAG) omitted = reader.bool();
      else if (wireType === 0) while (data[reader.pos++]! & 0x80);
      else {
        // The length first: `reader.pos += reader.uint32()` would add it to the position before it.
        const size = wireType === 2 ? reader.uint32() : wireType === 1 ? 8 : 4;
        reader.pos += size;
      }
    }
    // Past the end: truncated data, for the full decode to refuse.
    return omitted && reader.pos === reader.len;
  } catch {
    return false;
  }
}

/**
 * A heartbeat split into its container entries (every Inventory field 1, in order, tags included),
 * the rest of its inventory, and the rest of the message — when it has exactly one inventory and
 * only plain fields. Decoding `rest` and `inventoryRest` and taking the containers decoded from
 * identical bytes gives what decoding the whole message gives.
 */
export function splitInventory(data: Uint8Array): { rest: Uint8Array; inventoryRest: Uint8Array; containers: Uint8Array } | undefined {
  try {
    const top = wireFields(data);
    const inventories = top?.filter((f) => f.tag === HEARTBEAT_INVENTORY_TAG) ?? [];
    if (top === undefined || inventories.length !== 1) return undefined;
    const inventory = inventories[0]!;
    const body = data.subarray(inventory.payload, inventory.end);
    const inner = wireFields(body);
    if (inner === undefined) return undefined;
    return {
      rest: joined(data, top.filter((f) => f !== inventory)),
      inventoryRest: joined(body, inner.filter((f) => f.tag !== INVENTORY_CONTAINER_TAG)),
      containers: joined(body, inner.filter((f) => f.tag === INVENTORY_CONTAINER_TAG)),
    };
  } catch {
    return undefined;
  }
}
