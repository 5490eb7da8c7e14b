// Drives idgen's admin console in Debian's headless Chromium through
// playwright-core (no browser download: /usr/bin/chromium). Run by
// tests/console.rs, which starts three Consul-mode nodes and passes:
//   IDGEN_CONSOLE_URL  the console of one node (http://127.0.0.1:PORT/admin/)
//   IDGEN_TOKEN        its admin token
//   IDGEN_NODES        the instance names, comma-separated
//   IDGEN_KILL         "<instance>:<pid>": the node to SIGKILL mid-test
//   IDGEN_RENEW        an instance whose session to renew by hand
//   IDGEN_HIDE_KEY     a hide key that exists (for a hidden tag)
//   IDGEN_HIDDEN_NODE  the node whose lease zone is hidden with that key
//   CHROMIUM           the browser (default /usr/bin/chromium)
// Then it walks the console's changes: every node's status row (and the
// killed node's going silent), the node's own state, the released filter,
// a tag created, edited and deleted, a hidden tag created (and one with a
// missing key refused), a Lua format created and its
// code shown, a strict step set (and a refused one), and auto-refresh
// showing a counter moved by an ID issued meanwhile (its period named as
// its IDs render it), a scoped format's counters, a namespace with keys
// and no stored step, the hide keys panel (create, rotate, retire with
// their confirmations, a refusal shown), a restarted node's row showing
// only its new worker id, the nodes table fitting 1280 px, and the
// datacenters panel (a release confirmed and refused in the node's words).
// Exit code 0 only if every step was seen in the page.
"use strict";

const fs = require("fs");
const os = require("os");
const path = require("path");
const { chromium } = require("playwright-core");

function env(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
}

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
  console.log(`ok: ${what}`);
}

const STEP_MS = 20000;

async function holderRow(page, instance, kind) {
  return page.locator(`#holders tr.holder[data-instance="${instance}"][data-kind="${kind}"]`);
}

// The cells of a table row, as text.
async function cells(locator) {
  return locator.locator("td").allTextContents();
}

async function waitCell(page, selector, index, want, what, timeout) {
  const deadline = Date.now() + (timeout || STEP_MS);
  let last = null;
  while (Date.now() < deadline) {
    const row = page.locator(selector);
    if ((await row.count()) === 1) {
      last = (await cells(row))[index];
      if (want instanceof RegExp ? want.test(last) : last === want) {
        check(true, what);
        return;
      }
    }
    await page.waitForTimeout(200);
  }
  throw new Error(`check failed: ${what} (last seen ${JSON.stringify(last)})`);
}

async function confirmAsk(page) {
  await page.locator("#ask").waitFor({ state: "visible", timeout: STEP_MS });
  await page.click("#ask-ok");
  await page.locator("#ask").waitFor({ state: "hidden", timeout: STEP_MS });
}

// This node's own state; the filter for released holder rows.
async function thisNodeAndFilters(page, victim) {
  await page.locator('#node tr[data-field="ready"]').waitFor({ timeout: STEP_MS });
  check((await cells(page.locator('#node tr[data-field="ready"]')))[1] === "yes", "this node is ready");
  check((await cells(page.locator('#node tr[data-field="fenced"]')))[1] === "no", "this node is not fenced");
  check(/\d/.test((await page.locator("#node").textContent()) || ""), "this node's version and layout are shown");
  const released = page.locator(`#holders tr.holder[data-instance="${victim}"][data-kind="worker"]`);
  await page.selectOption("#holder-filter", "held");
  check(await released.isHidden(), "the filter hides released rows");
  check(await page.locator('#holders tr.holder[data-state="alive"]').first().isVisible(), "held rows stay shown");
  await page.selectOption("#holder-filter", "released");
  check(await released.isVisible(), "the filter shows only released rows");
  check(await page.locator('#holders tr.holder[data-state="alive"]').first().isHidden(), "held rows hidden");
  await page.selectOption("#holder-filter", "all");
}

// Index of a nodes-table column (see index.html).
const NODE_COL = { report: 2, ready: 3, fenced: 4, version: 5, layout: 6, number: 7, issued: 8, rate: 9, consul: 10, hides: 11, workers: 12, holderState: 15 };

// Every node has a status row: reporting, ready, not fenced, its version,
// layout and Consul's check passing.
async function nodeStatusRows(page, nodes) {
  for (const n of nodes) {
    const sel = `#nodes tr.node[data-instance="${n}"]`;
    await waitCell(page, sel, NODE_COL.report, /^reported \d+ s ago$/, `node ${n} reports its status`);
    const c = await cells(page.locator(sel));
    check(c[NODE_COL.ready] === "yes" && c[NODE_COL.fenced] === "no", `node ${n} is ready and not fenced`);
    check(/^\d+\.\d+\.\d+/.test(c[NODE_COL.version]) && /^\d+\/\d+\/\d+\/\d+, unit/.test(c[NODE_COL.layout]), `node ${n} shows its version and layout bits`);
    check(/^\d+$/.test(c[NODE_COL.number]) && /^\d+$/.test(c[NODE_COL.issued]), `node ${n} shows its node number and IDs issued`);
    check(/IDs\/s|next report/.test(c[NODE_COL.rate]), `node ${n} shows its issue rate`);
    await refreshUntil(page, sel, (c) => /^passing/.test(c[NODE_COL.consul] || ""), `node ${n}'s Consul check passes`);
    const hides = (await cells(page.locator(sel)))[NODE_COL.hides];
    if (n === env("IDGEN_HIDDEN_NODE")) {
      check(/^console-key: lease zone \d+ \(4 version bits\)$/.test(hides), `node ${n} shows the key its lease zone is hidden with (${hides})`);
    } else {
      check(hides === "", `node ${n} hides nothing (${hides})`);
    }
  }
}

// The page at 1280x800 has no horizontal scroll bar, and the nodes table
// fits its card (scrollWidth within clientWidth, measured by Chromium).
async function fitsAt1280(page) {
  const m = await page.evaluate(() => {
    const box = document.getElementById("nodes").parentElement;
    const doc = document.documentElement;
    return { page: [doc.scrollWidth, doc.clientWidth], card: [box.scrollWidth, box.clientWidth] };
  });
  check(m.page[0] <= m.page[1] && m.card[0] <= m.card[1], `at 1280x800 the page and the nodes table fit (page ${m.page}, card ${m.card})`);
}

// The hide keys panel: the existing key with what uses it; a key created,
// rotated (cancel first: nothing changes), retired only once its id is
// typed; a refused create shows the service's reason.
async function hideKeysPanel(page, existing) {
  const rowOf = (id) => `#hide-keys tr.hide-key[data-key="${id}"]`;
  await waitCell(page, rowOf(existing), 1, "0", `hide key ${existing} is listed, version 0 active`);
  const used = (await cells(page.locator(rowOf(existing))))[3];
  check(/tag hidden-tag/.test(used) && /n1: lease zone 1/.test(used), `it names what uses it (${used})`);
  await page.fill("#hide-key-id", "console-new");
  await page.click("#hide-key-submit");
  await waitCell(page, rowOf("console-new"), 2, /^0 active \(/, "a hide key created from the form");
  const rotate = page.locator(`${rowOf("console-new")} button.rotate-key`);
  await rotate.click();
  const dialog = page.locator("#key-confirm");
  await dialog.waitFor({ state: "visible", timeout: STEP_MS });
  check(/Version 1 becomes active/.test(await dialog.textContent()), "the rotation names the next version");
  await page.click("#key-confirm-cancel");
  await dialog.waitFor({ state: "hidden", timeout: STEP_MS });
  check((await cells(page.locator(rowOf("console-new"))))[1] === "0", "cancel rotates nothing");
  await rotate.click();
  await dialog.waitFor({ state: "visible", timeout: STEP_MS });
  await page.click("#key-confirm-ok");
  await waitCell(page, rowOf("console-new"), 2, /^0 retired .*, 1 active /, "rotated: version 1 active, 0 decode-only");
  await page.locator(`${rowOf("console-new")} button.retire-key`).click();
  await dialog.waitFor({ state: "visible", timeout: STEP_MS });
  check(await page.locator("#key-confirm-ok").isDisabled(), "retiring needs the key id typed");
  await page.fill("#key-confirm-typed", "console-ne");
  check(await page.locator("#key-confirm-ok").isDisabled(), "a wrong id keeps it refused");
  await page.fill("#key-confirm-typed", "console-new");
  check(await page.locator("#key-confirm-ok").isEnabled(), "the typed id enables it");
  await page.click("#key-confirm-ok");
  await waitCell(page, rowOf("console-new"), 1, /^none/, "retired: no active version");
  await page.fill("#hide-key-id", "console-new");
  await page.click("#hide-key-submit");
  await page.locator("#action-error").filter({ hasText: "already exists" }).waitFor({ timeout: STEP_MS });
  check(true, "creating it again is refused, the service's reason shown");
  await page.fill("#hide-key-id", "");
  await page.locator("#hide-key-id").blur();
  await page.evaluate(() => delete document.getElementById("hide-key-form").dataset.dirty);
  await page.click("#refresh");
}

// Refreshes the page (at most 100 times, 200 ms apart) until the row's
// cells satisfy `want`.
async function refreshUntil(page, sel, want, what) {
  let last = null;
  for (let i = 0; i < 100; i += 1) {
    const c = await cells(page.locator(sel));
    last = c;
    if (want(c)) {
      check(true, what);
      return c;
    }
    await page.click("#refresh");
    await page.waitForTimeout(200);
  }
  throw new Error(`check failed: ${what} (last ${JSON.stringify(last)})`);
}

// After a SIGKILL: refreshing (bounded) until the node's row shows its
// Consul check failing or its status silent.
async function deadNodeRow(page, victim) {
  const sel = `#nodes tr.node[data-instance="${victim}"]`;
  const dead = (c) => /^(critical|not registered)/.test(c[NODE_COL.consul] || "") || /^not reporting/.test(c[NODE_COL.report] || "");
  const c = await refreshUntil(page, sel, dead, `killed ${victim}: its row shows its Consul check failing or its status silent`);
  console.log(`   (${c[NODE_COL.consul]} / ${c[NODE_COL.report]})`);
}

// A hidden tag from the form; a missing key is refused with the
// service's own words.
async function hiddenTag(page, key) {
  const row = '#tags tr.tag[data-tag="hidden-tag"]';
  await page.fill("#tag-name", "hidden-tag");
  await page.fill("#tag-hide-key", key);
  await page.click("#tag-submit");
  await waitCell(page, row, 4, `hidden (key ${key})`, "a hidden tag is created from the form");
  await page.fill("#tag-name", "hidden-bad");
  await page.fill("#tag-hide-key", "no-such-key");
  await page.click("#tag-submit");
  await page.locator("#action-error").filter({ hasText: "no-such-key" }).waitFor({ timeout: STEP_MS });
  check(/does not exist/.test(await page.locator("#action-error").textContent()), "a missing hide key is refused, the service's reason shown");
  check((await page.locator('#tags tr.tag[data-tag="hidden-bad"]').count()) === 0, "no tag was created with it");
  await page.click("#tag-cancel");
}

// Create a tag, edit its step, delete it.
async function tagActions(page) {
  const tagRow = '#tags tr.tag[data-tag="console-tag"]';
  await page.fill("#tag-name", "console-tag");
  await page.fill("#tag-step", "20");
  await page.fill("#tag-description", "made in the console");
  await page.click("#tag-submit");
  await waitCell(page, tagRow, 3, "20", "a tag created with step 20");
  await page.locator(`${tagRow} button.edit-tag`).click();
  check((await page.inputValue("#tag-name")) === "console-tag", "the edit form holds the tag");
  await page.fill("#tag-step", "50");
  await page.click("#tag-submit");
  await waitCell(page, tagRow, 3, "50", "its step edited to 50");
  await page.locator(`${tagRow} button.delete-tag`).click();
  await confirmAsk(page);
  await page.locator(tagRow).waitFor({ state: "detached", timeout: STEP_MS });
  await page.locator("#status").filter({ hasText: "tombstone" }).waitFor({ timeout: STEP_MS });
  check(true, "the tag is deleted, the service's note shown");
}

const LUA = "function min_counter() return 1 end\nfunction max_counter() return 99 end\nfunction reset_seconds() return 0 end\nfunction create_id(counter, now, salt) return string.format(\"W%02d\", counter) end\n";

// Create a format with a Lua rule and see its code.
async function formatActions(page) {
  await page.fill("#format-name", "clua");
  await page.fill("#format-definition", "{}");
  await page.fill("#format-lua", LUA);
  await page.click("#format-submit");
  // A debug build on a loaded machine may take long to check a rule.
  const row = page.locator('#formats tr.format[data-format="clua"]');
  await row.waitFor({ timeout: 240000 });
  check((await cells(row))[1] === "lua", "a format with a Lua rule is created");
  await row.locator("button.show-code").click();
  check((await page.locator("#format-code").textContent()) === LUA, "its Lua code is shown, read-only");
  check((await page.locator("#action-error").textContent()) === "", "no action error");
}

// Set a strict step; a refused one shows the service's reason.
async function strictActions(page) {
  await page.fill("#strict-namespace", "console-ns");
  await page.fill("#strict-step", "7");
  await page.click("#strict-submit");
  await waitCell(page, '#strict tr.namespace[data-namespace="console-ns"]', 1, "7", "a strict step set to 7");
  await page.fill("#strict-namespace", "console-ns");
  await page.fill("#strict-step", "0");
  await page.click("#strict-submit");
  await page.locator("#action-error").filter({ hasText: "INVALID_ARGUMENT" }).waitFor({ timeout: STEP_MS });
  check(/step/.test(await page.locator("#action-error").textContent()), "a refused step shows the service's reason");
  await page.click("#refresh"); // clears the error; the form keeps its text
  await page.fill("#strict-namespace", "");
  await page.fill("#strict-step", "");
  await page.locator("#strict-namespace").blur();
  await page.evaluate(() => delete document.getElementById("strict-form").dataset.dirty);
  await page.locator('#strict tr.namespace[data-namespace="invoices"] button.list-keys').click();
  await page.locator("#keys-note").filter({ hasText: "invoices" }).waitFor({ timeout: STEP_MS });
  check(true, "a namespace's keys are listed");
}

// Auto-refresh: waits while a form is edited, then shows a counter that
// moved after an ID was issued, with no click.
async function autoRefresh(page, url) {
  const row = '#formats tr.format[data-format="orders"]';
  await waitCell(page, row, 7, "unused", "the orders counter is unused before");
  await page.selectOption("#refresh-interval", "2");
  await page.check("#auto-refresh");
  await page.locator("#tag-name").focus();
  await page.locator("#refresh-state").filter({ hasText: "paused while you edit" }).waitFor({ timeout: STEP_MS });
  check(true, "auto-refresh waits while a form is edited");
  await page.locator("#tag-name").blur();
  const issued = await fetch(new URL("/v1/formatted/orders?count=3", url));
  check(issued.ok, "three orders IDs issued");
  const ids = (await issued.json()).ids;
  const day = `${ids[0].slice(0, 4)}-${ids[0].slice(4, 6)}-${ids[0].slice(6, 8)}`;
  await waitCell(page, row, 7, new RegExp(`^last \\d+ \\(period ${day}\\)$`), `auto-refresh shows the orders counter moved, its period named ${day}`);
  const title = await page.locator(`${row} td`).nth(7).locator("span").getAttribute("title");
  check(/^stored period key \d+ /.test(title || ""), `the raw period key on hover (${title})`);
  check(/^last /.test(await page.locator("#refresh-state").textContent()), "refreshed in place");
  await waitCell(page, '#node tr[data-field="rate"]', 1, /IDs\/s/, "this node's issue rate is shown");
  const shops = '#formats tr.format[data-format="shops"]';
  for (const shop of ["001", "002"]) {
    check((await fetch(new URL(`/v1/formatted/shops?count=1&param.shop=${shop}`, url))).ok, `a shops ID for shop ${shop}`);
  }
  await waitCell(page, shops, 7, "per scope (shop): 2 counters", "a scoped format shows its counters, not an error");
  await page.uncheck("#auto-refresh");
}

// The Datacenters panel on a one-datacenter cluster: the one claim,
// owned by dc1, with a note saying so; its release asks first, explains
// force before offering it (off by default), and a release while the
// owner's nodes run is refused in the node's own words, changing nothing.
async function datacentersPanel(page) {
  const row = "#datacenters tr.datacenter";
  await page.locator(row).first().waitFor({ timeout: STEP_MS });
  check((await page.locator(row).count()) === 1, "one datacenter id claimed");
  const c = await cells(page.locator(row));
  check(c[1] === "owned" && c[2] === "dc1" && c[3] === "test" && /Z$/.test(c[5]), `its claim: owned by dc1 (${c})`);
  const note = await page.locator("#datacenters-note").textContent();
  check(/primary Consul datacenter dc1\./.test(note) && /one Consul datacenter/.test(note), `the note names the primary and says every id is its own (${note})`);
  const id = await page.locator(row).getAttribute("data-id");
  const dialog = page.locator("#dc-confirm");
  await page.locator(`${row} button.release-datacenter`).click();
  await dialog.waitFor({ state: "visible", timeout: STEP_MS });
  check((await page.locator("#dc-confirm-title").textContent()) === `Release datacenter id ${id} of Consul datacenter dc1?`, "the confirmation names the id and its owner");
  check(/destroys every session of dc1/.test(await page.locator("#dc-confirm-force-text").textContent()), "force is explained");
  check(!(await page.locator("#dc-confirm-force").isChecked()), "force is off unless ticked");
  await page.click("#dc-confirm-cancel");
  await dialog.waitFor({ state: "hidden", timeout: STEP_MS });
  check((await page.locator("#status").textContent()).indexOf("Releasing datacenter") < 0, "cancel releases nothing");
  await page.locator(`${row} button.release-datacenter`).click();
  await dialog.waitFor({ state: "visible", timeout: STEP_MS });
  await page.click("#dc-confirm-ok");
  await page.locator("#action-error").filter({ hasText: "FAILED_PRECONDITION" }).waitFor({ timeout: STEP_MS });
  const refusal = await page.locator("#action-error").textContent();
  check(refusal.includes(`datacenter id ${id} is owned by Consul datacenter "dc1", which still has passing node`), `the refusal in the node's words (${refusal})`);
  check((await page.locator(row).getAttribute("data-state")) === "owned", "the claim stays owned");
  await page.click("#refresh");
}

async function run(page) {
  const url = env("IDGEN_CONSOLE_URL");
  const token = env("IDGEN_TOKEN");
  const nodes = env("IDGEN_NODES").split(",");
  const [victim, pid] = env("IDGEN_KILL").split(":");
  const renewed = env("IDGEN_RENEW");

  const response = await page.goto(url);
  check(response.status() === 200, "the console page loads");
  const csp = response.headers()["content-security-policy"] || "";
  check(csp.includes("script-src 'self'") && csp.includes("frame-ancestors 'none'"), "the page carries a strict CSP");

  // A wrong token: refused, with the server's reason shown.
  await page.fill("#token", "not-the-token");
  await page.click("#login-button");
  await page.locator("#login-error").filter({ hasText: "wrong" }).waitFor({ timeout: STEP_MS });
  check(await page.locator("#console").isHidden(), "a wrong token shows an error and no console");
  check((await page.evaluate(() => sessionStorage.getItem("idgen-admin-token"))) === null, "a refused token is not kept");

  // The right token: the three nodes, each with its one worker id (n1
  // was restarted: its old session still holds its old one).
  await page.fill("#token", token);
  await page.click("#login-button");
  await page.locator("#nodes tr.node").nth(nodes.length - 1).waitFor({ timeout: STEP_MS });
  check((await page.locator("#nodes tr.node").count()) === nodes.length, `${nodes.length} nodes listed`);
  for (const n of nodes) {
    const cells = await page.locator(`#nodes tr.node[data-instance="${n}"] td`).allTextContents();
    const worker = cells[NODE_COL.workers];
    check(/^\d+\/\d+$/.test(worker) && cells[NODE_COL.holderState] === "alive", `node ${n} shows one worker id ${worker}, session alive`);
  }
  await nodeStatusRows(page, nodes);
  await fitsAt1280(page);
  check((await page.locator("#backend").textContent()) === "consul", "backend consul");
  check(!page.url().includes(token), "the token is not in the URL");
  check((await page.context().cookies()).length === 0, "no cookie is set");
  await page.locator("#layout tr").first().waitFor({ timeout: STEP_MS });
  check((await page.locator("#layout").textContent()).includes("generation"), "the layout is shown");
  check((await page.locator("#tags tbody tr").count()) >= 1, "segment tags are shown");
  check((await page.locator("#strict tbody tr").count()) >= 1, "strict namespaces are shown");
  await waitCell(page, '#strict tr.namespace[data-namespace="nostep"]', 1, "1 (default)", "a namespace with keys and no stored step is listed");
  await waitCell(page, '#formats tr.format[data-format="shops"]', 7, "per scope (shop): 0 counters", "a scoped format shows its counters, not an error");
  check((await page.locator("#formats").textContent()).includes("{yyyy}{MM}{dd}{seq:8}"), "the formats are shown");

  // Manual renewal of a live node's session.
  await page.locator(`#nodes tr.node[data-instance="${renewed}"] button.renew`).first().click();
  await page.locator("#status").filter({ hasText: "renewed session" }).waitFor({ timeout: STEP_MS });
  check(true, `renewed ${renewed}'s session by hand`);

  // SIGKILL one node: its session stays alive in Consul until its TTL.
  process.kill(Number(pid), "SIGKILL");
  await page.click("#refresh");
  const worker = await holderRow(page, victim, "worker");
  await worker.first().waitFor({ timeout: STEP_MS });
  check((await worker.getAttribute("data-state")) === "alive", `killed ${victim}: its worker id is still held (session alive)`);

  // Release it: the confirmation names the holder and the lock-delay;
  // cancelling changes nothing.
  await worker.locator("button.release").click();
  const dialog = page.locator("#confirm");
  await dialog.waitFor({ state: "visible", timeout: STEP_MS });
  const text = await dialog.textContent();
  check(text.includes(victim) && /Lock-delay: 2\.0 s/.test(text), "the confirmation shows the holder and the lock-delay");
  await page.click("#confirm-cancel");
  await dialog.waitFor({ state: "hidden", timeout: STEP_MS });
  check((await worker.getAttribute("data-state")) === "alive", "cancel releases nothing");

  await worker.locator("button.release").click();
  await dialog.waitFor({ state: "visible", timeout: STEP_MS });
  await page.click("#confirm-ok");
  await page.locator("#status").filter({ hasText: "destroyed session" }).waitFor({ timeout: STEP_MS });
  const freed = await holderRow(page, victim, "worker");
  await page.locator(`#holders tr.holder[data-instance="${victim}"][data-kind="worker"][data-state="released"]`).waitFor({ timeout: STEP_MS });
  check((await freed.locator("td").last().textContent()) === "free", `${victim}'s worker id is free`);
  check((await page.locator("#action-error").textContent()) === "", "no action error");

  await deadNodeRow(page, victim);
  await thisNodeAndFilters(page, victim);
  await tagActions(page);
  await hiddenTag(page, env("IDGEN_HIDE_KEY"));
  await hideKeysPanel(page, env("IDGEN_HIDE_KEY"));
  await formatActions(page);
  await strictActions(page);
  await autoRefresh(page, url);
  await datacentersPanel(page);

  // Log out: the token leaves sessionStorage.
  await page.click("#logout");
  check((await page.evaluate(() => sessionStorage.getItem("idgen-admin-token"))) === null, "log out forgets the token");
}

(async () => {
  const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), "idgen-chromium-"));
  let context;
  let failed = false;
  try {
    context = await chromium.launchPersistentContext(userDataDir, {
      executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
      headless: true,
      args: [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
      ],
    });
    const page = context.pages()[0] || (await context.newPage());
    await page.setViewportSize({ width: 1280, height: 800 });
    const problems = [];
    page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
    page.on("console", (m) => {
      if (m.type() === "error" && !/status of 4\d\d/.test(m.text())) problems.push(`console error: ${m.text()} (${m.location().url})`);
    });
    await run(page);
    check(problems.length === 0, `no script errors or CSP violations (${problems.join("; ")})`);
  } catch (e) {
    failed = true;
    console.error(`FAILED: ${e.stack || e}`);
  } finally {
    if (context) await context.close().catch(() => {});
    fs.rmSync(userDataDir, { recursive: true, force: true });
  }
  process.exit(failed ? 1 : 0);
})();
