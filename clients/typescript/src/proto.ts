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
 * skipped, as protobuf requires.
 */
export function decodeIds(buf: Buffer): BigUint64Array {
  let values = new BigUint64Array(Math.max(8, buf.length >> 3));
  let words = new Uint32Array(values.buffer);
  let n = 0;
  let pos = 0;
  const varint = (): [number, number] => {
    let lo = 0;
    let hi = 0;
    let shift = 0;
    for (;;) {
      if (pos >= buf.length) throw new Error('GenIdsResponse: truncated varint');
      const b = buf[pos++];
      if (shift < 28) lo |= (b & 0x7f) << shift;
      else if (shift === 28) {
        lo |= (b & 0x0f) << 28;
        hi |= (b & 0x7f) >> 4;
      } else if (shift < 64) hi |= (b & 0x7f) << (shift - 32);
      else throw new Error('GenIdsResponse: varint longer than 10 bytes');
      shift += 7;
      if ((b & 0x80) === 0) return [lo >>> 0, hi >>> 0];
    }
  };
  const push = () => {
    if (n === values.length) {
      const bigger = new BigUint64Array(values.length * 2);
      bigger.set(values);
      values = bigger;
      words = new Uint32Array(values.buffer);
    }
    const [lo, hi] = varint();
    words[2 * n] = lo;
    words[2 * n + 1] = hi;
    n++;
  };
  const little = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;
  if (!little) throw new Error('this client needs a little-endian machine');
  while (pos < buf.length) {
    const [key] = varint();
    const field = key >>> 3;
    const wire = key & 7;
    if (field === 1 && wire === 2) {
      const [len] = varint();
      const end = pos + len;
      if (end > buf.length) throw new Error('GenIdsResponse: truncated field');
      while (pos < end) push();
    } else if (field === 1 && wire === 0) {
      push();
    } else if (wire === 0) {
      varint();
    } else if (wire === 1) {
      pos += 8;
    } else if (wire === 2) {
      const [len] = varint();
      pos += len;
    } else if (wire === 5) {
      pos += 4;
    } else {
      throw new Error(`GenIdsResponse: unsupported wire type ${wire}`);
    }
  }
  return values.subarray(0, n);
}
