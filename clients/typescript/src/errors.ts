/**
 * What can go wrong when asking for IDs: one class per cause, each with
 * the gRPC code closest to it (`code`, a name such as `UNAVAILABLE`) and
 * `sent`: whether the request may have reached a node (a strict call that
 * may have reached one is never sent again).
 */

/** The base of every error this client throws. */
export class IdgenError extends Error {
  /** The gRPC code name closest to the error (`UNAVAILABLE`, `INVALID_ARGUMENT`, ...); `CONFIG` for a client-side configuration or TLS setup error. */
  readonly code: string;
  /** Whether the request may have reached a node (false when no attempt was made or every attempt provably never left this process). */
  sent: boolean;

  constructor(message: string, code: string, sent = false) {
    super(message);
    this.name = new.target.name;
    this.code = code;
    this.sent = sent;
  }
}

/** No node is known: the static list was empty, or Consul lists no passing instance. */
export class NoNodesError extends IdgenError {
  constructor() {
    super(
      'no idgen node is known: check the endpoint list or the Consul service name, tag and datacenter',
      'UNAVAILABLE',
    );
  }
}

/** The call's deadline passed before any node answered. */
export class DeadlineExceededError extends IdgenError {
  /** The configured per-call deadline in milliseconds. */
  readonly deadlineMs: number;
  /** The last error seen, or `none`. */
  readonly last: string;
  /** Attempts made (0: the wait was for something else, such as a prefetch refill). */
  readonly attempts: number;
  /** Distinct nodes those attempts went to. */
  readonly nodes: number;

  constructor(deadlineMs: number, last: string, attempts: number, nodes: number, sent: boolean) {
    super(
      `no node answered within the deadline of ${deadlineMs} ms${tried(attempts, nodes)} (last error: ${last})`,
      'DEADLINE_EXCEEDED',
      sent,
    );
    this.deadlineMs = deadlineMs;
    this.last = last;
    this.attempts = attempts;
    this.nodes = nodes;
  }
}

/** " after N attempts on M nodes", or nothing when no attempt was made. */
function tried(attempts: number, nodes: number): string {
  if (attempts === 0) return '';
  const plural = (n: number, word: string) => `${n} ${word}${n === 1 ? '' : 's'}`;
  return ` after ${plural(attempts, 'attempt')} on ${plural(nodes, 'node')}`;
}

/**
 * A node answered with an error another node cannot fix
 * (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, PERMISSION_DENIED,
 * ...), or a strict call failed in a way that may have reached the node.
 */
export class StatusError extends IdgenError {
  /** The node's own message (it says what to do). */
  readonly details: string;

  constructor(code: string, details: string, sent: boolean) {
    super(`idgen answered ${code}: ${details}`, code, sent);
    this.details = details;
  }
}

/**
 * A call failed on its way to or from a node (connection refused or
 * broken, TLS mismatch) and cannot be retried elsewhere (a strict call
 * that may have reached the node).
 */
export class TransportError extends IdgenError {
  /** The node's address. */
  readonly node: string;

  constructor(node: string, cause: string, sent: boolean) {
    super(`the call to ${node} failed in transit: ${cause}`, 'UNAVAILABLE', sent);
    this.node = node;
  }
}

/** Strict values must each come from a node: they are never prefetched. */
export class StrictNotPrefetchableError extends IdgenError {
  constructor() {
    super(
      'strict mode cannot be prefetched (each value must come from a node): use client.genId',
      'INVALID_ARGUMENT',
    );
  }
}

/**
 * A strict, segment, lease or formatted call while the nodes in use are a
 * fallback datacenter's (the local one lists no passing node): its value
 * would come from that datacenter's counter, which can hand out a value
 * the local cluster also hands out. Never sent; retry once a local node
 * passes, or see the consul option `countersMayCrossDatacenters`.
 */
export class CrossesDatacentersError extends IdgenError {
  constructor(
    readonly counter: string,
    readonly local: string,
    readonly fallback: string,
  ) {
    super(
      `${counter} refused: the local Consul datacenter ${JSON.stringify(local)} has no passing idgen node and the nodes in use are fallback datacenter ${JSON.stringify(fallback)}'s, whose counters are not the local cluster's (a value from there can repeat one issued here); retry once a local node passes, or opt in with counters_may_cross_datacenters if each datacenter's keys and tags are its own`,
      'UNAVAILABLE',
    );
  }
}

/** The client was configured wrongly (options, TLS files, Consul variables). */
export class ConfigError extends IdgenError {
  constructor(message: string) {
    super(`invalid client configuration: ${message}`, 'CONFIG');
  }
}

/** Consul could not be asked for the nodes at start-up. */
export class DiscoveryError extends IdgenError {
  constructor(message: string) {
    super(`Consul discovery failed: ${message}`, 'UNAVAILABLE');
  }
}

/** A node answered something this client cannot read (another version, or a proxy in between). */
export class BadAnswerError extends IdgenError {
  constructor(what: string) {
    super(`a node's answer makes no sense: ${what}`, 'INTERNAL', true);
  }
}

/** The client was closed: no more calls. */
export class ClosedError extends IdgenError {
  constructor() {
    super('the idgen client is closed', 'CANCELLED');
  }
}
