/**
 * One call to the cluster: pick a node, send, and on UNAVAILABLE or a
 * transport error try another node with jittered backoff, all inside the
 * call's deadline; each attempt gets at most the per-attempt budget.
 */
import * as grpc from '@grpc/grpc-js';

import {
  ClosedError,
  DeadlineExceededError,
  NoNodesError,
  StatusError,
  TransportError,
} from './errors';
import type { Node, NodeSet, Route } from './nodes';
import type { Method } from './proto';
import { failureWords } from './tls';

/** Deadline and backoff of calls, in milliseconds. */
export interface CallSettings {
  deadlineMs: number;
  /** The most one attempt on one node may take (a stalled node costs this, not the whole deadline). */
  attemptMs: number;
  backoffBaseMs: number;
  backoffMaxMs: number;
}

/**
 * Whether a retry on another node is allowed: `idempotent` (snowflake,
 * segment, lease, decoding: a request served twice is only a gap) or
 * `onlyIfNotSent` (strict: a request that reached a node may have taken a
 * value, so it is retried only when it provably never left this process).
 */
export type Retry = 'idempotent' | 'onlyIfNotSent';

/** The metadata key with which a node says another node may serve what it refused. */
const RETRY_ELSEWHERE = 'idgen-retry-elsewhere';

/** What one call tried, for the error that ends it. */
class Tally {
  attempts = 0;
  readonly nodes = new Set<string>();
  /** Some attempt may have reached a node. */
  sent = false;

  deadline(deadlineMs: number, last: string): DeadlineExceededError {
    return new DeadlineExceededError(deadlineMs, last, this.attempts, this.nodes.size, this.sent);
  }
}

/** Sends calls to the node set. */
export class Caller {
  closed = false;

  constructor(readonly nodes: NodeSet, readonly settings: CallSettings) {}

  /**
   * Runs `method` against one node after another until it succeeds, fails
   * with an error another node cannot fix, or the deadline passes. Returns
   * the answer and the node that gave it.
   */
  async call<Req, Resp>(
    method: Method<Req, Resp>,
    request: Req,
    retry: Retry,
    route: Route,
    metadata?: grpc.Metadata,
    counter?: string,
  ): Promise<{ value: Resp; node: string }> {
    const { deadlineMs, attemptMs } = this.settings;
    const started = Date.now();
    const tried: Node[] = [];
    const tally = new Tally();
    let last = 'none';
    let attempt = 0;
    for (;;) {
      if (this.closed) throw new ClosedError();
      const left = deadlineMs - (Date.now() - started);
      if (left <= 0) throw tally.deadline(deadlineMs, last);
      const node = this.nodes.pick(tried, route);
      if (!node) {
        if (tried.length === 0) throw new NoNodesError();
        // Every node was tried once: start over after a pause (one may be back).
        tried.length = 0;
        await this.backoff(attempt++, left);
        continue;
      }
      // Checked on the node about to be sent to, so a switch of datacenter
      // between two attempts cannot slip past it.
      if (counter !== undefined) this.nodes.crossing(node, counter);
      const budget = Math.min(left, attemptMs);
      tally.attempts++;
      tally.nodes.add(node.addr);
      node.outstanding++;
      let err: grpc.ServiceError;
      try {
        const value = await unary(node, method, request, budget, metadata);
        return { value, node: node.addr };
      } catch (e) {
        err = e as grpc.ServiceError;
      } finally {
        node.outstanding--;
      }
      const maybeSent = !neverSent(err);
      tally.sent ||= maybeSent;
      if (err.code === grpc.status.DEADLINE_EXCEEDED && isLocal(err)) {
        const said = `${node.addr} did not answer within ${budget === left ? 'the time left' : `the attempt budget of ${budget} ms`}`;
        this.nodes.setAside(node);
        if (budget >= left) {
          // `last`, not this round's `tried`: a round that started over has
          // forgotten its nodes, not what they said (a TLS refusal, say).
          throw tally.deadline(deadlineMs, last === 'none' ? said : `${said}; before that, ${last}`);
        }
        if (retry === 'onlyIfNotSent' && maybeSent) {
          throw tally.deadline(deadlineMs, `${said}; a strict call is not sent twice (the node may have taken a value)`);
        }
        last = said;
        tried.push(node);
        attempt++;
        continue;
      }
      last = this.refused(node, err, retry, maybeSent);
      tried.push(node);
      await this.backoff(attempt++, deadlineMs - (Date.now() - started));
    }
  }

  /**
   * A node answered `err` (or the connection failed with it): what to
   * report if no node succeeds when another node may be tried; throws the
   * call's error otherwise.
   */
  private refused(node: Node, err: grpc.ServiceError, retry: Retry, maybeSent: boolean): string {
    const transport = isTransport(err);
    const elsewhere =
      err.code === grpc.status.UNAVAILABLE || transport || err.metadata?.get(RETRY_ELSEWHERE).length > 0;
    if (elsewhere) this.nodes.setAside(node);
    const retryable = retry === 'idempotent' ? elsewhere : !maybeSent;
    const { tls, identity } = this.nodes.settings;
    const words = transport ? `${failureWords(err.details, tls, identity)} (${err.details})` : `${codeName(err.code)} ${err.details}`;
    if (!retryable) {
      if (transport) throw new TransportError(node.addr, words, maybeSent);
      throw new StatusError(codeName(err.code), err.details, maybeSent);
    }
    return `${node.addr}: ${words}`;
  }

  /** Sleeps a random time up to `base * 2^attempt`, capped at the maximum and the time left (full jitter). */
  private backoff(attempt: number, leftMs: number): Promise<void> {
    const cap = Math.max(
      0,
      Math.min(this.settings.backoffBaseMs * 2 ** Math.min(attempt, 16), this.settings.backoffMaxMs, leftMs),
    );
    return new Promise((resolve) => setTimeout(resolve, cap * Math.random()));
  }
}

/** One unary call on `node` with `budgetMs` as its gRPC deadline. */
function unary<Req, Resp>(
  node: Node,
  method: Method<Req, Resp>,
  request: Req,
  budgetMs: number,
  metadata?: grpc.Metadata,
): Promise<Resp> {
  return new Promise((resolve, reject) => {
    node.channel.makeUnaryRequest(
      method.path,
      method.serialize,
      method.deserialize,
      request,
      metadata ?? new grpc.Metadata(),
      { deadline: Date.now() + budgetMs },
      (err, value) => (err ? reject(err) : resolve(value as Resp)),
    );
  });
}

/** The name of gRPC code `code` (`UNAVAILABLE`, ...). */
export function codeName(code: number): string {
  return grpc.status[code] ?? `CODE_${code}`;
}

/**
 * The request provably never left this process: the connection to the
 * node could not be made (refused, no answer to the handshake), or the
 * call was still waiting for a connection when its time ran out.
 */
export function neverSent(err: grpc.ServiceError): boolean {
  const d = err.details ?? '';
  if (err.code === grpc.status.UNAVAILABLE && d.includes('No connection established')) return true;
  if (err.code === grpc.status.DEADLINE_EXCEEDED && d.includes('Waiting for LB pick')) return true;
  return false;
}

/** The client's own deadline (not a node's answer): grpc-js says how far the call got. */
function isLocal(err: grpc.ServiceError): boolean {
  return (err.details ?? '').startsWith('Deadline exceeded');
}

/**
 * The status came from the connection (refused, reset, closed, a TLS
 * failure), not from a node's answer.
 */
export function isTransport(err: grpc.ServiceError): boolean {
  const d = err.details ?? '';
  return (
    d.includes('No connection established') ||
    d.includes('Connection dropped') ||
    d.includes('Received RST_STREAM') ||
    d.includes('Protocol error') ||
    /E[A-Z]{4,}/.test(d) && (err.code === grpc.status.UNAVAILABLE || err.code === grpc.status.INTERNAL)
  );
}

