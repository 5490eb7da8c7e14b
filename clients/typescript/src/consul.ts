/**
 * Finding the nodes in Consul: the passing instances of the service from
 * `/v1/health/service/<service>?passing`, followed with blocking queries.
 * The agent is configured like the consul CLI, from Consul's own
 * environment variables (the rules of Consul's Go API client, as the Rust
 * crate reads them): CONSUL_HTTP_ADDR (with or without a scheme),
 * CONSUL_HTTP_SSL, CONSUL_HTTP_TOKEN / CONSUL_HTTP_TOKEN_FILE (the file
 * wins when it holds a token), CONSUL_CACERT, CONSUL_CLIENT_CERT /
 * CONSUL_CLIENT_KEY, CONSUL_TLS_SERVER_NAME (a :port suffix dropped) and
 * CONSUL_HTTP_SSL_VERIFY. Explicit options win over the variables.
 */
import { readFileSync } from 'node:fs';
import * as http from 'node:http';
import * as https from 'node:https';

/** Consul discovery options; every one left out comes from Consul's environment variables. */
export interface ConsulOptions {
  /** The agent: `host:port`, `http://host:port` or `https://host:port` (default CONSUL_HTTP_ADDR, else 127.0.0.1:8500). */
  address?: string;
  /** The service name idgen nodes register (default `idgen`). */
  service?: string;
  /** An ACL token with service:read (default CONSUL_HTTP_TOKEN_FILE's content, else CONSUL_HTTP_TOKEN). */
  token?: string;
  /** Only instances with this tag. */
  tag?: string;
  /** Another datacenter's instances. */
  datacenter?: string;
  /** The blocking-query wait (default 5 min; Consul caps it at 10 min). */
  waitMs?: number;
  /** How long to wait before asking again after Consul could not be reached (default 1 s, jittered). */
  retryAfterMs?: number;
  /** The environment to read Consul's variables from (default process.env). */
  env?: NodeJS.ProcessEnv;
  /**
   * Consul datacenters to take nodes from, first one first, while the
   * local one (or `datacenter`) lists no passing idgen node; back to the
   * local one as soon as it lists one. Snowflake IDs and UUIDs cross (the
   * datacenter id is part of each, and every datacenter's nodes own their
   * own); strict, segment, lease and formatted calls are refused there
   * (CrossesDatacentersError) unless `countersMayCrossDatacenters`.
   */
  fallbackDatacenters?: string[];
  /** Let strict, segment, lease and formatted calls go to a fallback datacenter (their counters are per datacenter: only when each datacenter's keys and tags are its own). Default false. */
  countersMayCrossDatacenters?: boolean;
  /** While a fallback is in use: how long one blocking query on the local datacenter waits before the fallbacks are read again (default 5 s). */
  fallbackRecheckMs?: number;
}

const DEFAULT_ADDR = '127.0.0.1:8500';

/** A boolean variable as Consul parses it (Go's strconv.ParseBool); an error naming it otherwise. */
function parseBool(name: string, value: string | undefined): boolean | undefined {
  if (value === undefined || value === '') return undefined;
  if (['1', 't', 'T', 'true', 'TRUE', 'True'].includes(value)) return true;
  if (['0', 'f', 'F', 'false', 'FALSE', 'False'].includes(value)) return false;
  throw new Error(`${name}=${JSON.stringify(value)} is not a boolean: use true or false`);
}

/** The settings of one Consul agent, resolved from options and environment. */
export interface ConsulAgent {
  url: string;
  service: string;
  token?: string;
  tag?: string;
  datacenter?: string;
  waitMs: number;
  retryAfterMs: number;
  agent: http.Agent;
  fallbackDatacenters: string[];
  countersMayCross: boolean;
  fallbackRecheckMs: number;
}

/** Resolves `options` against Consul's variables; throws an Error whose message says what to set. */
export function consulAgent(options: ConsulOptions): ConsulAgent {
  const env = options.env ?? process.env;
  const v = (name: string) => (env[name] === '' ? undefined : env[name]);
  const ssl = parseBool('CONSUL_HTTP_SSL', v('CONSUL_HTTP_SSL')) ?? false;
  const raw = options.address ?? v('CONSUL_HTTP_ADDR') ?? DEFAULT_ADDR;
  const m = /^([a-z0-9+.-]+):\/\/(.*)$/i.exec(raw);
  let scheme = 'http';
  let rest = raw;
  if (m) {
    if (m[1] !== 'http' && m[1] !== 'https') {
      throw new Error(`CONSUL_HTTP_ADDR=${JSON.stringify(raw)}: the scheme ${m[1]}:// is not supported; use host:port, http:// or https://`);
    }
    scheme = m[1];
    rest = m[2];
  }
  if (rest === '') throw new Error(`CONSUL_HTTP_ADDR=${JSON.stringify(raw)} names no host`);
  if (ssl) scheme = 'https';
  const url = `${scheme}://${rest.replace(/\/+$/, '')}`;
  let token = options.token;
  if (token === undefined) {
    const file = v('CONSUL_HTTP_TOKEN_FILE');
    if (file !== undefined) {
      let text: string;
      try {
        text = readFileSync(file, 'utf8').trim();
      } catch (e) {
        throw new Error(`CONSUL_HTTP_TOKEN_FILE=${file}: cannot read the token file: ${(e as Error).message}`);
      }
      if (text !== '') token = text;
    }
    token ??= v('CONSUL_HTTP_TOKEN');
  }
  let agent: http.Agent;
  if (scheme === 'https') {
    const verify = parseBool('CONSUL_HTTP_SSL_VERIFY', v('CONSUL_HTTP_SSL_VERIFY')) ?? true;
    const cert = v('CONSUL_CLIENT_CERT');
    const key = v('CONSUL_CLIENT_KEY');
    if ((cert === undefined) !== (key === undefined)) {
      throw new Error('set both CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY, or neither');
    }
    const ca = v('CONSUL_CACERT');
    if (verify && ca === undefined) {
      throw new Error(
        `the Consul address ${url} is https://: it needs the CA (PEM) that signed the agent's certificate: set CONSUL_CACERT`,
      );
    }
    const read = (name: string, path: string) => {
      try {
        return readFileSync(path);
      } catch (e) {
        throw new Error(`${name}=${path}: ${(e as Error).message}`);
      }
    };
    let servername = v('CONSUL_TLS_SERVER_NAME');
    if (servername !== undefined) {
      const port = /^(.*[^:]|\[.*\]):\d+$/.exec(servername);
      if (port && (!port[1].includes(':') || port[1].endsWith(']'))) servername = port[1];
      servername = servername.replace(/^\[|\]$/g, '');
    }
    agent = new https.Agent({
      keepAlive: true,
      ca: ca === undefined ? undefined : read('CONSUL_CACERT', ca),
      cert: cert === undefined ? undefined : read('CONSUL_CLIENT_CERT', cert),
      key: key === undefined ? undefined : read('CONSUL_CLIENT_KEY', key),
      rejectUnauthorized: verify,
      servername,
    });
  } else {
    agent = new http.Agent({ keepAlive: true });
  }
  const waitMs = options.waitMs ?? 5 * 60_000;
  if (waitMs > 600_000) throw new Error("the blocking-query wait is at most 10 minutes (Consul's limit)");
  const fallbacks = options.fallbackDatacenters ?? [];
  if (!Array.isArray(fallbacks)) throw new Error('fallbackDatacenters is a list of datacenter names');
  if (fallbacks.some((dc) => !dc)) throw new Error('a fallback datacenter name is empty: name each Consul datacenter');
  const recheck = options.fallbackRecheckMs ?? 5000;
  if (!(recheck > 0)) throw new Error('the fallback recheck period must be above zero');
  return {
    url,
    service: options.service ?? 'idgen',
    token,
    tag: options.tag,
    datacenter: options.datacenter,
    waitMs,
    retryAfterMs: options.retryAfterMs ?? 1000,
    agent,
    fallbackDatacenters: fallbacks,
    countersMayCross: options.countersMayCrossDatacenters ?? false,
    fallbackRecheckMs: recheck,
  };
}

/** One round's answer: the addresses and Consul's index. */
export interface ConsulAnswer {
  addrs: string[];
  index: bigint;
}

/**
 * One query, blocking on `index` when it is not 0 (never on 0: Consul's
 * rule, so the first query answers at once). Rejects with an Error that
 * says what to change (a 403 names the token). `background`: the
 * request's socket does not keep the process alive.
 */
export function queryConsul(
  c: ConsulAgent,
  index: bigint,
  signal?: AbortSignal,
  background = false,
  dc?: string,
  waitMs?: number,
): Promise<ConsulAnswer> {
  const q = new URLSearchParams();
  q.set('passing', '');
  const datacenter = dc ?? c.datacenter;
  if (datacenter) q.set('dc', datacenter);
  if (c.tag) q.set('tag', c.tag);
  let timeout = 5000;
  const wait = waitMs ?? c.waitMs;
  if (index > 0n) {
    q.set('index', index.toString());
    q.set('wait', `${wait}ms`);
    timeout += wait + wait / 16;
  }
  const url = `${c.url}/v1/health/service/${encodeURIComponent(c.service)}?${q.toString().replace('passing=', 'passing')}`;
  const get = url.startsWith('https://') ? https.get : http.get;
  const headers: http.OutgoingHttpHeaders = {};
  if (c.token !== undefined) headers['X-Consul-Token'] = c.token;
  return new Promise((resolve, reject) => {
    const req = get(url, { agent: c.agent, headers, timeout, signal }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (d: Buffer) => chunks.push(d));
      res.on('error', reject);
      res.on('end', () => {
        const body = Buffer.concat(chunks).toString('utf8').trim();
        const status = res.statusCode ?? 0;
        if (status < 200 || status > 299) return reject(new Error(refusal(c, status, body)));
        let entries: Array<{ Node?: { Address?: string }; Service?: { Address?: string; Port?: number } }>;
        try {
          entries = JSON.parse(body);
        } catch (e) {
          return reject(new Error(`unreadable health answer: ${(e as Error).message}`));
        }
        const header = res.headers['x-consul-index'];
        let next = 0n;
        try {
          next = BigInt(Array.isArray(header) ? header[0] : header ?? '0');
        } catch {
          next = 0n;
        }
        const addrs = entries.map((e) => {
          const host = e.Service?.Address || e.Node?.Address || '';
          const port = e.Service?.Port ?? 0;
          return host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
        });
        resolve({ addrs, index: next });
      });
    });
    // A background watch's socket does not keep the process alive.
    if (background) req.on('socket', (s) => s.unref());
    req.on('timeout', () => req.destroy(new Error(`Consul at ${c.url} did not answer within ${timeout} ms`)));
    req.on('error', (e) => reject(new Error(sendError(c, e))));
  });
}

/** A refusal (not 2xx) in words: what to change. */
function refusal(c: ConsulAgent, status: number, body: string): string {
  if (status === 400 && body.includes('Client sent an HTTP request to an HTTPS server')) {
    return `Consul at ${c.url} serves HTTPS on this port: use an https:// address with a CA (CONSUL_CACERT)`;
  }
  if (status === 403) {
    const whose =
      c.token !== undefined
        ? 'the token given has no service:read on it'
        : 'no ACL token was sent: set CONSUL_HTTP_TOKEN or CONSUL_HTTP_TOKEN_FILE (or the consul token option)';
    return `Consul refused to list service ${JSON.stringify(c.service)} (HTTP 403 ${body}): ${whose}`;
  }
  return `HTTP ${status}: ${body}`;
}

function sendError(c: ConsulAgent, e: Error & { code?: string }): string {
  if (e.code === 'ECONNREFUSED') return `cannot reach Consul at ${c.url}: connection refused (is the agent running? CONSUL_HTTP_ADDR)`;
  if (c.url.startsWith('https://')) return `cannot reach Consul at ${c.url} over HTTPS: ${e.message} (check CONSUL_CACERT, CONSUL_TLS_SERVER_NAME, CONSUL_CLIENT_CERT/KEY)`;
  return `cannot reach Consul at ${c.url}: ${e.message}`;
}

/**
 * The name of the datacenter asked first: `datacenter`, else the agent's
 * own (/v1/agent/self, which needs agent:read; without it, the words
 * "the agent's own").
 */
export function localDatacenter(c: ConsulAgent): Promise<string> {
  if (c.datacenter) return Promise.resolve(c.datacenter);
  const get = c.url.startsWith('https://') ? https.get : http.get;
  const headers: http.OutgoingHttpHeaders = {};
  if (c.token !== undefined) headers['X-Consul-Token'] = c.token;
  const fallback = "the agent's own";
  return new Promise((resolve) => {
    const req = get(`${c.url}/v1/agent/self`, { agent: c.agent, headers, timeout: 5000 }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (d: Buffer) => chunks.push(d));
      res.on('error', () => resolve(fallback));
      res.on('end', () => {
        try {
          const name = JSON.parse(Buffer.concat(chunks).toString('utf8'))?.Config?.Datacenter;
          resolve(typeof name === 'string' && name !== '' ? name : fallback);
        } catch {
          resolve(fallback);
        }
      });
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', () => resolve(fallback));
  });
}

/** A list of names as Rust's Debug prints a Vec<String>: ["a", "b"]. */
function debugList(names: readonly string[]): string {
  return `[${names.map((n) => JSON.stringify(n)).join(', ')}]`;
}

/**
 * The refusal for fallback datacenters not in `known` (the agent's
 * /v1/catalog/datacenters), if any, in the Rust crate's words.
 */
export function unknownFallbacks(fallbacks: readonly string[], known: readonly string[]): string | undefined {
  const unknown = fallbacks.filter((f) => !known.includes(f));
  if (unknown.length === 0) return undefined;
  return `fallback datacenter(s) ${debugList(unknown)} unknown to the Consul agent, which knows ${debugList(known)}: name Consul datacenters (case matters)`;
}

/**
 * Checks the fallback datacenters against the agent's
 * /v1/catalog/datacenters (which needs no ACL) at start-up, so a misspelt
 * name fails there with the names there are instead of leaving the client
 * without nodes when the local datacenter has none. Resolves to the
 * refusal, or undefined: also when the agent does not answer the listing
 * (no reason to refuse: the watch reads each fallback anyway).
 */
export function checkFallbackNames(c: ConsulAgent): Promise<string | undefined> {
  const get = c.url.startsWith('https://') ? https.get : http.get;
  const headers: http.OutgoingHttpHeaders = {};
  if (c.token !== undefined) headers['X-Consul-Token'] = c.token;
  return new Promise((resolve) => {
    const req = get(`${c.url}/v1/catalog/datacenters`, { agent: c.agent, headers, timeout: 5000 }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (d: Buffer) => chunks.push(d));
      res.on('error', () => resolve(undefined));
      res.on('end', () => {
        if (res.statusCode !== 200) return resolve(undefined);
        try {
          const known: unknown = JSON.parse(Buffer.concat(chunks).toString('utf8'));
          if (!Array.isArray(known) || !known.every((k) => typeof k === 'string')) return resolve(undefined);
          resolve(unknownFallbacks(c.fallbackDatacenters, known as string[]));
        } catch {
          resolve(undefined);
        }
      });
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', () => resolve(undefined));
  });
}
