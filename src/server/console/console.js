// idgen admin console. Plain JavaScript, no framework, nothing fetched
// from anywhere but this node. Every value from the server is set as text
// (textContent), never parsed as HTML. The admin token lives in this tab's
// sessionStorage only and goes out in an Authorization header, never in a
// URL or a cookie.
"use strict";

const TOKEN_KEY = "idgen-admin-token";

const $ = (id) => document.getElementById(id);

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

async function api(path, body) {
  const headers = { Accept: "application/json" };
  const t = token();
  if (t) headers.Authorization = "Bearer " + t;
  const init = { method: "GET", headers, credentials: "same-origin", cache: "no-store" };
  if (body !== undefined) {
    init.method = "POST";
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch("api/" + path, init);
  } catch (e) {
    return { ok: false, status: 0, error: { code: "UNAVAILABLE", message: "the node did not answer: " + e } };
  }
  let data = null;
  try {
    data = await response.json();
  } catch (e) {
    data = null;
  }
  if (response.ok) return { ok: true, status: response.status, data };
  const error = data && data.error ? data.error : { code: String(response.status), message: response.statusText };
  return { ok: false, status: response.status, error };
}

function el(tag, text, className) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (className) e.className = className;
  return e;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    if (c instanceof Node) {
      const td = document.createElement("td");
      td.appendChild(c);
      tr.appendChild(td);
    } else {
      tr.appendChild(el("td", c));
    }
  }
  return tr;
}

function fill(tableId, rows) {
  const body = $(tableId).querySelector("tbody");
  body.replaceChildren(...rows);
}

function seconds(ms) {
  return ms ? (ms / 1000).toFixed(1) + " s" : "";
}

// What a holder holds, as [kind, which]: the kind by its API name
// (worker, lease_token, format_token: one word, one meaning), a worker id
// as datacenter/worker, a lease token as zone/token, a format token as
// space/rendered (its number).
function holderParts(h) {
  if (h.kind === "worker") return ["worker", h.datacenter + "/" + h.id];
  if (h.kind === "format_token") return ["format_token", h.space + "/" + h.rendered + " (" + h.id + ")"];
  return ["lease_token", h.zone + "/" + h.id];
}

function holderName(h) {
  return holderParts(h).join(" ");
}

function stateCell(state) {
  const simple = state.split(" ")[0];
  return el("span", state, "state state-" + simple);
}

function showLogin(message) {
  $("console").classList.add("hidden");
  $("login").classList.remove("hidden");
  $("logout").classList.add("hidden");
  $("refresh").classList.add("hidden");
  $("auto").classList.add("hidden");
  $("auto-refresh").checked = false;
  setAuto();
  $("who").textContent = "";
  $("login-error").textContent = message || "";
}

function showConsole() {
  $("login").classList.add("hidden");
  $("console").classList.remove("hidden");
  $("logout").classList.remove("hidden");
  $("refresh").classList.remove("hidden");
  $("auto").classList.remove("hidden");
  $("login-error").textContent = "";
  $("who").textContent = token() ? "logged in with a token" : "logged in by client certificate";
}

function setStatus(text) {
  $("status").textContent = text || "";
}

function setActionError(text) {
  $("action-error").textContent = text || "";
  readError = false;
}

// What /admin/api/node said last, and the reading before it (the rate).
let thisNode = null;
let lastReading = null;
let rateText = "";

// What /admin/api/cluster said last: every node's published status.
let clusterView = null;
// The holders read last (the nodes table merges them in).
let lastHolders = [];

function layoutBits(l) {
  if (!l) return "";
  return l.time_bits + "/" + l.datacenter_bits + "/" + l.worker_bits + "/" + l.sequence_bits + ", unit " + l.time_unit_ms + " ms";
}

function rateWords(rate) {
  return rate === null || rate === undefined ? "(at its next report)" : Number(rate).toFixed(1) + " IDs/s";
}

function field(text, name, className) {
  const e = el("span", text, className);
  e.dataset.field = name;
  return e;
}

// The hide keys a node hides IDs with, each with the namespace it hides
// ("k2: lease zone 9 (4 version bits)"); "" when it hides nothing.
function hideUses(hides) {
  return (hides || []).map((u) => u.key + ": " + u.namespace + " (" + u.version_bits + " version bits)").join(", ");
}

// The status cells of one node from its published record (empty when it
// publishes none).
function statusCells(n) {
  if (!n) return ["", "", "", "", "", "", "", "", "", ""];
  const report = n.report || {};
  const issuing = n.ready && !n.fenced;
  const fenced = n.fenced === undefined ? "" : n.fenced ? "yes" : "no";
  const why = n.reason ? fenced + ": " + n.reason : fenced;
  const consul = n.consul ? n.consul.status + (n.consul.output ? ": " + n.consul.output : "") : "(embedded store)";
  const consulClass = n.consul ? "state state-" + (n.consul.status === "passing" ? "alive" : "released") : "";
  return [
    field(report.text || "", "report", "state report-" + (report.state || "unknown")),
    field(n.ready === undefined ? "" : n.ready ? "yes" : "no", "ready", issuing ? "state-alive" : "state-released"),
    field(why, "fenced"),
    field(n.version || "", "version"),
    field(layoutBits(n.layout), "layout"),
    field(n.node_number === undefined ? "" : n.node_number, "node_number"),
    field(n.issued ? String(sumIssued(n.issued)) : "", "issued"),
    field(n.report ? rateWords(n.rate) : "", "rate"),
    field(consul, "consul", consulClass),
    field(hideUses(n.hides), "hides"),
  ];
}

// A session id shortened for the nodes table (the full id on hover and
// in the holders table below).
function shortSession(s) {
  const e = el("span", s.length > 8 ? s.slice(0, 8) + "\u2026" : s);
  e.title = s;
  return e;
}

// The holders of one instance that belong to the node running now. A
// restarted (or re-claiming) node holds a new worker id under a new
// session while its old session may live on until its TTL: the row shows
// the worker id the node reports (its node number) and what that session
// holds, never the old and new ids mixed. With no report, the newest live
// session; with nothing live, what it held (a dead node's released ids).
function currentHolders(held, status) {
  const live = held.filter((h) => h.state !== "released" && h.state !== "gone");
  if (!live.length) return held;
  let session = null;
  if (status && status.layout && status.node_number !== undefined) {
    const bits = status.layout.worker_bits;
    const dc = Math.floor(status.node_number / 2 ** bits);
    const worker = status.node_number % 2 ** bits;
    const mine = live.find((h) => h.kind === "worker" && h.datacenter === dc && h.id === worker);
    if (mine) session = mine.session;
  }
  if (session === null) {
    const workers = live.filter((h) => h.kind === "worker").sort((a, b) => (a.since < b.since ? 1 : a.since > b.since ? -1 : 0));
    session = workers.length ? workers[0].session : live[0].session;
  }
  return live.filter((h) => h.session === session);
}

// One row per node: its published status (from /admin/api/cluster)
// merged with what the holders show of it.
function nodeRows(holders) {
  const nodes = new Map();
  const blank = (instance, address) => ({ instance, address, held: [], workers: [], tokens: [], sessions: new Set(), states: new Set(), ttl: 0, status: null });
  for (const s of (clusterView && clusterView.nodes) || []) {
    const n = blank(s.instance, s.address || "");
    n.status = s;
    nodes.set(s.instance, n);
  }
  for (const h of holders) {
    if (!nodes.has(h.instance)) nodes.set(h.instance, blank(h.instance, h.address));
    nodes.get(h.instance).held.push(h);
  }
  for (const n of nodes.values()) {
    for (const h of currentHolders(n.held, n.status)) {
      if (!n.address) n.address = h.address;
      if (h.kind === "worker") n.workers.push(holderParts(h)[1]);
      else if (h.kind === "format_token") n.tokens.push("format_token " + h.space + "/" + h.rendered);
      else n.tokens.push("lease_token " + holderParts(h)[1]);
      if (h.session) n.sessions.add(h.session);
      n.states.add(h.state);
      n.ttl = Math.max(n.ttl, h.session_ttl_ms);
    }
  }
  const rows = [];
  for (const n of [...nodes.values()].sort((a, b) => (a.instance < b.instance ? -1 : a.instance > b.instance ? 1 : 0))) {
    const actions = document.createElement("span");
    for (const s of n.sessions) {
      const b = el("button", "Renew session", "renew");
      b.type = "button";
      b.addEventListener("click", () => renew(s));
      actions.appendChild(b);
    }
    const name = thisNode && thisNode.instance === n.instance ? n.instance + " (this node)" : n.instance;
    const holderState = n.states.size ? stateCell([...n.states].join(", ")) : "";
    const sessions = document.createElement("span");
    for (const s of n.sessions) sessions.appendChild(shortSession(s));
    const tr = row([name, n.address].concat(statusCells(n.status), [n.workers.join(", "), n.tokens.join(", "), sessions, holderState, seconds(n.ttl), actions]));
    tr.dataset.instance = n.instance;
    tr.dataset.report = n.status && n.status.report ? n.status.report.state : "none";
    tr.classList.add("node");
    rows.push(tr);
  }
  return rows;
}

async function loadCluster() {
  const r = await api("cluster");
  if (!r.ok) {
    clusterView = null;
    $("nodes-note").textContent = "Every node's status could not be read (" + r.error.code + "): " + r.error.message;
    return;
  }
  clusterView = r.data;
  const every = (r.data.interval_ms / 1000).toFixed(0);
  $("nodes-note").textContent = r.data.backend === "consul"
    ? "Each node publishes its status to Consul every " + every + " s; a node silent for 3 of those is \"not reporting\". The Consul column is Consul's own check of it."
    : "The embedded store serves one node: this one.";
}

function holderRows(holders, backend) {
  return holders.map((h) => {
    const action = document.createElement("span");
    if (backend === "consul" && h.session) {
      const b = el("button", "Release", "release danger");
      b.type = "button";
      b.addEventListener("click", () => confirmRelease(h));
      action.appendChild(b);
    } else if (backend === "consul") {
      action.textContent = "free";
    }
    const [kind, id] = holderParts(h);
    const tr = row([kind, id, h.instance, h.since, h.session, stateCell(h.state), seconds(h.lock_delay_ms), action]);
    tr.dataset.kind = h.kind;
    tr.dataset.id = String(h.id);
    tr.dataset.instance = h.instance;
    tr.dataset.state = h.state;
    tr.classList.add("holder");
    return tr;
  });
}

// Shows or hides holder rows by the filter (all, held, released).
function applyHolderFilter() {
  const want = $("holder-filter").value;
  let shown = 0;
  let total = 0;
  for (const tr of $("holders").querySelectorAll("tr.holder")) {
    total += 1;
    const released = tr.dataset.state !== "alive";
    const show = want === "all" || (want === "held" ? !released : released);
    tr.classList.toggle("hidden", !show);
    if (show) shown += 1;
  }
  $("holder-count").textContent = shown + " of " + total + " rows shown";
}

async function loadHolders() {
  const r = await api("holders");
  if (!r.ok) return r;
  $("backend").textContent = r.data.backend;
  lastHolders = r.data.holders;
  fill("nodes", nodeRows(r.data.holders));
  fill("holders", holderRows(r.data.holders, r.data.backend));
  applyHolderFilter();
  return r;
}

function sumIssued(issued) {
  return Object.values(issued || {}).reduce((a, b) => a + b, 0);
}

// The rate between this reading of the node's counters and the last one.
function updateRate(node) {
  const now = performance.now();
  const total = sumIssued(node.issued);
  if (lastReading && lastReading.instance === node.instance && now > lastReading.at && total >= lastReading.total) {
    const secs = (now - lastReading.at) / 1000;
    rateText = ((total - lastReading.total) / secs).toFixed(1) + " IDs/s over the last " + secs.toFixed(1) + " s";
  } else {
    rateText = "(rate at the next refresh)";
  }
  lastReading = { instance: node.instance, at: now, total };
}

async function loadNode() {
  const r = await api("node");
  if (!r.ok) {
    thisNode = null;
    fill("node", [row(["error", r.error.code + ": " + r.error.message])]);
    return;
  }
  const n = r.data;
  thisNode = n;
  updateRate(n);
  const l = n.layout;
  const issued = Object.entries(n.issued).map(([m, c]) => m + " " + c).join(", ") || "none yet";
  const ready = el("span", n.ready ? "yes" : "no", n.ready ? "state-alive" : "state-released");
  const fenced = el("span", n.fenced ? "yes" : "no", n.fenced ? "state-released" : "state-alive");
  const rows = [
    row(["instance", n.instance]),
    row(["address", n.address]),
    row(["version", n.version]),
    row(["ready", ready]),
    row(["fenced", fenced]),
    row(["why not issuing", n.reason || "(it issues)"]),
    row(["node number (datacenter and worker id)", n.node_number]),
    row(["layout bits (time/datacenter/worker/sequence)", l.time_bits + "/" + l.datacenter_bits + "/" + l.worker_bits + "/" + l.sequence_bits + ", unit " + l.time_unit_ms + " ms"]),
    row(["IDs issued since start", issued]),
    row(["issue rate", rateText]),
  ];
  rows[0].dataset.instance = n.instance;
  rows[3].dataset.field = "ready";
  rows[4].dataset.field = "fenced";
  rows[8].dataset.field = "issued";
  rows[9].dataset.field = "rate";
  fill("node", rows);
}

function note(id, r) {
  $(id).textContent = r.ok ? "" : r.error.message;
}

// The tags read last (the hide keys panel names the hidden ones).
let lastTags = [];

async function loadTags() {
  const r = await api("tags");
  lastTags = r.ok ? r.data.tags : [];
  note("tags-note", r);
  fill("tags", r.ok ? r.data.tags.map(tagRow) : []);
  if (r.ok && r.data.unreadable.length) $("tags-note").textContent = r.data.unreadable.length + " record(s) unreadable: " + r.data.unreadable.map((u) => u.key + ": " + u.error).join("; ");
}

function button(text, className, onClick) {
  const b = el("button", text, className);
  b.type = "button";
  b.addEventListener("click", onClick);
  return b;
}

function tagRow(t) {
  const actions = document.createElement("span");
  actions.appendChild(button("Edit", "edit-tag", () => editTag(t)));
  actions.appendChild(button("Delete", "delete-tag danger", () => deleteTag(t.tag)));
  const hidden = t.hide ? "hidden (key " + t.hide.key + ")" : "plain";
  const tr = row([t.tag, t.max_id, t.next, t.step, hidden, t.description, t.updated, actions]);
  tr.dataset.tag = t.tag;
  tr.classList.add("tag");
  return tr;
}

// The counter of a format now, in words: the period named as its IDs
// render it (the stored key on hover), a scoped format's number of
// counters, or "unreadable" with the reason on hover and in the note
// (an error is never shown as if it were the counter).
function counterNow(f) {
  const c = f.current;
  if (!c) return "";
  if (c.error) {
    const e = el("span", "unreadable", "warn");
    e.title = c.error;
    return e;
  }
  if (c.scoped) {
    const n = c.counters === 1 ? "1 counter" : c.counters + " counters";
    return "per scope (" + c.scope_params.join(", ") + "): " + n;
  }
  if (!c.used) return "unused";
  let text = "last " + c.last + " (period " + c.period_label + ")";
  if (c.format_token) text += ", format_token " + c.format_token;
  const e = el("span", text);
  e.title = "stored period key " + c.period + " (seconds of " + f.time_zone + " wall time since 1970-01-01)";
  return e;
}

function formatCode(f) {
  const d = f.definition;
  if (d.lua) return d.lua;
  return JSON.stringify(d, null, 2);
}

function showCode(f) {
  $("format-code-title").textContent = "Code of " + f.name + " (" + f.kind + ", read-only)";
  $("format-code").textContent = formatCode(f);
  $("format-code").dataset.format = f.name;
}

function formatRow(f) {
  const d = f.definition;
  const text = d.template || (d.preset ? "preset " + d.preset : "Lua rule");
  const actions = document.createElement("span");
  actions.appendChild(button("Code", "show-code", () => showCode(f)));
  actions.appendChild(button("Edit", "edit-format", () => editFormat(f)));
  actions.appendChild(button("Delete", "delete-format danger", () => deleteFormat(f.name)));
  const range = f.counter.min + ".." + f.counter.max + " step " + f.counter.step;
  const tr = row([f.name, f.kind, el("code", text), f.scope, f.time_zone, f.reset, range, counterNow(f), actions]);
  tr.dataset.format = f.name;
  tr.classList.add("format");
  return tr;
}

async function loadFormats() {
  const r = await api("formats");
  note("formats-note", r);
  if (r.ok && !r.data.enabled) $("formats-note").textContent = "formatted mode is not configured on this node ([[formats]] in its config)";
  fill("formats", r.ok ? r.data.formats.map(formatRow) : []);
  const unreadable = r.ok ? r.data.formats.filter((f) => f.current && f.current.error) : [];
  if (unreadable.length) $("formats-note").textContent = "Counters not read: " + unreadable.map((f) => f.name + ": " + f.current.error).join("; ");
  const shown = $("format-code").dataset.format;
  const again = r.ok && r.data.formats.find((f) => f.name === shown);
  if (again) showCode(again);
}

async function loadStrict() {
  const r = await api("strict");
  note("strict-note", r);
  if (r.ok) $("strict-note").textContent = "default step " + r.data.default_step + "; every namespace with a stored step or a live key:";
  fill("strict", r.ok ? r.data.namespaces.map(namespaceRow) : []);
  if ($("keys-namespace").dataset.listed) await loadKeys($("keys-namespace").dataset.listed);
}

function namespaceRow(n) {
  const actions = document.createElement("span");
  actions.appendChild(button("Keys", "list-keys", () => loadKeys(n.namespace)));
  const tr = row([n.namespace, n.step_stored ? String(n.step) : n.step + " (default)", actions]);
  tr.dataset.namespace = n.namespace;
  tr.classList.add("namespace");
  return tr;
}

async function loadKeys(namespace) {
  const r = await api("strict/keys?namespace=" + encodeURIComponent(namespace));
  $("keys-namespace").dataset.listed = namespace;
  if (!r.ok) {
    $("keys-note").textContent = "Keys of " + namespace + " (" + r.error.code + "): " + r.error.message;
    fill("strict-keys", []);
    return;
  }
  $("keys-note").textContent = "Keys of " + r.data.namespace + ": " + r.data.keys.length + " live of at most " + r.data.max_keys + ", " + r.data.tombstones.length + " deleted. A deleted key's tombstone keeps the last value it handed out: used again, the key continues above it.";
  const live = r.data.keys.map((k) => {
    const tr = row([k.key, k.value, "live", button("Delete", "delete-key danger", () => deleteKey(k.key, namespace))]);
    tr.dataset.key = k.key;
    tr.classList.add("key");
    return tr;
  });
  const dead = r.data.tombstones.map((k) => {
    const tr = row([k.key, k.last_value, "deleted (tombstone)", ""]);
    tr.dataset.key = k.key;
    tr.classList.add("tombstone");
    return tr;
  });
  fill("strict-keys", live.concat(dead));
}

async function loadLayout() {
  const r = await api("layout");
  note("layout-note", r);
  if (!r.ok || !r.data.layout) {
    fill("layout", []);
    return;
  }
  const l = r.data.layout;
  fill("layout", [
    row(["preset", l.preset]),
    row(["epoch", l.epoch]),
    row(["time unit", l.time_unit_ms + " ms"]),
    row(["bits (time/datacenter/worker/sequence)", l.time_bits + "/" + l.datacenter_bits + "/" + l.worker_bits + "/" + l.sequence_bits]),
    row(["generation", r.data.generation]),
    row(["changing", r.data.changing ? "yes" : "no"]),
  ]);
}

// The datacenter id claims in the primary Consul datacenter (rule 44):
// one row per id with its owner, state and floor; a Release button on an
// owned or releasing id. On a node that cannot list them (the embedded
// store) the note says why, in the node's words.
function datacenterRow(c) {
  const actions = document.createElement("span");
  if (c.state === "owned" || c.state === "releasing") {
    actions.appendChild(button("Release", "release-datacenter danger", () => confirmDatacenter(c)));
  } else {
    actions.textContent = "free: the next claim starts above its floor";
  }
  const floor = c.floor_ms ? String(c.floor_ms) + " (" + new Date(c.floor_ms).toISOString() + ")" : "";
  const tr = row([String(c.id), stateCell(c.state), c.consul_datacenter, c.cluster, c.claimed_by, c.claimed, floor, actions]);
  tr.dataset.id = String(c.id);
  tr.dataset.state = c.state;
  tr.classList.add("datacenter");
  return tr;
}

// Why the table below is what it is, in words.
function datacentersNote(d) {
  if (!d.claims.length) return "Primary Consul datacenter " + d.primary + ": no datacenter id claimed yet (the first node of a datacenter claims its id).";
  let text = "Claims held in the primary Consul datacenter " + d.primary + ".";
  if (d.claims.every((c) => c.consul_datacenter === d.primary)) text += " Every id is the primary's own (one Consul datacenter): a release matters only when another Consul datacenter is to take an id.";
  if (d.unreadable.length) text += " " + d.unreadable.length + " record(s) unreadable: " + d.unreadable.map((u) => u.key + ": " + u.error).join("; ");
  return text;
}

async function loadDatacenters() {
  const r = await api("datacenters");
  if (!r.ok) {
    $("datacenters-note").textContent = "Nothing to show: " + r.error.message;
    $("datacenters-note").dataset.code = r.error.code;
    fill("datacenters", []);
    return;
  }
  delete $("datacenters-note").dataset.code;
  $("datacenters-note").textContent = datacentersNote(r.data);
  fill("datacenters", r.data.claims.map(datacenterRow));
}

// Asks before a datacenter id's release. Force is explained in the
// dialog before it can be ticked, and is off each time it opens.
let datacenterPending = null;

function confirmDatacenter(c) {
  datacenterPending = c;
  $("dc-confirm-title").textContent = "Release datacenter id " + c.id + " of Consul datacenter " + c.consul_datacenter + "?";
  $("dc-confirm-text").textContent = "Another Consul datacenter's nodes can then claim id " + c.id + "; they start above the highest mark " + c.consul_datacenter + " wrote, whatever their clocks say. The node refuses, changing nothing, while " + c.consul_datacenter + " still has a passing node of id " + c.id + " or a worker id of it held by a live session." + (c.state === "releasing" ? " A release of it began and did not finish: no node issues on it until it is run again." : "");
  $("dc-confirm-force-text").textContent = "Force is for an owner that is gone but whose sessions live on (a node killed keeps its session until its TTL runs out): it destroys every session of " + c.consul_datacenter + " holding a worker id of " + c.id + " (any node of it still running stops issuing) and waits out their lock-delay, up to 60 s. Never force while " + c.consul_datacenter + "'s nodes run.";
  $("dc-confirm-force").checked = false;
  $("dc-confirm").returnValue = "";
  $("dc-confirm").showModal();
}

async function datacenterConfirmed() {
  const c = datacenterPending;
  datacenterPending = null;
  if (!c || $("dc-confirm").returnValue !== "ok") return;
  const force = $("dc-confirm-force").checked;
  const what = "Releasing datacenter id " + c.id + (force ? " (forced: waiting out the lock-delay)" : "");
  await submit(what, "datacenters/release", { id: c.id, force });
}

// What uses hide key `id`, as far as this console sees: hidden segment
// tags, and what each node publishes it hides (its lease zone, layout).
function hideKeyUsers(id) {
  const users = lastTags.filter((t) => t.hide && t.hide.key === id).map((t) => "tag " + t.tag);
  for (const n of (clusterView && clusterView.nodes) || []) {
    for (const u of n.hides || []) if (u.key === id) users.push(n.instance + ": " + u.namespace);
  }
  return users.join(", ");
}

function hideKeyRow(k) {
  const versions = k.versions.map((v) => v.version + " " + v.state + " (" + v.created + ")").join(", ");
  const actions = document.createElement("span");
  actions.appendChild(button("Rotate", "rotate-key", () => confirmKey("rotate", k)));
  if (k.active !== null && k.active !== undefined) actions.appendChild(button("Retire", "retire-key danger", () => confirmKey("retire", k)));
  const active = k.active === null || k.active === undefined ? "none (retired: rotate it to issue again)" : String(k.active);
  const tr = row([k.key_id, active, versions, hideKeyUsers(k.key_id), actions]);
  tr.dataset.key = k.key_id;
  tr.classList.add("hide-key");
  return tr;
}

async function loadHideKeys() {
  const r = await api("hide-keys");
  note("hide-keys-note", r);
  if (r.ok && !r.data.keys.length) $("hide-keys-note").textContent = "No hide keys yet: create one below (or idgen admin keys create KEY_ID).";
  fill("hide-keys", r.ok ? r.data.keys.map(hideKeyRow) : []);
}

async function submitHideKey() {
  const keyId = $("hide-key-id").value.trim();
  const ok = await submit("Creating hide key " + keyId, "hide-keys", { action: "create", key_id: keyId });
  if (ok) {
    $("hide-key-form").reset();
    formDone($("hide-key-form"));
  }
}

// Asks before a rotation or a retirement, as `idgen admin keys` makes
// each a deliberate act: a rotation names what follows (and a forced one,
// like --force, needs the key id typed); a retirement stops every
// namespace using the key from issuing, so it always needs the key id
// typed. Resolves to the confirmed body, or null.
let keyPending = null;

function typedMatches() {
  const d = keyPending;
  const needsTyping = d && (d.action === "retire" || $("key-confirm-force").checked);
  $("key-confirm-typed-row").classList.toggle("hidden", !needsTyping);
  $("key-confirm-ok").disabled = Boolean(needsTyping && $("key-confirm-typed").value !== d.key.key_id);
}

function confirmKey(action, k) {
  keyPending = { action, key: k };
  const next = k.versions.length ? Math.max(...k.versions.map((v) => v.version)) + 1 : 0;
  const users = hideKeyUsers(k.key_id) || "none this console sees";
  if (action === "rotate") {
    $("key-confirm-title").textContent = "Rotate hide key " + k.key_id + "?";
    $("key-confirm-text").textContent = "Version " + next + " becomes active; version " + (k.active === null || k.active === undefined ? "(none)" : k.active) + " becomes decode-only (its IDs still decode). Used by: " + users + ". Refused, changing nothing, if a namespace using the key cannot hold version " + next + ".";
    $("key-confirm-ok").textContent = "Rotate";
  } else {
    $("key-confirm-title").textContent = "Retire hide key " + k.key_id + "?";
    $("key-confirm-text").textContent = "Version " + k.active + " becomes decode-only with no successor: every namespace using the key (" + users + ") refuses to issue until the key is rotated. IDs already issued still decode.";
    $("key-confirm-ok").textContent = "Retire";
  }
  $("key-confirm-force").checked = false;
  $("key-confirm-force-row").classList.toggle("hidden", action !== "rotate");
  $("key-confirm-typed").value = "";
  $("key-confirm-typed-label").textContent = "Type the key id (" + k.key_id + ") to confirm";
  typedMatches();
  $("key-confirm").returnValue = "";
  $("key-confirm").showModal();
}

async function keyConfirmed() {
  const d = keyPending;
  keyPending = null;
  if (!d || $("key-confirm").returnValue !== "ok") return;
  const body = { action: d.action, key_id: d.key.key_id };
  if (d.action === "rotate" && $("key-confirm-force").checked) body.force = true;
  if ((d.action === "retire" || body.force) && $("key-confirm-typed").value !== d.key.key_id) return;
  const verb = d.action === "rotate" ? "Rotating" : "Retiring";
  await submit(verb + " hide key " + d.key.key_id, "hide-keys", body);
}

// Whether the error line shows a failed read (cleared by the next good
// read) rather than a refused change (kept until the next action, so an
// auto-refresh never hides it).
let readError = false;

async function load() {
  const r = await loadHolders();
  if (!r.ok) {
    if (r.status === 401 || r.status === 403) {
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin(r.error.message);
    } else {
      showConsole();
      setActionError("Reading the holders failed (" + r.error.code + "): " + r.error.message);
      readError = true;
    }
    return false;
  }
  if (readError) setActionError("");
  readError = false;
  showConsole();
  await Promise.all([loadNode(), loadCluster()]);
  fill("nodes", nodeRows(lastHolders)); // again, with every node's status
  await Promise.all([loadTags(), loadFormats(), loadStrict(), loadLayout(), loadDatacenters()]);
  await loadHideKeys(); // after the tags: it names the hidden ones
  return true;
}

// A change through the console: its answer's message in the status line,
// or the admin API's error verbatim; then everything is read again.
async function submit(what, path, body) {
  setActionError("");
  setStatus(what + "...");
  const r = await api(path, body);
  await load();
  if (r.ok) {
    setStatus(r.data.message || what + ": done");
  } else {
    setStatus("");
    setActionError(what + " failed (" + r.error.code + "): " + r.error.message);
  }
  return r.ok;
}

// Asks before a deletion; resolves to whether the operator confirmed.
function ask(title, text) {
  return new Promise((resolve) => {
    const d = $("ask");
    $("ask-title").textContent = title;
    $("ask-text").textContent = text;
    d.addEventListener("close", () => resolve(d.returnValue === "ok"), { once: true });
    d.returnValue = "";
    d.showModal();
  });
}

function formDone(form) {
  delete form.dataset.dirty;
}

function resetTagForm() {
  const f = $("tag-form");
  f.reset();
  $("tag-mode").value = "create";
  $("tag-name").readOnly = false;
  $("tag-form-title").textContent = "Create a tag";
  $("tag-value-label").textContent = "Initial (first ID is one above)";
  $("tag-value").placeholder = "0";
  $("tag-hide-key").disabled = false;
  $("tag-submit").textContent = "Create";
  formDone(f);
}

function editTag(t) {
  resetTagForm();
  $("tag-mode").value = "update";
  $("tag-name").value = t.tag;
  $("tag-name").readOnly = true;
  $("tag-step").value = String(t.step);
  $("tag-description").value = t.description;
  $("tag-form-title").textContent = "Edit tag " + t.tag;
  $("tag-value-label").textContent = "Raise max_id to (leave empty to keep " + t.max_id + ")";
  $("tag-value").placeholder = t.max_id;
  $("tag-hide-key").value = t.hide ? t.hide.key : "";
  $("tag-hide-key").disabled = true;
  $("tag-submit").textContent = "Save";
  $("tag-form").dataset.dirty = "1";
  $("tag-step").focus();
}

// The step as a number, or undefined when empty (big values stay strings
// on the wire; a step is small).
function stepValue(id) {
  const v = $(id).value.trim();
  return v === "" ? undefined : Number(v);
}

async function submitTag() {
  const update = $("tag-mode").value === "update";
  const body = { tag: $("tag-name").value.trim() };
  const step = stepValue("tag-step");
  if (step !== undefined) body.step = step;
  body.description = $("tag-description").value;
  const value = $("tag-value").value.trim();
  // 64-bit values go as decimal strings: a Number rounds above 2^53.
  if (value !== "") body[update ? "max_id" : "initial"] = value;
  const hideKey = $("tag-hide-key").value.trim();
  if (!update && hideKey !== "") body.hide_key = hideKey;
  const ok = await submit((update ? "Saving" : "Creating") + " tag " + body.tag, update ? "tags/update" : "tags/create", body);
  if (ok) resetTagForm();
}

async function deleteTag(tag) {
  const yes = await ask("Delete tag " + tag + "?", "New ranges of " + tag + " are refused from now on. Its record stays as a tombstone, so creating " + tag + " again continues above every ID it handed out.");
  if (yes) await submit("Deleting tag " + tag, "tags/delete", { name: tag });
}

function resetFormatForm() {
  const f = $("format-form");
  f.reset();
  $("format-mode").value = "create";
  $("format-name").readOnly = false;
  $("format-form-title").textContent = "Create a format";
  $("format-submit").textContent = "Create";
  formDone(f);
}

function editFormat(f) {
  resetFormatForm();
  const d = Object.assign({}, f.definition);
  const lua = d.lua || "";
  delete d.lua;
  delete d.name;
  $("format-mode").value = "update";
  $("format-name").value = f.name;
  $("format-name").readOnly = true;
  $("format-definition").value = JSON.stringify(d, null, 2);
  $("format-lua").value = lua;
  $("format-form-title").textContent = "Edit format " + f.name;
  $("format-submit").textContent = "Save";
  $("format-form").dataset.dirty = "1";
  showCode(f);
}

async function submitFormat() {
  const update = $("format-mode").value === "update";
  let def;
  try {
    const text = $("format-definition").value.trim();
    def = text === "" ? {} : JSON.parse(text);
  } catch (e) {
    setActionError("The definition is not JSON: " + e.message);
    return;
  }
  if (def === null || typeof def !== "object" || Array.isArray(def)) {
    setActionError("The definition must be a JSON object, such as {\"template\": \"{seq:6}\"}");
    return;
  }
  def.name = $("format-name").value.trim();
  const lua = $("format-lua").value;
  if (lua.trim() !== "") def.lua = lua;
  else delete def.lua;
  const what = (update ? "Saving" : "Creating") + " format " + def.name;
  if (update) $("format-submit").disabled = true;
  const ok = await submit(what, update ? "formats/update" : "formats/create", { definition: def });
  $("format-submit").disabled = false;
  if (ok) resetFormatForm();
}

async function deleteFormat(name) {
  const yes = await ask("Delete format " + name + "?", "Calls for " + name + " are refused from now on. Its definition and counters stay as a tombstone and the name can never be created again (a new definition could repeat its IDs); remove it from every config file's [[formats]] too.");
  if (yes) await submit("Deleting format " + name, "formats/delete", { name });
}

async function submitStrict() {
  const namespace = $("strict-namespace").value.trim();
  const step = stepValue("strict-step");
  const ok = await submit("Setting the step of " + namespace, "strict/step", { namespace, step: step === undefined ? 0 : step });
  if (ok) {
    $("strict-form").reset();
    formDone($("strict-form"));
  }
}

async function deleteKey(key, namespace) {
  const yes = await ask("Delete strict key " + key + "?", "It stops counting against the namespace's key limit. A tombstone keeps its last value, so the key used again continues above it.");
  if (yes) {
    await submit("Deleting key " + key, "strict/keys/delete", { key });
    await loadKeys(namespace);
  }
}

// Auto-refresh: reads everything again every few seconds, in place (no
// page reload), and waits while the operator edits a form or a dialog is
// open, so nothing typed is lost or changed under the cursor.
let autoTimer = null;

function editing() {
  if (document.querySelector("dialog[open]")) return true;
  const a = document.activeElement;
  if (a && a.closest && a.closest("form.edit") && a.matches("input, textarea, select")) return true;
  return document.querySelector("form.edit[data-dirty]") !== null;
}

async function autoTick() {
  if ($("console").classList.contains("hidden")) return;
  if (editing()) {
    $("refresh-state").textContent = "paused while you edit";
    return;
  }
  $("refresh-state").textContent = "last " + new Date().toLocaleTimeString();
  await load();
}

function setAuto() {
  if (autoTimer !== null) clearInterval(autoTimer);
  autoTimer = null;
  $("refresh-state").textContent = "";
  if ($("auto-refresh").checked) autoTimer = setInterval(autoTick, Number($("refresh-interval").value) * 1000);
}

function wireForms() {
  const forms = [
    ["tag-form", submitTag],
    ["format-form", submitFormat],
    ["strict-form", submitStrict],
    ["hide-key-form", submitHideKey],
  ];
  for (const [id, run] of forms) {
    $(id).addEventListener("input", () => { $(id).dataset.dirty = "1"; });
    $(id).addEventListener("submit", (e) => {
      e.preventDefault();
      run();
    });
  }
  $("keys-form").addEventListener("submit", (e) => {
    e.preventDefault();
    loadKeys($("keys-namespace").value.trim());
    $("keys-namespace").blur();
  });
  $("tag-cancel").addEventListener("click", resetTagForm);
  $("format-cancel").addEventListener("click", resetFormatForm);
  $("holder-filter").addEventListener("change", applyHolderFilter);
  $("auto-refresh").addEventListener("change", setAuto);
  $("refresh-interval").addEventListener("change", setAuto);
}

let pending = null;

function confirmRelease(h) {
  pending = h;
  $("confirm-title").textContent = "Release " + holderName(h) + "?";
  const alive = h.state === "alive";
  $("confirm-text").textContent = alive
    ? "It is held by instance " + h.instance + " at " + h.address + ", whose session " + h.session + " is still alive in Consul (a node that died keeps it until its TTL runs out). Releasing destroys that session, which frees everything that node holds (its worker id, its lease token and its format tokens). A node that is still running stops issuing by its lock deadline and claims again."
    : "Its session " + h.session + " is " + h.state + ".";
  $("confirm-delay").textContent = "Lock-delay: " + seconds(h.lock_delay_ms) + ". The release returns only after it has passed; until then no node can claim the id.";
  $("confirm").showModal();
}

async function release(h) {
  setActionError("");
  setStatus("Releasing " + holderName(h) + ": waiting out the lock-delay (" + seconds(h.lock_delay_ms) + ")...");
  const body = { kind: h.kind, id: h.id, force: h.state === "alive" };
  if (h.kind === "worker") body.datacenter = h.datacenter;
  else if (h.kind === "format_token") body.space = h.space;
  else body.zone = h.zone;
  const r = await api("release", body);
  await load();
  if (r.ok) {
    setStatus(r.data.message);
  } else {
    setStatus("");
    setActionError("Release failed (" + r.error.code + "): " + r.error.message);
  }
}

async function renew(session) {
  setActionError("");
  const r = await api("renew", { session });
  if (r.ok) setStatus(r.data.message);
  else setActionError("Renewal failed (" + r.error.code + "): " + r.error.message);
  await loadHolders();
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    load();
  });
  $("logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin("");
  });
  $("refresh").addEventListener("click", () => {
    setActionError("");
    load();
  });
  wireForms();
  $("key-confirm").addEventListener("close", keyConfirmed);
  $("dc-confirm").addEventListener("close", datacenterConfirmed);
  $("key-confirm-typed").addEventListener("input", typedMatches);
  $("key-confirm-force").addEventListener("change", typedMatches);
  $("confirm").addEventListener("close", () => {
    const h = pending;
    pending = null;
    if (h && $("confirm").returnValue === "ok") release(h);
  });
  if (token() !== null) load();
});
