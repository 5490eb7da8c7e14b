/**
 * @idgen/client: a client for idgen, the distributed unique-ID service.
 * IDs are bigint (exact 64-bit), never number.
 *
 * ```ts
 * import { Client } from '@idgen/client';
 * const client = await Client.connect({ consul: true }); // Consul's own env variables
 * const id = await client.nextId('snowflake');          // bigint, from a prefetch buffer
 * ```
 */
export { Client } from './client';
export type {
  ClientOptions,
  DecodedId,
  DecodedUuid,
  FormatCounter,
  FormattedIds,
  Mode,
  ParsedFormatted,
} from './client';
export type { ConsulOptions } from './consul';
export * from './errors';
export { keyHash, rendezvous } from './hash';
export { Prefetcher } from './prefetch';
export type { PrefetchOptions } from './prefetch';
export type { TlsOptions } from './tls';
