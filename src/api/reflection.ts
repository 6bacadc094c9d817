// gRPC server reflection (grpc.reflection.v1 and v1alpha, which share one wire format) over the
// descriptors buf compiled (reflection-descriptors.ts), so standard clients (grpcurl, Postman,
// grpcui) can list, describe and call every advertised service. Written here rather than taken
// from @grpc/reflection because that package only accepts proto-loader package definitions and
// re-encodes them through protobufjs, which is exactly what breaks clients (map entry names).
//
// Requests are small, validated messages decoded by hand (no throw escapes the deserializer):
// names are bounded, a request naming no question or malformed bytes end the stream with
// INVALID_ARGUMENT, and an unknown file/symbol/extension is answered in-band with NOT_FOUND like
// grpc-go. Answers are written with the stream's backpressure (reading pauses while the client does
// not read). Reflection, like health, needs no role: the mTLS handshake already requires a client
// certificate from the fleet CA, and descriptors are the public protocol.
import * as grpc from '@grpc/grpc-js';
import { BinaryReader, BinaryWriter, WireType } from '@bufbuild/protobuf/wire';
import type { DescriptorIndex } from './reflection-descriptors.ts';

export const REFLECTION_V1_SERVICE = 'grpc.reflection.v1.ServerReflection';
export const REFLECTION_V1ALPHA_SERVICE = 'grpc.reflection.v1alpha.ServerReflection';
/** Bound on a file name or symbol in a request: real ones are well under 200 bytes. */
export const MAX_REFLECTION_NAME_BYTES = 1024;

export type ReflectionQuestion =
  | { readonly kind: 'file_by_filename'; readonly fileName: string }
  | { readonly kind: 'file_containing_symbol'; readonly symbol: string }
  | { readonly kind: 'file_containing_extension'; readonly containingType: string; readonly extensionNumber: number }
  | { readonly kind: 'all_extension_numbers_of_type'; readonly type: string }
  | { readonly kind: 'list_services' };

/** What the deserializer hands the handler: a valid request (with its bytes, echoed back) or why not. */
export type DecodedReflectionRequest =
  | { readonly ok: true; readonly host: string; readonly question: ReflectionQuestion; readonly bytes: Uint8Array }
  | { readonly ok: false; readonly error: string };

export type ReflectionAnswer =
  | { readonly kind: 'files'; readonly files: readonly Uint8Array[] }
  | { readonly kind: 'extension_numbers'; readonly baseTypeName: string; readonly numbers: readonly number[] }
  | { readonly kind: 'services'; readonly names: readonly string[] }
  | { readonly kind: 'error'; readonly code: grpc.status; readonly message: string };

// Field numbers of grpc/reflection/v1/reflection.proto (identical in v1alpha).
const REQ_HOST = 1;
const REQ_FILE_BY_FILENAME = 3;
const REQ_FILE_CONTAINING_SYMBOL = 4;
const REQ_FILE_CONTAINING_EXTENSION = 5;
const REQ_ALL_EXTENSION_NUMBERS_OF_TYPE = 6;
const REQ_LIST_SERVICES = 7;
const EXT_REQ_CONTAINING_TYPE = 1;
const EXT_REQ_EXTENSION_NUMBER = 2;
const RES_VALID_HOST = 1;
const RES_ORIGINAL_REQUEST = 2;
const RES_FILE_DESCRIPTOR_RESPONSE = 4;
const RES_ALL_EXTENSION_NUMBERS_RESPONSE = 5;
const RES_LIST_SERVICES_RESPONSE = 6;
const RES_ERROR_RESPONSE = 7;

const utf8 = new TextEncoder();

function boundedName(value: string, what: string): string {
  if (utf8.encode(value).length > MAX_REFLECTION_NAME_BYTES) throw new RangeError(`${what} longer than ${MAX_REFLECTION_NAME_BYTES} bytes`);
  for (let i = 0; i < value.length; i += 1) {
    const c = value.charCodeAt(i);
    if (c < 0x20 || c === 0x7f) throw new RangeError(`${what} contains control characters`);
  }
  return value;
}

/** Decodes a ServerReflectionRequest; never throws (malformed input becomes `ok: false`). */
export function decodeReflectionRequest(bytes: Uint8Array): DecodedReflectionRequest {
  try {
    const reader = new BinaryReader(bytes);
    let host = '';
    // A oneof: the last member on the wire wins, as in every protobuf decoder.
    let question: ReflectionQuestion | undefined;
    while (reader.pos < reader.len) {
      const [fieldNo, wireType] = reader.tag();
      const isString = wireType === WireType.LengthDelimited;
      if (fieldNo === REQ_HOST && isString) host = boundedName(reader.string(true), 'host');
      else if (fieldNo === REQ_FILE_BY_FILENAME && isString) question = { kind: 'file_by_filename', fileName: boundedName(reader.string(true), 'file_by_filename') };
      else if (fieldNo === REQ_FILE_CONTAINING_SYMBOL && isString)
        question = { kind: 'file_containing_symbol', symbol: boundedName(reader.string(true), 'file_containing_symbol') };
      else if (fieldNo === REQ_FILE_CONTAINING_EXTENSION && isString) question = decodeExtensionRequest(reader.bytes());
      else if (fieldNo === REQ_ALL_EXTENSION_NUMBERS_OF_TYPE && isString)
        question = { kind: 'all_extension_numbers_of_type', type: boundedName(reader.string(true), 'all_extension_numbers_of_type') };
      else if (fieldNo === REQ_LIST_SERVICES && isString) {
        reader.string(true); // its content is unused, per the reflection spec
        question = { kind: 'list_services' };
      } else reader.skip(wireType, fieldNo);
    }
    if (question === undefined) return { ok: false, error: 'the request asks nothing (no message_request set)' };
    return { ok: true, host, question, bytes };
  } catch (error) {
    return { ok: false, error: `malformed ServerReflectionRequest: ${(error as Error).message}` };
  }
}

function decodeExtensionRequest(bytes: Uint8Array): ReflectionQuestion {
  const reader = new BinaryReader(bytes);
  let containingType = '';
  let extensionNumber = 0;
  while (reader.pos < reader.len) {
    const [fieldNo, wireType] = reader.tag();
    if (fieldNo === EXT_REQ_CONTAINING_TYPE && wireType === WireType.LengthDelimited) containingType = boundedName(reader.string(true), 'containing_type');
    else if (fieldNo === EXT_REQ_EXTENSION_NUMBER && wireType === WireType.Varint) extensionNumber = reader.int32();
    else reader.skip(wireType, fieldNo);
  }
  return { kind: 'file_containing_extension', containingType, extensionNumber };
}

/** Encodes a ServerReflectionResponse; `original_request` is the request's own bytes. */
export function encodeReflectionResponse(host: string, originalRequest: Uint8Array, answer: ReflectionAnswer): Buffer {
  const w = new BinaryWriter();
  if (host !== '') w.tag(RES_VALID_HOST, WireType.LengthDelimited).string(host);
  w.tag(RES_ORIGINAL_REQUEST, WireType.LengthDelimited).bytes(originalRequest);
  switch (answer.kind) {
    case 'files':
      w.tag(RES_FILE_DESCRIPTOR_RESPONSE, WireType.LengthDelimited).fork();
      for (const file of answer.files) w.tag(1, WireType.LengthDelimited).bytes(file);
      w.join();
      break;
    case 'extension_numbers':
      w.tag(RES_ALL_EXTENSION_NUMBERS_RESPONSE, WireType.LengthDelimited).fork();
      w.tag(1, WireType.LengthDelimited).string(answer.baseTypeName);
      // proto3 repeated int32: packed.
      w.tag(2, WireType.LengthDelimited).fork();
      for (const n of answer.numbers) w.int32(n);
      w.join().join();
      break;
    case 'services':
      w.tag(RES_LIST_SERVICES_RESPONSE, WireType.LengthDelimited).fork();
      for (const name of answer.names) w.tag(1, WireType.LengthDelimited).fork().tag(1, WireType.LengthDelimited).string(name).join();
      w.join();
      break;
    case 'error':
      w.tag(RES_ERROR_RESPONSE, WireType.LengthDelimited).fork().tag(1, WireType.Varint).int32(answer.code).tag(2, WireType.LengthDelimited).string(answer.message).join();
      break;
  }
  return Buffer.from(w.finish());
}

/** Answers one question from the index. `sent` is the stream's set of files already sent. */
export function answerReflection(index: DescriptorIndex, services: readonly string[], question: ReflectionQuestion, sent: Set<string>): ReflectionAnswer {
  const notFound = (message: string): ReflectionAnswer => ({ kind: 'error', code: grpc.status.NOT_FOUND, message });
  const filesOf = (fileName: string | undefined, missing: string): ReflectionAnswer => {
    const files = fileName === undefined ? undefined : index.fileWithDependencies(fileName, sent);
    return files === undefined ? notFound(missing) : { kind: 'files', files };
  };
  switch (question.kind) {
    case 'list_services':
      return { kind: 'services', names: services };
    case 'file_by_filename':
      return filesOf(question.fileName, `file not found: ${question.fileName}`);
    case 'file_containing_symbol':
      return filesOf(index.fileOfSymbol(question.symbol), `symbol not found: ${question.symbol}`);
    case 'file_containing_extension':
      return filesOf(
        index.fileOfExtension(question.containingType, question.extensionNumber),
        `extension not found: ${question.containingType} ${question.extensionNumber}`,
      );
    case 'all_extension_numbers_of_type':
      if (!index.hasMessage(question.type)) return notFound(`message type not found: ${question.type}`);
      return { kind: 'extension_numbers', baseTypeName: question.type, numbers: index.extensionNumbersOf(question.type) };
  }
}

function reflectionServiceDefinition(serviceName: string): grpc.ServiceDefinition {
  return {
    ServerReflectionInfo: {
      path: `/${serviceName}/ServerReflectionInfo`,
      requestStream: true,
      responseStream: true,
      requestSerialize: (value: Buffer) => value,
      requestDeserialize: (bytes: Buffer): DecodedReflectionRequest => decodeReflectionRequest(bytes),
      responseSerialize: (value: Buffer) => value,
      responseDeserialize: (bytes: Buffer) => bytes,
      originalName: 'serverReflectionInfo',
    },
  };
}

/** One reflection stream: answers each request in order until the client half-closes. */
function serveStream(index: DescriptorIndex, services: readonly string[], call: grpc.ServerDuplexStream<DecodedReflectionRequest, Buffer>): void {
  const sent = new Set<string>();
  let done = false;
  call.on('cancelled', () => {
    done = true;
  });
  call.on('data', (request: DecodedReflectionRequest) => {
    if (done) return;
    if (!request.ok) {
      done = true;
      // grpc-js turns an 'error' on a server stream into the call's status and ends it.
      call.emit('error', { code: grpc.status.INVALID_ARGUMENT, details: request.error });
      return;
    }
    const answer = answerReflection(index, services, request.question, sent);
    if (!call.write(encodeReflectionResponse(request.host, request.bytes, answer))) {
      call.pause();
      call.once('drain', () => call.resume());
    }
  });
  call.on('end', () => {
    if (done) return;
    done = true;
    call.end();
  });
}

/**
 * Registers grpc.reflection.v1 and v1alpha on `server`, listing `services` (which must all be
 * described by `index`: a service clients could list but not describe is a build error).
 */
export function addReflectionService(server: grpc.Server, index: DescriptorIndex, services: readonly string[]): void {
  const listed = [...new Set([...services, REFLECTION_V1_SERVICE, REFLECTION_V1ALPHA_SERVICE])].sort();
  const undescribed = listed.filter((s) => !index.hasService(s));
  if (undescribed.length > 0) throw new Error(`reflection: no compiled descriptor for ${undescribed.join(', ')}; run scripts/gen-proto`);
  for (const serviceName of [REFLECTION_V1_SERVICE, REFLECTION_V1ALPHA_SERVICE]) {
    server.addService(reflectionServiceDefinition(serviceName), {
      ServerReflectionInfo: (call: grpc.ServerDuplexStream<DecodedReflectionRequest, Buffer>) => serveStream(index, listed, call),
    });
  }
}
