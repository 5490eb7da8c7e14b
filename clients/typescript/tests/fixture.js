'use strict';
// A test cluster on 127.0.0.1: the Consul emulator (consul-testserver,
// optionally with ACLs) and idgen nodes sharing it as their store, every
// port picked by the OS. The binaries come from $IDGEN_BIN and
// $CONSUL_TESTSERVER (the idgen repository's target/debug by default).
const { spawn } = require('node:child_process');
const { mkdtempSync, writeFileSync, rmSync, existsSync } = require('node:fs');
const { tmpdir } = require('node:os');
const { join, resolve } = require('node:path');
const readline = require('node:readline');

const repo = resolve(__dirname, '..', '..', '..');
function bin(env, name) {
  if (process.env[env]) return process.env[env];
  const built = join(repo, 'target', 'debug', name);
  if (existsSync(built)) return built;
  throw new Error(`set ${env} to the ${name} binary (or build it: cargo build --bin ${name})`);
}

/** Resolves with the first line of `stream` that `match` accepts (bounded by `ms`). */
function firstLine(proc, stream, match, ms, what) {
  return new Promise((resolve, reject) => {
    const log = [];
    const timer = setTimeout(() => reject(new Error(`${what} not ready within ${ms} ms:\n${log.join('\n')}`)), ms);
    const rl = readline.createInterface({ input: stream });
    rl.on('line', (line) => {
      log.push(line);
      if (log.length > 200) log.shift();
      const m = match(line);
      if (m) {
        clearTimeout(timer);
        resolve(m);
      }
    });
    proc.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`${what} exited (${code}) before it was ready:\n${log.join('\n')}`));
    });
  });
}

/** Every process a cluster started, killed when this process ends however it ends. */
const started = new Set();
process.on('exit', () => {
  for (const p of started) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
});
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.once(signal, () => process.exit(1));
}

class Cluster {
  constructor() {
    this.dir = mkdtempSync(join(tmpdir(), 'idgen-ts-test-'));
    this.procs = [];
    this.nodes = [];
  }

  /** Records a started process (for stop() and for the exit handler). */
  track(proc) {
    this.procs.push(proc);
    started.add(proc);
    proc.on('exit', () => started.delete(proc));
    return proc;
  }

  /**
   * Starts the Consul emulator (`acl`: its master token, or undefined for
   * no ACLs); `datacenters`: more Consul datacenters linked with dc1, whose
   * agents' addresses land in `this.agents` (dc1's too).
   */
  async consul(acl, datacenters = []) {
    const args = ['--listen', '127.0.0.1:0', '--session-ttl-min', '1s', '--check-reap-interval', '1s'];
    if (acl) args.push('--acl-token', acl);
    for (const dc of datacenters) args.push('--add-datacenter', `${dc}=127.0.0.1:0`);
    const proc = this.track(spawn(bin('CONSUL_TESTSERVER', 'consul-testserver'), args, { stdio: ['ignore', 'pipe', 'pipe'] }));
    proc.stderr.resume();
    const agents = {};
    this.agents = await firstLine(
      proc,
      proc.stdout,
      (l) => {
        const first = /^listening on (\S+)/.exec(l);
        if (first) agents.dc1 = first[1];
        const more = /^datacenter (\S+) listening on (\S+)/.exec(l);
        if (more) agents[more[1]] = more[2];
        return Object.keys(agents).length === datacenters.length + 1 ? agents : undefined;
      },
      20000,
      'consul-testserver',
    );
    this.consulAddr = this.agents.dc1;
    this.acl = acl;
    return this.consulAddr;
  }

  /**
   * Starts one idgen node on the Consul store; `set` adds config lines
   * ([[section, key, value-as-TOML]]), `raw` TOML text at the end.
   */
  async node(name, set = [], raw = '') {
    const sections = new Map();
    const put = (s, k, v) => {
      if (!sections.has(s)) sections.set(s, new Map());
      sections.get(s).set(k, v);
    };
    const defaults = [
      ['node', 'instance_id', `"${name}"`],
      ['server', 'grpc_listen', '"127.0.0.1:0"'],
      ['server', 'http_listen', '"127.0.0.1:0"'],
      ['server', 'shutdown_grace', '"1s"'],
      ['store', 'backend', '"consul"'],
      ['consul', 'address', `"http://${this.consulAddr}"`],
      ['consul', 'cluster', '"test"'],
      ['consul', 'index_file', JSON.stringify(join(this.dir, `${name}.index.json`))],
      ['consul', 'session_ttl', '"2s"'],
      ['testing', 'consul_session_ttl_min', '"1s"'],
      ['consul', 'lock_delay', '"2s"'],
      ['consul', 'lock_margin', '"800ms"'],
      ['consul', 'timeout', '"500ms"'],
      ['consul', 'retries', '1'],
      ['consul', 'check_interval', '"200ms"'],
      ['consul', 'check_timeout', '"200ms"'],
      ['consul', 'deregister_critical_after', '"1s"'],
      ['consul', 'reclaim_backoff_max', '"500ms"'],
      ['segment', 'enabled', 'true'],
      ['segment', 'auto_create', 'true'],
      ['lease', 'enabled', 'true'],
      ['strict', 'enabled', 'true'],
      ['log', 'format', '"json"'],
      ['log', 'level', '"info"'],
    ];
    if (this.acl) defaults.push(['consul', 'token', `"${this.acl}"`]);
    for (const [s, k, v] of [...defaults, ...set]) put(s, k, v);
    let text = '';
    for (const [s, keys] of sections) {
      text += `[${s}]\n`;
      for (const [k, v] of keys) text += `${k} = ${v}\n`;
    }
    const config = join(this.dir, `${name}.toml`);
    writeFileSync(config, text + raw);
    const env = { ...process.env };
    delete env.RUST_LOG;
    // idgen reads IDGEN_<SECTION>__<KEY> and refuses any other IDGEN_ name.
    for (const k of Object.keys(env)) if (k.startsWith('IDGEN_')) delete env[k];
    const proc = this.track(spawn(bin('IDGEN_BIN', 'idgen'), ['serve', '--config', config], { stdio: ['ignore', 'ignore', 'pipe'], env }));
    const ready = await firstLine(
      proc,
      proc.stderr,
      (l) => (l.includes('"ready"') ? JSON.parse(l).fields : undefined),
      30000,
      `idgen node ${name}`,
    );
    const node = { name, grpc: ready.grpc, http: ready.http, proc };
    this.nodes.push(node);
    return node;
  }

  /** Starts the emulator and `n` nodes; resolves once Consul lists all of them as passing. */
  async start(n = 3, { acl, set = [], raw = '' } = {}) {
    await this.consul(acl);
    for (let i = 0; i < n; i++) await this.node(`n${i}`, set, raw);
    await this.passing(n);
    return this;
  }

  /** Waits (bounded) until Consul (the agent at `agent`, default dc1's) lists `n` passing idgen instances. */
  async passing(n, agent = this.consulAddr) {
    const headers = this.acl ? { 'X-Consul-Token': this.acl } : {};
    for (let i = 0; i < 400; i++) {
      const res = await fetch(`http://${agent}/v1/health/service/idgen?passing`, { headers });
      const list = await res.json();
      if (list.length === n) return;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error(`Consul did not list ${n} passing idgen nodes`);
  }

  /** kill -9 of one node; resolves once it is gone. */
  kill(node) {
    return new Promise((resolve) => {
      if (node.proc.exitCode !== null || node.proc.signalCode !== null) return resolve();
      node.proc.once('exit', () => resolve());
      node.proc.kill('SIGKILL');
    });
  }

  /** Stops everything and removes the files. */
  async stop() {
    await Promise.all(
      this.procs.map(
        (p) =>
          new Promise((resolve) => {
            if (p.exitCode !== null || p.signalCode !== null) return resolve();
            p.once('exit', () => resolve());
            p.kill('SIGKILL');
          }),
      ),
    );
    rmSync(this.dir, { recursive: true, force: true });
  }
}

module.exports = { Cluster, bin };
