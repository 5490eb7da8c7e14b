/**
 * The service definition, loaded at run time from the idgen.proto shipped
 * in the package (proto/), with 64-bit integers as decimal strings so no
 * uint64 passes through a JavaScript number. GenIds answers, the hot path
 * of prefetching, are decoded by hand straight into a BigUint64Array.
 */
import { join } from 'node:path';
import * as protoLoader from '@grpc/proto-loader';

import type { GenIdsRequest } from './gen/idgen/v1/GenIdsRequest';

/** Where the shipped proto lives: `<package>/proto/idgen/v1/idgen.proto`. */
export const PROTO_DIR = join(__dirname, '..', '..', 'proto');

const definition = protoLoader.loadSync('idgen/v1/idgen.proto', {
  includeDirs: [PROTO_DIR],
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
});

/** How one method is sent and read. */
export interface Method<Req, Resp> {
  path: string;
  serialize: (req: Req) => Buffer;
  deserialize: (bytes: Buffer) => Resp;
}

const service = definition['idgen.v1.IdGen'] as unknown as Record<
  string,
  { path: string; requestSerialize: (r: unknown) => Buffer; responseDeserialize: (b: Buffer) => unknown }
>;

/** The IdGen method `name`, read by proto-loader. */
export function method<Req, Resp>(name: string): Method<Req, Resp> {
  const m = service[name];
  if (!m) throw new Error(`idgen.v1.IdGen has no method ${name}`);
  return {
    path: m.path,
    serialize: m.requestSerialize as (r: Req) => Buffer,
    deserialize: m.responseDeserialize as (b: Buffer) => Resp,
  };
}

/** GenIds with its answer decoded into a BigUint64Array (exact, no string per ID). */
export const GEN_IDS: Method<GenIdsRequest, BigUint64Array> = {
  ...method<GenIdsRequest, unknown>('GenIds'),
  deserialize: decodeIds,
};

/**
 * Reads GenIdsResponse (`repeated uint64 ids = 1`, packed or not) into a
 * BigUint64Array: each varint's low and high 32 bits go into a Uint32Array
 * over the same memory, so every value stays exact. Unknown fields are
 * skipped, as protobuf requires. Each ID is decoded in place: no
 * allocation per ID.
 */
export function decodeIds(buf: Buffer): BigUint64Array {
  if (!LITTLE_ENDIAN) throw new Error('this client needs a little-endian machine');
  const len = buf.length;
  // Room for IDs of 8 bytes or more (snowflake IDs take 9), grown for shorter ones.
  let values = new BigUint64Array(Math.max(8, len >> 3));
  let words = new Uint32Array(values.buffer);
  let n = 0;
  let pos = 0;
  const grow = () => {
    const bigger = new BigUint64Array(values.length * 2);
    bigger.set(values);
    values = bigger;
    words = new Uint32Array(values.buffer);
  };
  while (pos < len) {
    pos = varint(buf, pos, scratch, 0);
    const key = scratch[0];
    const field = key >>> 3;
    const wire = key & 7;
    if (field === 1 && wire === 2) {
      pos = varint(buf, pos, scratch, 0);
      const end = pos + scratch[0];
      if (end > len || scratch[1] !== 0) throw new Error('GenIdsResponse: truncated field');
      while (pos < end) {
        if (n === values.length) grow();
        pos = varint(buf, pos, words, 2 * n);
        n++;
      }
      if (pos > end) throw new Error('GenIdsResponse: a varint runs past its packed field');
    } else if (field === 1 && wire === 0) {
      if (n === values.length) grow();
      pos = varint(buf, pos, words, 2 * n);
      n++;
    } else if (wire === 0) {
      pos = varint(buf, pos, scratch, 0);
    } else if (wire === 1) {
      pos += 8;
    } else if (wire === 2) {
      pos = varint(buf, pos, scratch, 0);
      pos += scratch[0];
    } else if (wire === 5) {
      pos += 4;
    } else {
      throw new Error(`GenIdsResponse: unsupported wire type ${wire}`);
    }
  }
  return values.subarray(0, n);
}

const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;
/** The low and high words of a varint that is not an ID (a key, a length). */
const scratch = new Uint32Array(2);

/**
 * Decodes the varint at `pos` into `out[at]` (low 32 bits) and
 * `out[at + 1]` (high 32 bits); returns the position after it. Unrolled
 * (a snowflake ID takes 9 bytes) when 10 bytes are left, else checked
 * byte by byte for a truncated message.
 */
function varint(buf: Buffer, pos: number, out: Uint32Array, at: number): number {
  if (pos + 10 > buf.length) return varintChecked(buf, pos, out, at);
  let b = buf[pos++];
  let lo = b & 0x7f;
  let hi = 0;
  if (b >= 0x80) {
    b = buf[pos++];
    lo |= (b & 0x7f) << 7;
    if (b >= 0x80) {
      b = buf[pos++];
      lo |= (b & 0x7f) << 14;
      if (b >= 0x80) {
        b = buf[pos++];
        lo |= (b & 0x7f) << 21;
        if (b >= 0x80) {
          b = buf[pos++];
          lo |= (b & 0x0f) << 28;
          hi = (b & 0x7f) >> 4;
          // The high word's bits 3..31: bytes 6 to 10.
          for (let shift = 3; b >= 0x80; shift += 7) {
            if (shift > 31) throw new Error('GenIdsResponse: varint longer than 10 bytes');
            b = buf[pos++];
            hi |= (b & 0x7f) << shift;
          }
        }
      }
    }
  }
  out[at] = lo;
  out[at + 1] = hi;
  return pos;
}

/** varint, checking each byte is there. */
function varintChecked(buf: Buffer, pos: number, out: Uint32Array, at: number): number {
  const len = buf.length;
  let lo = 0;
  let hi = 0;
  let shift = 0;
  for (;;) {
    if (pos >= len) throw new Error('GenIdsResponse: truncated varint');
    const b = buf[pos++];
    if (shift < 28) lo |= (b & 0x7f) << shift;
    else if (shift === 28) {
      lo |= (b & 0x0f) << 28;
      hi |= (b & 0x7f) >> 4;
    } else if (shift < 64) hi |= (b & 0x7f) << (shift - 32);
    else throw new Error('GenIdsResponse: varint longer than 10 bytes');
    shift += 7;
    if (b < 0x80) {
      out[at] = lo;
      out[at + 1] = hi;
      return pos;
    }
  }
}
