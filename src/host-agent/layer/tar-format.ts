// A small streaming tar (ustar + PAX) reader and header writer for writable layers (R-G3, R-R4).
// Why not tar-stream: it buffers PAX bodies of any size before a caller can refuse them (a memory
// bomb), and re-piping every data byte through two stream objects costs throughput we need (R-G3
// targets). Here headers are bounded before they are buffered, and file data passes through as
// zero-copy slices of the input. Only the subset GNU `tar --format=posix` and our own writer
// produce is understood; anything else is refused with a reason, never guessed at.
import { LayerRuleError, type LayerEntryType } from '../../core/layer-rules.ts';

export const BLOCK = 512;
const ZERO_BLOCK = Buffer.alloc(BLOCK);

/** One decoded entry (PAX records already applied). */
export interface TarHeader {
  name: string;
  type: LayerEntryType;
  mode: number;
  uid: number;
  gid: number;
  size: number;
  /** Whole seconds; `mtimePax` keeps sub-second precision when the source had it. */
  mtime: number;
  mtimePax?: string;
  linkName?: string;
  devMajor: number;
  devMinor: number;
  /** Extended attributes by name (values are raw bytes), from PAX `SCHILY.xattr.*`. */
  xattrs: Map<string, Buffer>;
}

/** Receives a parsed archive in order: entry, its data slices (regular files only), entryEnd. */
export interface TarSink {
  entry(header: TarHeader): void;
  data(slice: Buffer): void;
  entryEnd(): void;
}

const TYPE_BY_FLAG: Record<string, LayerEntryType> = {
  '0': 'file',
  '\0': 'file',
  '1': 'hardlink',
  '2': 'symlink',
  '3': 'char-device',
  '4': 'block-device',
  '5': 'directory',
  '6': 'fifo',
};
const FLAG_BY_TYPE: Record<LayerEntryType, string> = {
  file: '0',
  hardlink: '1',
  symlink: '2',
  'char-device': '3',
  'block-device': '4',
  directory: '5',
  fifo: '6',
};

function malformed(message: string, name?: string): LayerRuleError {
  return new LayerRuleError('malformed_tar', message, name);
}

function readString(block: Buffer, offset: number, length: number): string {
  const field = block.subarray(offset, offset + length);
  const end = field.indexOf(0);
  return field.toString('utf8', 0, end < 0 ? length : end);
}

/** Octal (NUL/space padded) or GNU base-256 (high bit set, positive only). */
function readNumber(block: Buffer, offset: number, length: number, what: string): number {
  const field = block.subarray(offset, offset + length);
  if ((field[0]! & 0x80) !== 0) {
    if (field[0] !== 0x80) throw malformed(`negative or huge base-256 ${what}`);
    let value = 0;
    for (let i = 1; i < length; i++) value = value * 256 + field[i]!;
    if (!Number.isSafeInteger(value)) throw malformed(`${what} out of range`);
    return value;
  }
  const text = field.toString('latin1').replace(/[\0 ]+$/, '').replace(/^ +/, '');
  if (text === '') return 0;
  if (!/^[0-7]+$/.test(text)) throw malformed(`bad octal ${what} ${JSON.stringify(text)}`);
  return parseInt(text, 8);
}

function checksumOf(block: Buffer): number {
  let sum = 0;
  for (let i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? 0x20 : block[i]!;
  return sum;
}

function decimal(buf: Buffer, what: string): number {
  const text = buf.toString('latin1');
  if (!/^[0-9]{1,16}$/.test(text)) throw malformed(`bad PAX ${what} ${JSON.stringify(text)}`);
  const value = Number(text);
  if (!Number.isSafeInteger(value)) throw malformed(`PAX ${what} out of range`);
  return value;
}

/** Parse `<len> <key>=<value>\n` records; values stay bytes (xattr values are binary). */
export function parsePaxRecords(body: Buffer): Map<string, Buffer> {
  const records = new Map<string, Buffer>();
  let pos = 0;
  while (pos < body.length) {
    if (body[pos] === 0) {
      // Trailing NUL padding is tolerated only as the very end.
      for (let i = pos; i < body.length; i++) if (body[i] !== 0) throw malformed('garbage after PAX records');
      break;
    }
    const space = body.indexOf(0x20, pos);
    if (space < 0 || space - pos > 10) throw malformed('bad PAX record length');
    const len = decimal(body.subarray(pos, space), 'record length');
    const end = pos + len;
    if (len < 5 || end > body.length || body[end - 1] !== 0x0a) throw malformed('bad PAX record framing');
    const eq = body.indexOf(0x3d, space + 1);
    if (eq < 0 || eq >= end) throw malformed('PAX record without =');
    records.set(body.toString('utf8', space + 1, eq), body.subarray(eq + 1, end - 1));
    pos = end;
  }
  return records;
}

type State = 'header' | 'pax' | 'data' | 'padding' | 'zero' | 'end';

/**
 * Push parser: feed buffers with push(), then call end(). Throws LayerRuleError on malformed input
 * or an oversize PAX body (checked against `maxPaxHeaderBytes` before buffering it).
 */
export class TarParser {
  private state: State = 'header';
  private readonly head = Buffer.alloc(BLOCK);
  private headFill = 0;
  private pax: Buffer | null = null;
  private paxFill = 0;
  private paxRecords: Map<string, Buffer> | null = null;
  private remaining = 0;
  private padding = 0;
  private current = '';

  constructor(
    private readonly sink: TarSink,
    private readonly maxPaxHeaderBytes: number,
  ) {}

  push(input: Buffer): void {
    let pos = 0;
    while (pos < input.length) {
      switch (this.state) {
        case 'header':
        case 'zero': {
          const take = Math.min(BLOCK - this.headFill, input.length - pos);
          input.copy(this.head, this.headFill, pos, pos + take);
          this.headFill += take;
          pos += take;
          if (this.headFill === BLOCK) {
            this.headFill = 0;
            this.onBlock();
          }
          break;
        }
        case 'pax': {
          const take = Math.min(this.pax!.length - this.paxFill, input.length - pos);
          input.copy(this.pax!, this.paxFill, pos, pos + take);
          this.paxFill += take;
          pos += take;
          if (this.paxFill === this.pax!.length) {
            this.paxRecords = parsePaxRecords(this.pax!);
            this.pax = null;
            this.state = this.padding > 0 ? 'padding' : 'header';
          }
          break;
        }
        case 'data': {
          const take = Math.min(this.remaining, input.length - pos);
          this.sink.data(input.subarray(pos, pos + take));
          this.remaining -= take;
          pos += take;
          if (this.remaining === 0) {
            this.sink.entryEnd();
            this.state = this.padding > 0 ? 'padding' : 'header';
          }
          break;
        }
        case 'padding': {
          const take = Math.min(this.padding, input.length - pos);
          this.padding -= take;
          pos += take;
          if (this.padding === 0) this.state = 'header';
          break;
        }
        case 'end': {
          // GNU tar pads the archive to its record size with zeros; anything else is smuggling.
          for (let i = pos; i < input.length; i++) if (input[i] !== 0) throw malformed('data after the end of the archive');
          pos = input.length;
          break;
        }
      }
    }
  }

  /** The input is over: it must have ended with the two zero blocks of a complete archive. */
  end(): void {
    if (this.state !== 'end' || this.headFill !== 0) throw malformed(`archive truncated (in ${this.state}${this.current ? ` of ${this.current}` : ''})`, this.current || undefined);
  }

  private onBlock(): void {
    const block = this.head;
    if (block.equals(ZERO_BLOCK)) {
      if (this.paxRecords !== null) throw malformed('PAX header without an entry');
      this.state = this.state === 'zero' ? 'end' : 'zero';
      return;
    }
    if (this.state === 'zero') throw malformed('single zero block inside the archive');
    if (readNumber(block, 148, 8, 'checksum') !== checksumOf(block)) throw malformed('header checksum mismatch');
    const magic = block.toString('latin1', 257, 263);
    if (magic !== 'ustar\0' && magic !== 'ustar ') throw malformed('not a ustar header');
    const flag = String.fromCharCode(block[156]!);
    const size = readNumber(block, 124, 12, 'size');
    const name = readString(block, 0, 100);
    if (flag === 'x') {
      if (this.paxRecords !== null) throw malformed('two PAX headers for one entry');
      if (size > this.maxPaxHeaderBytes) throw new LayerRuleError('pax_header_too_large', `PAX header of ${size} bytes exceeds ${this.maxPaxHeaderBytes}`, name);
      this.padding = (BLOCK - (size % BLOCK)) % BLOCK;
      if (size === 0) {
        this.paxRecords = new Map();
        this.state = this.padding > 0 ? 'padding' : 'header';
      } else {
        this.pax = Buffer.alloc(size);
        this.paxFill = 0;
        this.state = 'pax';
      }
      return;
    }
    const type = TYPE_BY_FLAG[flag];
    if (type === undefined) throw new LayerRuleError('unsupported_entry_type', `tar type flag ${JSON.stringify(flag)}`, name);
    const prefix = magic === 'ustar\0' ? readString(block, 345, 155) : '';
    const header: TarHeader = {
      name: prefix ? `${prefix}/${name}` : name,
      type,
      mode: readNumber(block, 100, 8, 'mode') & 0o7777,
      uid: readNumber(block, 108, 8, 'uid'),
      gid: readNumber(block, 116, 8, 'gid'),
      size,
      mtime: readNumber(block, 136, 12, 'mtime'),
      devMajor: readNumber(block, 329, 8, 'devmajor'),
      devMinor: readNumber(block, 337, 8, 'devminor'),
      xattrs: new Map(),
    };
    const linkName = readString(block, 157, 100);
    if (linkName !== '') header.linkName = linkName;
    if (this.paxRecords !== null) this.applyPax(header, this.paxRecords);
    this.paxRecords = null;
    // Only regular files carry data; writers disagree about data after hard links, so refuse it.
    if (header.type !== 'file' && header.size !== 0) throw malformed(`${header.type} with data`, header.name);
    this.current = header.name;
    this.sink.entry(header);
    this.remaining = header.size;
    this.padding = (BLOCK - (header.size % BLOCK)) % BLOCK;
    if (header.size === 0) {
      this.sink.entryEnd();
      this.state = 'header';
    } else this.state = 'data';
  }

  private applyPax(header: TarHeader, records: Map<string, Buffer>): void {
    for (const [key, value] of records) {
      if (key === 'path') header.name = value.toString('utf8');
      else if (key === 'linkpath') header.linkName = value.toString('utf8');
      else if (key === 'size') header.size = decimal(value, 'size');
      else if (key === 'uid') header.uid = decimal(value, 'uid');
      else if (key === 'gid') header.gid = decimal(value, 'gid');
      else if (key === 'mtime') {
        const text = value.toString('latin1');
        if (!/^[0-9]{1,12}(\.[0-9]{1,9})?$/.test(text)) throw malformed(`bad PAX mtime ${JSON.stringify(text)}`);
        header.mtime = Math.floor(Number(text));
        if (text.includes('.')) header.mtimePax = text;
      } else if (key.startsWith('SCHILY.xattr.')) header.xattrs.set(key.slice('SCHILY.xattr.'.length), value);
      else if (key.startsWith('GNU.sparse.')) throw new LayerRuleError('unsupported_entry_type', 'sparse files are not supported', header.name);
      // atime, ctime, uname, gname, charset, comment, ...: irrelevant to a layer's content.
    }
  }
}

// ---- writer --------------------------------------------------------------------------------------

const MAX_OCTAL_7 = 0o7777777;
const MAX_OCTAL_11 = 0o77777777777;

function paxRecord(key: string, value: Buffer): Buffer {
  const body = 1 + Buffer.byteLength(key) + 1 + value.length + 1; // ' ' key '=' value '\n'
  let len = body + String(body).length;
  if (String(len).length !== String(body).length) len = body + String(len).length;
  return Buffer.concat([Buffer.from(`${len} ${key}=`, 'utf8'), value, Buffer.from('\n')]);
}

function writeOctal(block: Buffer, offset: number, length: number, value: number): void {
  block.write(value.toString(8).padStart(length - 1, '0'), offset, length - 1, 'latin1');
  block[offset + length - 1] = 0;
}

function writeUstar(name: Buffer, flag: string, size: number, h: Pick<TarHeader, 'mode' | 'uid' | 'gid' | 'mtime' | 'devMajor' | 'devMinor'>, linkName: Buffer | null): Buffer {
  const block = Buffer.alloc(BLOCK);
  name.copy(block, 0, 0, Math.min(100, name.length));
  writeOctal(block, 100, 8, h.mode & 0o7777);
  writeOctal(block, 108, 8, h.uid > MAX_OCTAL_7 ? 0 : h.uid);
  writeOctal(block, 116, 8, h.gid > MAX_OCTAL_7 ? 0 : h.gid);
  writeOctal(block, 124, 12, size > MAX_OCTAL_11 ? 0 : size);
  writeOctal(block, 136, 12, Math.min(Math.max(h.mtime, 0), MAX_OCTAL_11));
  block[156] = flag.charCodeAt(0);
  if (linkName) linkName.copy(block, 157, 0, Math.min(100, linkName.length));
  block.write('ustar\x0000', 257, 8, 'latin1');
  writeOctal(block, 329, 8, h.devMajor);
  writeOctal(block, 337, 8, h.devMinor);
  block.write(checksumOf(block).toString(8).padStart(6, '0') + '\0 ', 148, 8, 'latin1');
  return block;
}

/**
 * Encode the header block(s) for one entry: a PAX header when a name, link target, id or size
 * does not fit ustar, or when there are xattrs; then the ustar block. Deterministic (xattrs sorted,
 * empty uname/gname, fixed PAX name) so identical trees give identical bytes, which keeps
 * content-defined chunks stable between checkpoints.
 */
export function encodeHeader(h: TarHeader): Buffer {
  const nameText = h.type === 'directory' ? (h.name === '.' ? './' : `${h.name}/`) : h.name;
  const name = Buffer.from(nameText, 'utf8');
  const link = h.linkName !== undefined ? Buffer.from(h.linkName, 'utf8') : null;
  const size = h.type === 'file' ? h.size : 0;
  const records: Buffer[] = [];
  if (name.length > 100) records.push(paxRecord('path', name));
  if (link && link.length > 100) records.push(paxRecord('linkpath', link));
  if (size > MAX_OCTAL_11) records.push(paxRecord('size', Buffer.from(String(size))));
  if (h.uid > MAX_OCTAL_7) records.push(paxRecord('uid', Buffer.from(String(h.uid))));
  if (h.gid > MAX_OCTAL_7) records.push(paxRecord('gid', Buffer.from(String(h.gid))));
  if (h.mtimePax !== undefined) records.push(paxRecord('mtime', Buffer.from(h.mtimePax, 'latin1')));
  for (const key of [...h.xattrs.keys()].sort()) records.push(paxRecord(`SCHILY.xattr.${key}`, h.xattrs.get(key)!));
  const ustar = writeUstar(name, FLAG_BY_TYPE[h.type], size, h, link);
  if (records.length === 0) return ustar;
  const body = Buffer.concat(records);
  const pad = (BLOCK - (body.length % BLOCK)) % BLOCK;
  const paxHead = writeUstar(Buffer.from('PaxHeader'), 'x', body.length, { mode: 0o644, uid: 0, gid: 0, mtime: 0, devMajor: 0, devMinor: 0 }, null);
  return Buffer.concat([paxHead, body, Buffer.alloc(pad), ustar]);
}

/** Zero padding after `size` data bytes. */
export function dataPadding(size: number): Buffer {
  const pad = (BLOCK - (size % BLOCK)) % BLOCK;
  return pad === 0 ? EMPTY : ZERO_BLOCK.subarray(0, pad);
}

const EMPTY = Buffer.alloc(0);
/** The end-of-archive marker: two zero blocks. */
export const END_OF_ARCHIVE: Buffer = Buffer.alloc(2 * BLOCK);
