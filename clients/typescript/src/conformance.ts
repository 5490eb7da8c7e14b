/**
 * The conformance driver (clients/conformance/ in the idgen repository):
 * reads JSON requests, one per line, on stdin; writes one JSON response
 * per line on stdout; logs to stderr only; exits 0 at end of input. IDs
 * travel as decimal strings.
 */
import { createInterface } from 'node:readline';

import { Client, type ClientOptions, type Mode } from './client';
import { IdgenError } from './errors';

type Request = Record<string, unknown> & { id: number; op: string };

/** The fields of a node's answer that are set, as strings (`names` renames proto fields; a map field becomes `<prefix>.<key>`). */
function strings(
  obj: object,
  names: Record<string, string> = {},
  maps: Record<string, string> = {},
): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(obj)) {
    if (k.startsWith('_') || v === undefined || v === null) continue;
    if (typeof v === 'object' && !Buffer.isBuffer(v) && !Array.isArray(v)) {
      for (const [mk, mv] of Object.entries(v)) out[`${maps[k] ?? k}.${mk}`] = String(mv);
    } else {
      out[names[k] ?? k] = String(v);
    }
  }
  return out;
}

/** A DecodeId answer by the protocol's names (`internal_id` and `key_version` only when the node sent them). */
function decoded(d: object): Record<string, string> {
  const all = strings(d, { unix_millis: 'timestamp_ms', datacenter: 'datacenter_id', worker: 'worker_id' });
  const keep = ['id', 'timestamp_ms', 'datacenter_id', 'worker_id', 'sequence', 'zone', 'token', 'hidden', 'key_version', 'internal_id', 'time'];
  return Object.fromEntries(Object.entries(all).filter(([k]) => keep.includes(k)));
}

class Driver {
  private client: Client | undefined;

  private get c(): Client {
    if (!this.client) throw new IdgenError('no client: send "open" first', 'FAILED_PRECONDITION');
    return this.client;
  }

  async handle(r: Request): Promise<Record<string, unknown>> {
    switch (r.op) {
      case 'open':
        return this.open(r);
      case 'gen': {
        const { ids, node } = await this.c.genIdsFrom(r.mode as Mode, String(r.tag ?? ''), Number(r.count));
        return { ids: ids.map(String), node };
      }
      case 'next':
        return this.next(r);
      case 'formatted': {
        const f = await this.c.genFormatted(String(r.format), (r.params as Record<string, string>) ?? {}, Number(r.count));
        return { ids: f.ids };
      }
      case 'parse':
        return { fields: strings(await this.c.parseFormatted(String(r.format), String(r.value)), {}, { params: 'param' }) };
      case 'counter':
        return { counter: strings(await this.c.formatCounter(String(r.format), (r.params as Record<string, string>) ?? {})) };
      case 'decode':
        return { fields: decoded(await this.c.decodeId(String(r.value), (r.mode as Mode) || 'snowflake')) };
      case 'reveal':
        return { fields: decoded(await this.c.decodeSegmentId(String(r.tag), String(r.value))) };
      case 'uuid':
        return { uuids: await this.c.genUuids(Number(r.count)) };
      case 'strict_route':
        return { node: this.c.strictNode(String(r.key)) ?? null };
      case 'nodes':
        return { nodes: this.c.nodes() };
      case 'close':
        this.client?.close();
        this.client = undefined;
        return {};
      default:
        throw new IdgenError(`unknown op ${JSON.stringify(r.op)}`, 'UNIMPLEMENTED');
    }
  }

  private async open(r: Request): Promise<Record<string, unknown>> {
    const tls = r.tls as { ca: string; cert: string | null; key: string | null; server_name: string | null } | null;
    const prefetch = r.prefetch as { size: number; low: number } | null;
    const options: ClientOptions = {
      deadlineMs: Number(r.deadline_ms),
      attemptMs: Number(r.attempt_ms),
      adminToken: (r.admin_token as string | null) ?? undefined,
    };
    // Optional fallback_datacenters: other Consul datacenters to fall back to, in order.
    if (r.discovery === 'consul') options.consul = { fallbackDatacenters: (r.fallback_datacenters as string[] | undefined) ?? [] };
    else options.endpoints = r.nodes as string[];
    if (tls) {
      options.tls = {
        caFile: tls.ca,
        certFile: tls.cert ?? undefined,
        keyFile: tls.key ?? undefined,
        serverName: tls.server_name ?? undefined,
      };
    }
    if (prefetch) {
      options.prefetch = { batch: prefetch.size, maxBatch: prefetch.size, lowWater: prefetch.low };
    }
    this.client = await Client.connect(options);
    return { nodes: this.client.nodes() };
  }

  private async next(r: Request): Promise<Record<string, unknown>> {
    const ids: string[] = [];
    const mode = r.mode as Mode;
    const tag = String(r.tag ?? '');
    try {
      for (let i = 0; i < Number(r.count); i++) ids.push((await this.c.nextId(mode, tag)).toString());
    } catch (e) {
      throw Object.assign(e as Error, { ids });
    }
    return { ids };
  }
}

function failure(id: unknown, e: unknown): Record<string, unknown> {
  const err = e as Error & { code?: unknown; sent?: unknown; ids?: unknown };
  const out: Record<string, unknown> = {
    id,
    ok: false,
    code: err instanceof IdgenError ? err.code : 'UNKNOWN',
    message: err?.message ?? String(e),
    sent: err instanceof IdgenError ? err.sent : false,
  };
  if (err?.ids !== undefined) out.ids = err.ids;
  return out;
}

/** Runs the driver on stdin/stdout until end of input or "close". */
export async function main(): Promise<void> {
  const driver = new Driver();
  const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
  const write = (o: unknown) => process.stdout.write(`${JSON.stringify(o)}\n`);
  for await (const line of lines) {
    if (line.trim() === '') continue;
    let r: Request;
    try {
      r = JSON.parse(line);
    } catch (e) {
      write(failure(null, new IdgenError(`not JSON: ${(e as Error).message}`, 'INVALID_ARGUMENT')));
      continue;
    }
    try {
      write({ id: r.id, ok: true, ...(await driver.handle(r)) });
    } catch (e) {
      process.stderr.write(`driver: ${r.op}: ${(e as Error)?.message}\n`);
      write(failure(r.id, e));
    }
    if (r.op === 'close') break;
  }
  await driver.handle({ id: 0, op: 'close' });
  // Exit once stdout is flushed (a pipe is written asynchronously).
  process.stdout.write('', () => process.exit(0));
}
