/**
 * The idgen client: finds nodes (a static list, or Consul's health API
 * followed with blocking queries, configured from Consul's own
 * environment variables), spreads calls over them, fails over within a
 * deadline with a per-attempt budget, prefetches IDs, routes strict calls
 * to their key's node and never sends a strict call twice once it may
 * have reached a node.
 */
import * as grpc from '@grpc/grpc-js';

import { Caller, type Retry } from './call';
import { type ConsulAgent, type ConsulOptions, checkFallbackNames, consulAgent, localDatacenter, queryConsul } from './consul';
import { BadAnswerError, ClosedError, ConfigError, DiscoveryError, StrictNotPrefetchableError } from './errors';
import type { DecodeIdResponse__Output } from './gen/idgen/v1/DecodeIdResponse';
import type { DecodeUuidResponse__Output } from './gen/idgen/v1/DecodeUuidResponse';
import type { GenFormattedResponse__Output } from './gen/idgen/v1/GenFormattedResponse';
import type { GetFormatCounterResponse__Output } from './gen/idgen/v1/GetFormatCounterResponse';
import type { ParseFormattedResponse__Output } from './gen/idgen/v1/ParseFormattedResponse';
import type { Mode__Output as ProtoMode } from './gen/idgen/v1/Mode';
import { keyHash } from './hash';
import { NodeSet, type Route, SPREAD } from './nodes';
import { type PrefetchOptions, type PrefetchSettings, Prefetcher, prefetchSettings } from './prefetch';
import { GEN_IDS, method } from './proto';
import { type TlsOptions, tlsCredentials } from './tls';

/** How an ID is produced (the proto's Mode). */
export type Mode = 'snowflake' | 'segment' | 'lease' | 'strict';

/** Options of {@link Client.connect}. */
export interface ClientOptions {
  /** Static node addresses (`host:port` of the gRPC port). Give these or `consul`. */
  endpoints?: string[];
  /** Find the nodes in Consul (`true`: everything from Consul's environment variables and service `idgen`). */
  consul?: ConsulOptions | true;
  /** The longest a call may take, retries and refill waits included (default 2,000 ms). */
  deadlineMs?: number;
  /** The longest one attempt on one node may take before the call moves on (default a third of the deadline). A strict call is not sent again after its attempt timed out. */
  attemptMs?: number;
  /** How long a node that failed is left out before its health is probed again (default 1,000 ms). */
  setAsideMs?: number;
  /** Backoff between retries: full jitter up to `base * 2^attempt`, capped (defaults 5 and 100 ms). */
  backoffBaseMs?: number;
  backoffMaxMs?: number;
  /** Dial every node over TLS (default plaintext). */
  tls?: TlsOptions;
  /** Prefetch batch sizes and ages. */
  prefetch?: PrefetchOptions;
  /** The nodes' admin token (`admin.token`), sent as `authorization: Bearer <token>` with decode, parse and counter calls only, never with calls that make IDs. Use TLS when it crosses a network. */
  adminToken?: string;
}

/** A formatted ID's fields as the node answers them (uint64 fields as decimal strings). */
export type ParsedFormatted = ParseFormattedResponse__Output;
/** A counter's durable record (uint64/int64 fields as decimal strings). */
export type FormatCounter = GetFormatCounterResponse__Output;
/** The parts of an ID (uint64 fields as decimal strings). */
export type DecodedId = DecodeIdResponse__Output;
/** The parts of a UUIDv7. */
export type DecodedUuid = DecodeUuidResponse__Output;

/** Formatted IDs: the text, and the numbers when the format is numeric. */
export interface FormattedIds {
  ids: string[];
  numbers: bigint[];
  numeric: boolean;
}

const M = {
  GenId: method<object, { id: string }>('GenId'),
  GenFormatted: method<object, GenFormattedResponse__Output>('GenFormatted'),
  ParseFormatted: method<object, ParseFormattedResponse__Output>('ParseFormatted'),
  GetFormatCounter: method<object, GetFormatCounterResponse__Output>('GetFormatCounter'),
  DecodeId: method<object, DecodeIdResponse__Output>('DecodeId'),
  GenUuid: method<object, { uuid: Buffer }>('GenUuid'),
  GenUuids: method<object, { uuids: Buffer }>('GenUuids'),
  DecodeUuid: method<object, DecodeUuidResponse__Output>('DecodeUuid'),
};

const MODES: Record<Mode, ProtoMode> = {
  snowflake: 'MODE_SNOWFLAKE',
  segment: 'MODE_SEGMENT',
  lease: 'MODE_LEASE',
  strict: 'MODE_STRICT',
};

function protoMode(mode: Mode): ProtoMode {
  const m = MODES[mode];
  if (!m) throw new ConfigError(`unknown mode ${JSON.stringify(mode)}: use snowflake, segment, lease or strict`);
  return m;
}

/** A client for an idgen cluster. */
export class Client {
  private readonly prefetchers = new Map<string, Prefetcher>();
  private readonly abort = new AbortController();
  private uuids: UuidBuffer | undefined;

  private constructor(
    private readonly caller: Caller,
    private readonly nodeSet: NodeSet,
    private readonly prefetch: PrefetchSettings,
    private readonly admin: string | undefined,
  ) {}

  /**
   * Starts a client: checks the options, and with Consul asks for the
   * nodes once (failing if Consul cannot answer) and then follows the
   * service with blocking queries in the background.
   */
  static async connect(options: ClientOptions): Promise<Client> {
    const deadlineMs = options.deadlineMs ?? 2000;
    const positive = (name: string, v: number | undefined) => {
      if (v !== undefined && !(Number.isFinite(v) && v > 0)) throw new ConfigError(`${name} must be above zero, got ${v}`);
    };
    positive('deadlineMs', deadlineMs);
    positive('attemptMs', options.attemptMs);
    positive('setAsideMs', options.setAsideMs);
    let prefetch: PrefetchSettings;
    try {
      prefetch = prefetchSettings(options.prefetch);
    } catch (e) {
      throw new ConfigError((e as Error).message);
    }
    const admin = options.adminToken === undefined ? undefined : bearer(options.adminToken);
    const tls = options.tls ? tlsCredentials(options.tls) : undefined;
    const channelOptions: grpc.ChannelOptions = {
      'grpc.enable_retries': 0,
      'grpc.initial_reconnect_backoff_ms': 100,
      'grpc.max_reconnect_backoff_ms': 1000,
      'grpc.max_receive_message_length': 64 * 1024 * 1024,
      ...tls?.options,
    };
    const nodes = new NodeSet({
      countersMayCross:
        typeof options.consul === 'object' && options.consul.countersMayCrossDatacenters === true,
      credentials: tls?.credentials ?? grpc.credentials.createInsecure(),
      options: channelOptions,
      setAsideMs: options.setAsideMs ?? 1000,
      tls: tls !== undefined,
      identity: tls?.identity ?? false,
    });
    const caller = new Caller(nodes, {
      deadlineMs,
      attemptMs: options.attemptMs ?? deadlineMs / 3,
      backoffBaseMs: options.backoffBaseMs ?? 5,
      backoffMaxMs: options.backoffMaxMs ?? 100,
    });
    const client = new Client(caller, nodes, prefetch, admin);
    const endpoints = options.endpoints ?? [];
    if (options.consul && endpoints.length > 0) {
      throw new ConfigError('give either static endpoints or Consul discovery, not both');
    }
    if (options.consul) {
      let agent: ConsulAgent;
      try {
        agent = consulAgent(options.consul === true ? {} : options.consul);
      } catch (e) {
        throw new ConfigError((e as Error).message);
      }
      let first;
      try {
        first = await queryConsul(agent, 0n);
      } catch (e) {
        agent.agent.destroy();
        throw new DiscoveryError((e as Error).message);
      }
      if (agent.fallbackDatacenters.length > 0) {
        const refusal = await checkFallbackNames(agent);
        if (refusal !== undefined) {
          agent.agent.destroy();
          throw new ConfigError(refusal);
        }
      }
      try {
        if (agent.fallbackDatacenters.length > 0) nodes.localDatacenter = await localDatacenter(agent);
        if (first.addrs.length > 0 || !(await client.fallBack(agent))) nodes.replace(first.addrs);
      } catch (e) {
        agent.agent.destroy();
        throw new DiscoveryError((e as Error).message);
      }
      void client.watch(agent, first.index);
    } else if (endpoints.length > 0) {
      try {
        nodes.replace(endpoints);
      } catch (e) {
        throw new ConfigError((e as Error).message);
      }
    } else {
      throw new ConfigError('no endpoints: give static endpoints or Consul discovery');
    }
    return client;
  }

  /**
   * Follows Consul until the client closes; the last known nodes stay in
   * use while Consul cannot be reached. Its timers and sockets do not keep
   * the process alive (a client left open does not hang the exit).
   */
  private async watch(agent: ConsulAgent, index: bigint): Promise<void> {
    const signal = this.abort.signal;
    while (!signal.aborted) {
      try {
        // While a fallback is in use, the local query waits at most
        // fallbackRecheckMs, so the fallbacks are read again that often.
        const wait = this.nodeSet.fallback() === undefined ? agent.waitMs : Math.min(agent.waitMs, agent.fallbackRecheckMs);
        const answer = await queryConsul(agent, index, signal, true, undefined, wait);
        // An index that went backwards (Consul restored a snapshot) restarts the watch.
        index = answer.index < index ? 0n : answer.index;
        if (signal.aborted) break;
        await this.take(agent, answer.addrs);
      } catch {
        if (signal.aborted) break;
        index = 0n;
        await sleep(agent.retryAfterMs * (0.5 + Math.random()), signal);
      }
    }
    agent.agent.destroy();
  }

  /**
   * While the local datacenter lists no passing node: puts the first
   * fallback datacenter that lists one in use (a warning when that changes
   * the datacenter in use). False when none lists a node.
   */
  private async fallBack(agent: ConsulAgent): Promise<boolean> {
    for (const dc of agent.fallbackDatacenters) {
      let addrs: string[];
      try {
        addrs = (await queryConsul(agent, 0n, this.abort.signal, true, dc)).addrs;
      } catch {
        continue;
      }
      if (addrs.length === 0) continue;
      if (this.nodeSet.fallback() !== dc) {
        process.emitWarning(
          `the local Consul datacenter ${JSON.stringify(this.nodeSet.localDatacenter)} lists no passing idgen node: using fallback datacenter ${JSON.stringify(dc)} ${addrs.join(', ')} (snowflake and UUID calls only, unless countersMayCrossDatacenters)`,
          'IdgenDatacenterFallback',
        );
      }
      this.nodeSet.replace(addrs, dc);
      return true;
    }
    return false;
  }

  /** The local datacenter's answer: its nodes when it lists any (back from a fallback), else a fallback's, else the last known nodes. */
  private async take(agent: ConsulAgent, addrs: string[]): Promise<void> {
    if (addrs.length === 0) {
      if (await this.fallBack(agent)) return;
      if (this.nodeSet.size > 0) return;
    }
    const dc = this.nodeSet.fallback();
    if (dc !== undefined) {
      process.emitWarning(
        `the local Consul datacenter ${JSON.stringify(this.nodeSet.localDatacenter)} lists passing idgen nodes again: back from fallback datacenter ${JSON.stringify(dc)}`,
        'IdgenDatacenterFallback',
      );
    }
    this.nodeSet.replace(addrs);
  }

  /** One ID from a node (GenId). `tag`: the segment tag or the strict key (`<namespace>/<key>`); empty for snowflake and lease. */
  async genId(mode: Mode, tag = ''): Promise<bigint> {
    const { value } = await this.caller.call(
      M.GenId,
      { mode: protoMode(mode), tag },
      retryFor(mode),
      routeFor(mode, tag),
      undefined,
      counterFor(mode, tag),
    );
    return BigInt(value.id);
  }

  /** `count` IDs from a node in one call (GenIds); strict: `count` consecutive values. */
  async genIds(mode: Mode, tag: string, count: number): Promise<bigint[]> {
    return (await this.genIdsFrom(mode, tag, count)).ids;
  }

  /** {@link genIds}, with the node that answered. */
  async genIdsFrom(mode: Mode, tag: string, count: number): Promise<{ ids: bigint[]; node: string }> {
    const { value, node } = await this.caller.call(
      GEN_IDS,
      { mode: protoMode(mode), tag, count },
      retryFor(mode),
      routeFor(mode, tag),
      undefined,
      counterFor(mode, tag),
    );
    return { ids: Array.from(value), node };
  }

  /** {@link genIds} as decimal strings. */
  async genIdStrings(mode: Mode, tag: string, count: number): Promise<string[]> {
    return (await this.genIds(mode, tag, count)).map(String);
  }

  /** The prefetch buffer for (mode, tag), created on first use. Strict mode is refused. */
  prefetcher(mode: Mode, tag = ''): Prefetcher {
    if (mode === 'strict') throw new StrictNotPrefetchableError();
    if (this.caller.closed) throw new ClosedError();
    const key = `${mode}\u0000${tag}`;
    let p = this.prefetchers.get(key);
    if (!p) {
      p = new Prefetcher(this.caller, protoMode(mode), tag, this.prefetch, counterFor(mode, tag));
      this.prefetchers.set(key, p);
    }
    return p;
  }

  /** The next ID of (mode, tag) from its prefetch buffer; strict values come from a node on every call. Keep the {@link prefetcher} for the fastest path. */
  nextId(mode: Mode, tag = ''): Promise<bigint> {
    if (mode === 'strict') return this.genId(mode, tag);
    return this.prefetcher(mode, tag).nextId();
  }

  /** {@link nextId} as a decimal string. */
  async nextIdString(mode: Mode, tag = ''): Promise<string> {
    return (await this.nextId(mode, tag)).toString();
  }

  /** `count` formatted IDs of `format` (GenFormatted), always from a node, never prefetched. */
  async genFormatted(format: string, params: Record<string, string> = {}, count = 1): Promise<FormattedIds> {
    const { value } = await this.caller.call(
      M.GenFormatted,
      { format, params, count },
      'idempotent',
      SPREAD,
      undefined,
      `format ${JSON.stringify(format)}`,
    );
    return { ids: value.ids, numbers: value.numbers.map((n) => BigInt(n)), numeric: value.numeric };
  }

  /** The fields of formatted ID `id` (ParseFormatted); a hidden counter's internal value too with the admin token. */
  async parseFormatted(format: string, id: string): Promise<ParsedFormatted> {
    return (await this.caller.call(M.ParseFormatted, { format, id }, 'idempotent', SPREAD, this.authorized())).value;
  }

  /** A counter's durable record (GetFormatCounter); a hidden format's only with the admin token. */
  async formatCounter(format: string, params: Record<string, string> = {}): Promise<FormatCounter> {
    return (await this.caller.call(M.GetFormatCounter, { format, params }, 'idempotent', SPREAD, this.authorized()))
      .value;
  }

  /** The parts of `id`, made in `mode` (DecodeId); a hidden ID's internal parts too with the admin token. */
  async decodeId(id: bigint | string, mode: Mode = 'snowflake'): Promise<DecodedId> {
    return this.decode(id, mode, '');
  }

  /** What `id` of hidden segment tag `tag` shows: the key version to anyone, the internal value only with the admin token (audit-logged by the node). */
  async decodeSegmentId(tag: string, id: bigint | string): Promise<DecodedId> {
    return this.decode(id, 'segment', tag);
  }

  private async decode(id: bigint | string, mode: Mode, tag: string): Promise<DecodedId> {
    const text = exactId(id);
    const request = { id: text, mode: protoMode(mode), tag };
    return (await this.caller.call(M.DecodeId, request, 'idempotent', SPREAD, this.authorized())).value;
  }

  /** One UUIDv7 (GenUuid), canonical text. */
  async genUuid(): Promise<string> {
    const { value } = await this.caller.call(M.GenUuid, {}, 'idempotent', SPREAD);
    if (value.uuid.length !== 16) throw new BadAnswerError(`GenUuid answered ${value.uuid.length} bytes, not 16`);
    return uuidText(value.uuid);
  }

  /** `count` UUIDv7 in one call (GenUuids), strictly increasing, canonical text. */
  async genUuids(count: number): Promise<string[]> {
    const { value } = await this.caller.call(M.GenUuids, { count, with_text: false }, 'idempotent', SPREAD);
    if (value.uuids.length !== count * 16) {
      throw new BadAnswerError(`GenUuids for ${count} UUIDs answered ${value.uuids.length} bytes, not ${count * 16}`);
    }
    const out: string[] = [];
    for (let i = 0; i < count; i++) out.push(uuidText(value.uuids.subarray(i * 16, i * 16 + 16)));
    return out;
  }

  /**
   * The next UUIDv7 (canonical text) from a prefetch buffer refilled in
   * the background with GenUuids (the prefetch options' batch and
   * threshold). Each refill's UUIDs are served in order (increasing, from
   * one node); buffered UUIDs are dropped on close (never repeated).
   */
  nextUuid(): Promise<string> {
    if (this.caller.closed) return Promise.reject(new ClosedError());
    this.uuids ??= new UuidBuffer((n) => this.genUuids(n), this.prefetch);
    return this.uuids.next();
  }

  /** The parts of a UUIDv7 (canonical text, 32 hex digits or a ULID). */
  async decodeUuid(text: string): Promise<DecodedUuid> {
    return (await this.caller.call(M.DecodeUuid, { text }, 'idempotent', SPREAD)).value;
  }

  /** The node a strict call on `key` goes to now (rendezvous hashing over the nodes in use). */
  strictNode(key: string): string | undefined {
    return this.nodeSet.pick([], { kind: 'key', hash: keyHash(key) })?.addr;
  }

  /** The gRPC addresses of the nodes currently known. */
  nodes(): string[] {
    return this.nodeSet.addrs();
  }

  /** Stops discovery and refills, closes the channels; buffered IDs are dropped unused. */
  close(): void {
    this.caller.closed = true;
    this.abort.abort();
    for (const p of this.prefetchers.values()) p.close(new ClosedError());
    this.uuids?.close(new ClosedError());
    this.nodeSet.close();
  }

  private authorized(): grpc.Metadata | undefined {
    if (this.admin === undefined) return undefined;
    const md = new grpc.Metadata();
    md.set('authorization', this.admin);
    return md;
  }
}

/**
 * UUIDs fetched ahead: refilled when fewer than the threshold are left,
 * one refill at a time; callers that find it empty wait for the refill
 * (its call has the client's deadline) and are served in order.
 */
class UuidBuffer {
  private buffered: string[] = [];
  private pos = 0;
  private refilling: Promise<void> | undefined;
  private closed: Error | undefined;

  constructor(
    private readonly fetch: (n: number) => Promise<string[]>,
    private readonly settings: PrefetchSettings,
  ) {}

  async next(): Promise<string> {
    for (;;) {
      if (this.closed) throw this.closed;
      if (this.pos < this.buffered.length) {
        const u = this.buffered[this.pos++];
        if (this.buffered.length - this.pos < this.low()) void this.refill().catch(() => undefined);
        return u;
      }
      await this.refill();
    }
  }

  private low(): number {
    return this.settings.lowWater ?? this.settings.batch >> 1;
  }

  private refill(): Promise<void> {
    this.refilling ??= this.fetch(this.settings.batch).then(
      (uuids) => {
        this.refilling = undefined;
        if (this.closed) return;
        this.buffered = this.buffered.slice(this.pos).concat(uuids);
        this.pos = 0;
      },
      (e) => {
        this.refilling = undefined;
        throw e;
      },
    );
    return this.refilling;
  }

  close(e: Error): void {
    this.closed = e;
    this.buffered = [];
    this.pos = 0;
  }
}

/**
 * Whose counter a call of `mode` takes its values from, in words (as the
 * Rust crate says it), or undefined for snowflake IDs, which carry the
 * datacenter id and may come from any datacenter.
 */
function counterFor(mode: Mode, tag: string): string | undefined {
  if (mode === 'snowflake') return undefined;
  if (mode === 'strict') return `strict key ${JSON.stringify(tag)}`;
  if (mode === 'segment') return `segment tag ${JSON.stringify(tag)}`;
  return `${mode} call`;
}

function retryFor(mode: Mode): Retry {
  return mode === 'strict' ? 'onlyIfNotSent' : 'idempotent';
}

/**
 * Strict calls on one key go to the key's node (rendezvous hashing), which
 * combines them into shared writes; other modes spread the load.
 */
function routeFor(mode: Mode, tag: string): Route {
  return mode === 'strict' ? { kind: 'key', hash: keyHash(tag) } : SPREAD;
}

/** `Bearer <token>`; a token a header cannot carry is refused. */
function bearer(token: string): string {
  if (token.trim() === '') throw new ConfigError('the admin token is empty');
  if (!/^[\x21-\x7e]+$/.test(token)) {
    throw new ConfigError(
      'the admin token cannot be sent in a header: it must be visible ASCII (no spaces, line breaks or control characters)',
    );
  }
  return `Bearer ${token}`;
}

/** An ID as exact decimal text; a number is refused (it may already have lost digits). */
function exactId(id: bigint | string): string {
  if (typeof id === 'bigint') {
    if (id < 0n || id >= 1n << 64n) throw new ConfigError(`ID ${id} is outside 0..2^64-1`);
    return id.toString();
  }
  if (typeof id === 'string' && /^\d{1,20}$/.test(id) && BigInt(id) < 1n << 64n) return id;
  throw new ConfigError(`ID ${JSON.stringify(id)} is not a decimal uint64: pass a bigint or a decimal string, never a number`);
}

/** 16 bytes as canonical lowercase 8-4-4-4-12 text. */
export function uuidText(b: Uint8Array): string {
  const h = Buffer.from(b).toString('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/** Sleeps `ms`, or less when `signal` aborts (its listener removed either way). */
function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(t);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const t = setTimeout(done, ms);
    // Discovery alone never keeps the process alive.
    t.unref();
    signal.addEventListener('abort', done, { once: true });
  });
}
