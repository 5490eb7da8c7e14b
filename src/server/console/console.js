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

// What a holder holds, as [kind, which]: a worker id is datacenter/worker,
// a lease token zone/token, a format token space/rendered (its number).
function holderParts(h) {
  if (h.kind === "worker") return ["worker id", h.datacenter + "/" + h.id];
  if (h.kind === "format_token") return ["format token", h.space + "/" + h.rendered + " (" + h.id + ")"];
  return ["lease token", h.zone + "/" + h.id];
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
  $("who").textContent = "";
  $("login-error").textContent = message || "";
}

function showConsole() {
  $("login").classList.add("hidden");
  $("console").classList.remove("hidden");
  $("logout").classList.remove("hidden");
  $("refresh").classList.remove("hidden");
  $("login-error").textContent = "";
  $("who").textContent = token() ? "logged in with a token" : "logged in by client certificate";
}

function setStatus(text) {
  $("status").textContent = text || "";
}

function setActionError(text) {
  $("action-error").textContent = text || "";
}

function nodeRows(holders) {
  const nodes = new Map();
  for (const h of holders) {
    if (!nodes.has(h.instance)) nodes.set(h.instance, { instance: h.instance, address: h.address, workers: [], tokens: [], sessions: new Set(), states: new Set(), ttl: 0 });
    const n = nodes.get(h.instance);
    if (h.kind === "worker") n.workers.push(holderParts(h)[1]);
    else if (h.kind === "format_token") n.tokens.push(h.space + "/" + h.rendered);
    else n.tokens.push(holderParts(h)[1]);
    if (h.session) n.sessions.add(h.session);
    n.states.add(h.state);
    n.ttl = Math.max(n.ttl, h.session_ttl_ms);
  }
  const rows = [];
  for (const n of nodes.values()) {
    const actions = document.createElement("span");
    for (const s of n.sessions) {
      const b = el("button", "Renew session", "renew");
      b.type = "button";
      b.addEventListener("click", () => renew(s));
      actions.appendChild(b);
    }
    const tr = row([n.instance, n.address, n.workers.join(", "), n.tokens.join(", "), [...n.sessions].join(", "), stateCell([...n.states].join(", ")), seconds(n.ttl), actions]);
    tr.dataset.instance = n.instance;
    tr.classList.add("node");
    rows.push(tr);
  }
  return rows;
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

async function loadHolders() {
  const r = await api("holders");
  if (!r.ok) return r;
  $("backend").textContent = r.data.backend;
  fill("nodes", nodeRows(r.data.holders));
  fill("holders", holderRows(r.data.holders, r.data.backend));
  return r;
}

function note(id, r) {
  $(id).textContent = r.ok ? "" : r.error.message;
}

async function loadTags() {
  const r = await api("tags");
  note("tags-note", r);
  fill("tags", r.ok ? r.data.tags.map((t) => row([t.tag, t.max_id, t.step, t.description, t.updated])) : []);
  if (r.ok && r.data.unreadable.length) $("tags-note").textContent = r.data.unreadable.length + " record(s) unreadable: " + r.data.unreadable.map((u) => u.key + ": " + u.error).join("; ");
}

async function loadFormats() {
  const r = await api("formats");
  note("formats-note", r);
  if (r.ok && !r.data.enabled) $("formats-note").textContent = "formatted mode is not configured on this node ([[formats]] in its config)";
  const rows = r.ok
    ? r.data.formats.map((f) => {
        const d = f.definition;
        const text = d.template || (d.preset ? "preset " + d.preset : "Lua rule");
        return row([f.name, f.kind, el("code", text), f.scope, f.zone, f.reset, f.counter.min + ".." + f.counter.max + " step " + f.counter.step]);
      })
    : [];
  fill("formats", rows);
}

async function loadStrict() {
  const r = await api("strict");
  note("strict-note", r);
  if (r.ok) $("strict-note").textContent = "default step " + r.data.default_step + "; namespaces with a stored step:";
  fill("strict", r.ok ? r.data.namespaces.map((n) => row([n.namespace, n.step])) : []);
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

async function load() {
  setActionError("");
  const r = await loadHolders();
  if (!r.ok) {
    if (r.status === 401 || r.status === 403) {
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin(r.error.message);
    } else {
      showConsole();
      setActionError(r.error.message);
    }
    return false;
  }
  showConsole();
  await Promise.all([loadTags(), loadFormats(), loadStrict(), loadLayout()]);
  return true;
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
  if (r.ok) {
    setStatus(r.data.message);
  } else {
    setStatus("");
    setActionError("Release failed (" + r.error.code + "): " + r.error.message);
  }
  await load();
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
  $("refresh").addEventListener("click", () => load());
  $("confirm").addEventListener("close", () => {
    const h = pending;
    pending = null;
    if (h && $("confirm").returnValue === "ok") release(h);
  });
  if (token() !== null) load();
});
