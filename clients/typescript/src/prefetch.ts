/**
 * Prefetching: a local buffer of IDs per (mode, tag), refilled in the
 * background with GenIds before it runs dry, so most calls are answered
 * from memory without waiting for a node.
 *
 * Each answer is its own block, served whole and in the order the blocks
 * arrived, so the order within one node's block is kept (snowflake IDs
 * increase within a block). Node runs one event loop: an ID is taken by
 * one synchronous step (`ids[pos++]`), so no two callers can get the same
 * one. Refills spread over the nodes (power of two choices); a caller
 * that had to wait doubles the batch up to `maxBatch` and, once there,
 * adds a refill in flight, up to `refillsInFlight`.
 */
import { DeadlineExceededError, IdgenError, StatusError } from './errors';
import type { Caller } from './call';
import { SPREAD } from './nodes';
import type { Mode__Output as ProtoMode } from './gen/idgen/v1/Mode';
import { GEN_IDS } from './proto';

/** How prefetch buffers size and age their batches. */
export interface PrefetchOptions {
  /** The first refill's batch size (default 1,000). */
  batch?: number;
  /** The largest batch; keep it at most the server's `server.max_batch` (default 10,000, the server's default). */
  maxBatch?: number;
  /** Start a refill when fewer than this many IDs are left (default: half of the current batch times the refills allowed in flight). */
  lowWater?: number;
  /** The most refills in flight at once (default 6: two per node of a 3-node cluster). */
  refillsInFlight?: number;
  /** Snowflake IDs older than this (since received) are dropped unused, so their time stays near the time of use (default 5,000 ms). Lease and segment IDs do not age. */
  maxSnowflakeAgeMs?: number;
}

/** Validated prefetch settings. */
export interface PrefetchSettings {
  batch: number;
  maxBatch: number;
  lowWater: number | undefined;
  refillsInFlight: number;
  maxSnowflakeAgeMs: number;
}

/** `options` checked, with defaults; an Error saying which value is wrong. */
export function prefetchSettings(options: PrefetchOptions = {}): PrefetchSettings {
  const s: PrefetchSettings = {
    batch: options.batch ?? 1000,
    maxBatch: options.maxBatch ?? Math.max(10_000, options.batch ?? 0),
    lowWater: options.lowWater,
    refillsInFlight: options.refillsInFlight ?? 6,
    maxSnowflakeAgeMs: options.maxSnowflakeAgeMs ?? 5000,
  };
  const int = (name: string, v: number, min: number, max: number) => {
    if (!Number.isInteger(v) || v < min || v > max) {
      throw new Error(`prefetch ${name} must be an integer from ${min} to ${max}, got ${v}`);
    }
  };
  int('batch', s.batch, 1, 0xffffffff);
  int('maxBatch', s.maxBatch, s.batch, 0xffffffff);
  if (s.lowWater !== undefined) int('lowWater', s.lowWater, 0, s.maxBatch);
  int('refillsInFlight', s.refillsInFlight, 1, 64);
  int('maxSnowflakeAgeMs', s.maxSnowflakeAgeMs, 1, Number.MAX_SAFE_INTEGER);
  return s;
}

interface Block {
  ids: BigUint64Array;
  pos: number;
  /** Date.now() after which a snowflake block's IDs are too old to hand out (0: never). */
  expires: number;
  /** Throws the rest of a snowflake block away when it expires. */
  timer: NodeJS.Timeout | undefined;
}

interface Waiter {
  resolve: (id: bigint) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
}

/**
 * The node's batch limit from its refusal of a larger batch ("count must
 * be between 1 and 500, got 1000; ..."), as the Rust crate reads it.
 */
export function serverMaxBatch(e: Error): number | undefined {
  if (!(e instanceof StatusError) || e.code !== 'INVALID_ARGUMENT') return undefined;
  const m = /between 1 and (\d+)/.exec(e.details);
  const n = m ? Number(m[1]) : NaN;
  return Number.isInteger(n) && n >= 1 ? n : undefined;
}

/**
 * While a refill is in flight, one `nextId` in this many (at most; a
 * quarter of the low-water mark when that is fewer) resolves after a turn
 * of the event loop, so the refill's I/O runs before the buffer is dry
 * (about 1 ms apart at 1 M IDs/s; a turn costs a few microseconds).
 */
export const YIELD_EVERY = 1024;

/**
 * A caller that takes IDs without letting the event loop turn (so no
 * block's expiry timer can fire) has the clock read every this many IDs.
 */
export const CLOCK_EVERY = 64;

/** A prefetch buffer for one (mode, tag). IDs come out as bigint. */
export class Prefetcher {
  private readonly blocks: Block[] = [];
  private head: Block | undefined;
  private available = 0;
  private inFlight = 0;
  private lanes = 1;
  private batch: number;
  /** `maxBatch`, lowered to a node's `server.max_batch` when one says it is lower. */
  private maxBatch: number;
  private readonly waiters: Waiter[] = [];
  private lastError: Error | undefined;
  private closed = false;

  constructor(
    private readonly caller: Caller,
    readonly mode: ProtoMode,
    readonly tag: string,
    private readonly settings: PrefetchSettings,
    /** The counter its values come from, in words (undefined for snowflake): refused on a fallback datacenter's node. */
    private readonly counter?: string,
  ) {
    this.batch = settings.batch;
    this.maxBatch = settings.maxBatch;
  }

  /** IDs handed out since the last turn of the event loop given to refills (see nextId). */
  private sinceYield = 0;
  /** IDs handed out since the clock was last read (see fresh). */
  private sinceClock = CLOCK_EVERY;

  /** How many calls found the buffer empty and waited for a refill (a buffer that keeps ahead of its reader keeps this near 0). */
  waits = 0;
  /** How many refills landed. */
  refills = 0;

  /** How many IDs are buffered now. */
  get buffered(): number {
    return this.available;
  }

  /**
   * The next ID: from memory when the buffer holds one (a refill starts
   * in the background when it runs low), else after the next refill lands,
   * within the client's deadline.
   */
  nextId(): Promise<bigint> {
    const id = this.take();
    if (id === undefined) return this.wait();
    if (this.inFlight > 0 && ++this.sinceYield >= Math.min(YIELD_EVERY, (this.low() >> 2) + 1)) {
      // A caller awaiting IDs in a loop runs on microtasks alone, which
      // starve the event loop: the refill's request would not be written
      // nor its answer read until the buffer ran dry. So while a refill is
      // in flight, every YIELD_EVERY-th ID (every quarter of the low-water
      // mark when that is fewer; taken now, in call order) is handed over
      // after one turn of the event loop (setImmediate).
      this.sinceYield = 0;
      return new Promise((resolve) => setImmediate(resolve, id));
    }
    return Promise.resolve(id);
  }

  /** The next ID if one is buffered now, else undefined (a refill is started either way when the buffer is low). */
  tryNextId(): bigint | undefined {
    const id = this.take();
    if (id === undefined) this.refillIfLow();
    return id;
  }

  private take(): bigint | undefined {
    let b = this.head;
    while (b !== undefined) {
      if (b.pos < b.ids.length && (b.expires === 0 || this.fresh(b))) {
        const id = b.ids[b.pos++];
        this.available--;
        if (this.available < this.low() && this.inFlight < this.lanes) this.refill();
        return id;
      }
      this.available -= b.ids.length - b.pos;
      b.pos = b.ids.length;
      clearTimeout(b.timer);
      this.blocks.shift();
      b = this.head = this.blocks[0];
      this.sinceClock = CLOCK_EVERY;
    }
    return undefined;
  }

  /**
   * Whether snowflake block `b` is still young enough to hand out. Its
   * timer empties it when it expires, whenever the event loop turns; a
   * caller that takes IDs without letting the loop turn reads the clock
   * every CLOCK_EVERY-th ID and on a block's first ID (the clock costs more
   * than the rest of an ID here).
   */
  private fresh(b: Block): boolean {
    if (++this.sinceClock < CLOCK_EVERY) return true;
    this.sinceClock = 0;
    return Date.now() <= b.expires;
  }

  /** Throws away what is left of snowflake block `b`: it aged (gaps, never repeats). */
  private expire(b: Block): void {
    this.available -= b.ids.length - b.pos;
    b.pos = b.ids.length;
    this.refillIfLow();
  }

  /** The refill threshold: `lowWater`, else half of what the refills in flight bring (so a fast reader does not outrun them). */
  private low(): number {
    return this.settings.lowWater ?? (this.batch * this.lanes) >> 1;
  }

  private refillIfLow(): void {
    if (this.available < this.low() && this.inFlight < this.lanes) this.refill();
  }

  private wait(): Promise<bigint> {
    this.waits++;
    // A caller had to wait: more IDs per refill, then more refills at once.
    if (this.batch < this.maxBatch) {
      this.batch = Math.min(this.batch * 2, this.maxBatch);
    } else if (this.lanes < this.settings.refillsInFlight) {
      this.lanes++;
    }
    const deadlineMs = this.caller.settings.deadlineMs;
    return new Promise<bigint>((resolve, reject) => {
      const waiter: Waiter = {
        resolve,
        reject,
        timer: setTimeout(() => {
          const i = this.waiters.indexOf(waiter);
          if (i >= 0) this.waiters.splice(i, 1);
          reject(
            new DeadlineExceededError(deadlineMs, this.lastError?.message ?? 'waiting for a prefetch refill', 0, 0, false),
          );
        }, deadlineMs),
      };
      this.waiters.push(waiter);
      if (this.inFlight === 0) this.refill();
    });
  }

  private refill(): void {
    if (this.closed) return;
    this.inFlight++;
    const count = this.batch;
    const request = { mode: this.mode, tag: this.tag, count };
    this.caller.call(GEN_IDS, request, 'idempotent', SPREAD, undefined, this.counter).then(
      ({ value }) => {
        this.inFlight--;
        this.refills++;
        this.lastError = undefined;
        if (value.length > 0) {
          const block: Block = { ids: value, pos: 0, expires: 0, timer: undefined };
          if (this.mode === 'MODE_SNOWFLAKE') {
            const ageMs = this.settings.maxSnowflakeAgeMs;
            block.expires = Date.now() + ageMs;
            // Node's timers take at most 2^31 - 1 ms; a longer age is left to the clock reads.
            if (ageMs <= 0x7fffffff) block.timer = setTimeout(() => this.expire(block), ageMs).unref();
          }
          this.blocks.push(block);
          this.available += value.length;
          this.head ??= this.blocks[0];
        }
        this.serveWaiters();
      },
      (e: Error) => {
        this.inFlight--;
        const limit = serverMaxBatch(e);
        if (limit !== undefined && limit < count) {
          // The node's server.max_batch is lower: ask for that much from now on.
          this.maxBatch = limit;
          this.batch = Math.min(this.batch, limit);
          if (this.waiters.length > 0 || this.available < this.low()) this.refill();
          return;
        }
        this.lastError = e;
        if (this.inFlight === 0) this.failWaiters(e);
      },
    );
  }

  /** Hands buffered IDs to waiting callers, in the order they came. */
  private serveWaiters(): void {
    while (this.waiters.length > 0) {
      const id = this.take();
      if (id === undefined) break;
      const w = this.waiters.shift()!;
      clearTimeout(w.timer);
      w.resolve(id);
    }
    if (this.waiters.length > 0 && this.inFlight === 0) this.refill();
    else this.refillIfLow();
  }

  private failWaiters(e: Error): void {
    const waiters = this.waiters.splice(0);
    for (const w of waiters) {
      clearTimeout(w.timer);
      w.reject(e instanceof IdgenError ? e : new IdgenError(e.message, 'UNKNOWN', true));
    }
  }

  /** Stops refilling and fails waiting callers; buffered IDs are dropped unused (gaps, never repeats). */
  close(e: Error): void {
    this.closed = true;
    this.failWaiters(e);
    for (const b of this.blocks) clearTimeout(b.timer);
    this.blocks.length = 0;
    this.head = undefined;
    this.available = 0;
  }
}
