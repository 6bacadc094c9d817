// The compiled protocol descriptors that server reflection serves (src/api/reflection.ts), indexed
// by file name, symbol and extension. Source: src/gen/descriptors.binpb, the FileDescriptorSet that
// `buf build` writes in scripts/gen-proto (proto/ plus grpc.health.v1 and grpc.reflection, with
// their imports). Each file is kept as the exact bytes buf compiled and served as such: descriptors
// rebuilt by another library (@grpc/proto-loader's protobufjs conversion) name map entries wrongly
// and drop proto3 `optional`, and standard clients (grpcurl, Postman) refuse them.
import { fromBinary } from '@bufbuild/protobuf';
import { BinaryReader, WireType } from '@bufbuild/protobuf/wire';
import { FileDescriptorProtoSchema, type DescriptorProto, type EnumDescriptorProto, type FieldDescriptorProto } from '@bufbuild/protobuf/wkt';
import { readFileSync } from 'node:fs';

/** Where scripts/gen-proto writes the compiled descriptor set. */
export const COMPILED_DESCRIPTORS_URL = new URL('../gen/descriptors.binpb', import.meta.url);

interface IndexedFile {
  /** The FileDescriptorProto exactly as buf encoded it. */
  readonly bytes: Uint8Array;
  readonly dependencies: readonly string[];
}

/** Field 1 of google.protobuf.FileDescriptorSet: `repeated FileDescriptorProto file`. */
const FILE_DESCRIPTOR_SET_FILE = 1;

/** Splits a FileDescriptorSet into the encoded bytes of each file, without re-encoding them. */
export function splitDescriptorSet(set: Uint8Array): Uint8Array[] {
  const reader = new BinaryReader(set);
  const files: Uint8Array[] = [];
  while (reader.pos < reader.len) {
    const [fieldNo, wireType] = reader.tag();
    if (fieldNo === FILE_DESCRIPTOR_SET_FILE && wireType === WireType.LengthDelimited) files.push(reader.bytes());
    else reader.skip(wireType, fieldNo);
  }
  return files;
}

/** Full name of a child declared in `scope` (a package, message or, for enum values, the enum's scope). */
function qualify(scope: string, name: string): string {
  return scope === '' ? name : `${scope}.${name}`;
}

/** An index over a FileDescriptorSet. Refuses a set whose files or symbols are inconsistent. */
export class DescriptorIndex {
  readonly #files = new Map<string, IndexedFile>();
  /** Fully qualified symbol (no leading dot) -> name of the file declaring it. */
  readonly #symbols = new Map<string, string>();
  /** Fully qualified extended message -> extension field number -> file declaring the extension. */
  readonly #extensions = new Map<string, Map<number, string>>();
  readonly #messages = new Set<string>();
  readonly #services = new Set<string>();

  constructor(set: Uint8Array) {
    for (const bytes of splitDescriptorSet(set)) {
      const file = fromBinary(FileDescriptorProtoSchema, bytes);
      if (file.name === '' || this.#files.has(file.name)) throw new Error(`descriptor set: missing or duplicate file name ${JSON.stringify(file.name)}`);
      this.#files.set(file.name, { bytes, dependencies: [...file.dependency] });
      const define = (symbol: string) => {
        const other = this.#symbols.get(symbol);
        if (other !== undefined) throw new Error(`descriptor set: ${symbol} is declared in ${other} and ${file.name}`);
        this.#symbols.set(symbol, file.name);
      };
      const defineExtensions = (scope: string, extensions: readonly FieldDescriptorProto[]) => {
        for (const extension of extensions) {
          define(qualify(scope, extension.name));
          const extendee = extension.extendee.replace(/^\./, '');
          const numbers = this.#extensions.get(extendee) ?? new Map<number, string>();
          numbers.set(extension.number, file.name);
          this.#extensions.set(extendee, numbers);
        }
      };
      const defineEnum = (scope: string, e: EnumDescriptorProto) => {
        define(qualify(scope, e.name));
        // Enum values are siblings of their enum (C++ scoping), as protobuf resolves them.
        for (const value of e.value) define(qualify(scope, value.name));
      };
      const defineMessage = (scope: string, message: DescriptorProto) => {
        const name = qualify(scope, message.name);
        define(name);
        this.#messages.add(name);
        for (const field of message.field) define(qualify(name, field.name));
        for (const oneof of message.oneofDecl) define(qualify(name, oneof.name));
        for (const nested of message.nestedType) defineMessage(name, nested);
        for (const e of message.enumType) defineEnum(name, e);
        defineExtensions(name, message.extension);
      };
      for (const message of file.messageType) defineMessage(file.package, message);
      for (const e of file.enumType) defineEnum(file.package, e);
      defineExtensions(file.package, file.extension);
      for (const service of file.service) {
        const name = qualify(file.package, service.name);
        define(name);
        this.#services.add(name);
        for (const method of service.method) define(qualify(name, method.name));
      }
    }
    for (const [name, file] of this.#files) {
      for (const dependency of file.dependencies) {
        if (!this.#files.has(dependency)) throw new Error(`descriptor set: ${name} imports ${dependency}, which the set does not contain`);
      }
    }
  }

  hasService(name: string): boolean {
    return this.#services.has(name);
  }

  hasMessage(name: string): boolean {
    return this.#messages.has(name);
  }

  hasFile(name: string): boolean {
    return this.#files.has(name);
  }

  /** Name of the file declaring `symbol` (a package-qualified name without leading dot). */
  fileOfSymbol(symbol: string): string | undefined {
    return this.#symbols.get(symbol);
  }

  fileOfExtension(extendee: string, fieldNumber: number): string | undefined {
    return this.#extensions.get(extendee)?.get(fieldNumber);
  }

  /** Field numbers of the extensions of `extendee` in the set, ascending. */
  extensionNumbersOf(extendee: string): number[] {
    return [...(this.#extensions.get(extendee)?.keys() ?? [])].sort((a, b) => a - b);
  }

  /**
   * The file's bytes first, then those of its transitive imports that were not yet `sent` on this
   * reflection stream (grpc-go's rule: the asked-for file always, its imports once per stream);
   * every file returned is added to `sent`.
   */
  fileWithDependencies(name: string, sent: Set<string>): Uint8Array[] | undefined {
    const root = this.#files.get(name);
    if (root === undefined) return undefined;
    const out: Uint8Array[] = [root.bytes];
    sent.add(name);
    const seen = new Set<string>([name]);
    const queue = [...root.dependencies];
    for (let next = queue.shift(); next !== undefined; next = queue.shift()) {
      if (seen.has(next)) continue;
      seen.add(next);
      const file = this.#files.get(next);
      if (file === undefined) continue; // unreachable: the constructor checked every import
      if (!sent.has(next)) {
        sent.add(next);
        out.push(file.bytes);
      }
      queue.push(...file.dependencies);
    }
    return out;
  }
}

let compiled: DescriptorIndex | undefined;

/** The index of src/gen/descriptors.binpb, read once per process. */
export function compiledDescriptors(): DescriptorIndex {
  compiled ??= new DescriptorIndex(readFileSync(COMPILED_DESCRIPTORS_URL));
  return compiled;
}
