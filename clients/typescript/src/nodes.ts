/**
 * The known nodes: one gRPC channel each, how many calls each has in
 * flight, and which ones are set aside after answering UNAVAILABLE (until
 * a grpc.health.v1 probe finds them SERVING again).
 */
import * as grpc from '@grpc/grpc-js';

import { CrossesDatacentersError } from './errors';
import { rendezvous } from './hash';

/** One idgen node. */
export interface Node {
  /** `host:port`, as discovered. */
  readonly addr: string;
  readonly channel: grpc.Client;
  /** Calls in flight (the load measure of power-of-two choices). */
  outstanding: number;
  /** `Date.now()` until which the node is set aside; 0 when in use. */
  asideUntil: number;
  /** A health probe is running for it. */
  probing: boolean;
  /** The fallback Consul datacenter that listed it (undefined: the local one, or a static list). */
  readonly fallback?: string;
}

/** How a call chooses its node: any node (spread), or a strict key's own node. */
export type Route = { kind: 'spread' } | { kind: 'key'; hash: bigint };

/** Spread the load over the nodes. */
export const SPREAD: Route = { kind: 'spread' };

/** How nodes are dialled and set aside. */
export interface NodeSettings {
  credentials: grpc.ChannelCredentials;
  options: grpc.ChannelOptions;
  setAsideMs: number;
  /** TLS is used (for the words of a failure). */
  tls: boolean;
  /** A client certificate is presented. */
  identity: boolean;
  /** Strict, segment, lease and formatted calls may go to a fallback datacenter's nodes. */
  countersMayCross?: boolean;
}

const HEALTH_CHECK = '/grpc.health.v1.Health/Check';

/** The current set of nodes, replaced as a whole when discovery changes it. */
export class NodeSet {
  private nodes: Node[] = [];
  private closed = false;
  private readonly timers = new Set<NodeJS.Timeout>();

  /** The local datacenter's name, for the words of a refusal. */
  localDatacenter = 'local';

  constructor(readonly settings: NodeSettings) {}

  /** The fallback datacenter whose nodes are in use, or undefined. */
  fallback(): string | undefined {
    return this.nodes[0]?.fallback;
  }

  /**
   * Throws CrossesDatacentersError when a call whose values come from
   * `counter` (a strict key, a segment tag...) would go to a fallback
   * datacenter's node without the user's opt-in: that datacenter's
   * cluster counts the same keys in its own KV.
   */
  crossing(node: Node, counter: string): void {
    if (node.fallback !== undefined && !this.settings.countersMayCross) {
      throw new CrossesDatacentersError(counter, this.localDatacenter, node.fallback);
    }
  }

  /** The addresses currently known. */
  addrs(): string[] {
    return this.nodes.map((n) => n.addr);
  }

  get size(): number {
    return this.nodes.length;
  }

  /**
   * Replaces the set with `addrs`, keeping the channels (and counters) of
   * nodes that stay and closing those of nodes that left. Throws for an
   * address that is not `host:port`.
   */
  replace(addrs: string[], fallback?: string): void {
    const old = new Map(this.nodes.filter((n) => n.fallback === fallback).map((n) => [n.addr, n]));
    const next: Node[] = [];
    for (const addr of addrs) {
      if (next.some((n) => n.addr === addr)) continue;
      checkAddr(addr);
      next.push(
        old.get(addr) ?? {
          addr,
          channel: new grpc.Client(addr, this.settings.credentials, this.settings.options),
          outstanding: 0,
          asideUntil: 0,
          probing: false,
          fallback,
        },
      );
    }
    for (const n of this.nodes) {
      if (!next.includes(n)) n.channel.close();
    }
    this.nodes = next;
  }

  /**
   * A node among those in use and not in `tried` (falling back to set
   * aside nodes when no other is left): for a spread route, power of two
   * choices (two random ones, the one with fewer calls in flight); for a
   * key, the key's own node by rendezvous hashing, and the next one in
   * the key's order when it is not available.
   */
  pick(tried: readonly Node[], route: Route): Node | undefined {
    const now = Date.now();
    const fresh = this.nodes.filter((n) => !tried.includes(n));
    let candidates = fresh.filter((n) => n.asideUntil <= now);
    if (candidates.length === 0) candidates = fresh;
    if (candidates.length === 0) return undefined;
    if (candidates.length === 1) return candidates[0];
    if (route.kind === 'key') {
      // Rust's max_by_key: the last of equal maxima.
      let best = candidates[0];
      let bestScore = rendezvous(route.hash, best.addr);
      for (const n of candidates.slice(1)) {
        const score = rendezvous(route.hash, n.addr);
        if (score >= bestScore) {
          best = n;
          bestScore = score;
        }
      }
      return best;
    }
    const len = candidates.length;
    const a = Math.floor(Math.random() * len);
    let b = Math.floor(Math.random() * (len - 1));
    if (b >= a) b += 1;
    return candidates[b].outstanding < candidates[a].outstanding ? candidates[b] : candidates[a];
  }

  /**
   * Sets a node aside after it answered UNAVAILABLE or could not be
   * reached: it gets no calls (unless no other node is left) until a
   * health probe, every set-aside period, finds it SERVING.
   */
  setAside(node: Node): void {
    node.asideUntil = Number.MAX_SAFE_INTEGER;
    if (node.probing || this.closed) return;
    node.probing = true;
    const probe = () => {
      const timer = setTimeout(() => {
        this.timers.delete(timer);
        if (this.closed || !this.nodes.includes(node)) {
          node.probing = false;
          return;
        }
        const deadline = new Date(Date.now() + this.settings.setAsideMs);
        node.channel.makeUnaryRequest(
          HEALTH_CHECK,
          (service: string) => encodeHealthRequest(service),
          (bytes: Buffer) => decodeHealthStatus(bytes),
          'idgen.v1.IdGen',
          new grpc.Metadata(),
          { deadline },
          (err, status) => {
            if (!err && status === SERVING) {
              node.asideUntil = 0;
              node.probing = false;
            } else {
              probe();
            }
          },
        );
      }, this.settings.setAsideMs);
      timer.unref();
      this.timers.add(timer);
    };
    probe();
  }

  /** Closes every channel and stops the probes. */
  close(): void {
    this.closed = true;
    for (const t of this.timers) clearTimeout(t);
    this.timers.clear();
    for (const n of this.nodes) n.channel.close();
    this.nodes = [];
  }
}

const SERVING = 1;

/** HealthCheckRequest { string service = 1; } */
function encodeHealthRequest(service: string): Buffer {
  const name = Buffer.from(service, 'utf8');
  return Buffer.concat([Buffer.from([0x0a, name.length]), name]);
}

/** HealthCheckResponse { ServingStatus status = 1; }: the status, 0 when absent. */
function decodeHealthStatus(bytes: Buffer): number {
  for (let i = 0; i + 1 < bytes.length; i += 2) {
    if (bytes[i] === 0x08) return bytes[i + 1];
  }
  return 0;
}

/** Throws unless `addr` is `host:port` (IPv6 hosts in brackets). */
export function checkAddr(addr: string): void {
  const i = addr.lastIndexOf(':');
  const host = addr.slice(0, i).replace(/^\[|\]$/g, '');
  const port = Number(addr.slice(i + 1));
  if (i <= 0 || host === '' || !Number.isInteger(port) || port < 1 || port > 65535) {
    throw new Error(`bad node address ${JSON.stringify(addr)}: expected host:port`);
  }
}
