// Drives idgen's admin console in Debian's headless Chromium through
// playwright-core (no browser download: /usr/bin/chromium). Run by
// tests/console.rs, which starts three Consul-mode nodes and passes:
//   IDGEN_CONSOLE_URL  the console of one node (http://127.0.0.1:PORT/admin/)
//   IDGEN_TOKEN        its admin token
//   IDGEN_NODES        the instance names, comma-separated
//   IDGEN_KILL         "<instance>:<pid>": the node to SIGKILL mid-test
//   IDGEN_RENEW        an instance whose session to renew by hand
//   CHROMIUM           the browser (default /usr/bin/chromium)
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

  // The right token: the three nodes, each with its worker id.
  await page.fill("#token", token);
  await page.click("#login-button");
  await page.locator("#nodes tr.node").nth(nodes.length - 1).waitFor({ timeout: STEP_MS });
  check((await page.locator("#nodes tr.node").count()) === nodes.length, `${nodes.length} nodes listed`);
  for (const n of nodes) {
    const cells = await page.locator(`#nodes tr.node[data-instance="${n}"] td`).allTextContents();
    check(/^\d+\/\d+$/.test(cells[2]) && cells[5] === "alive", `node ${n} shows worker id ${cells[2]}, session alive`);
  }
  check((await page.locator("#backend").textContent()) === "consul", "backend consul");
  check(!page.url().includes(token), "the token is not in the URL");
  check((await page.context().cookies()).length === 0, "no cookie is set");
  await page.locator("#layout tr").first().waitFor({ timeout: STEP_MS });
  check((await page.locator("#layout").textContent()).includes("generation"), "the layout is shown");
  check((await page.locator("#tags tbody tr").count()) >= 1, "segment tags are shown");
  check((await page.locator("#strict tbody tr").count()) >= 1, "strict namespaces are shown");
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
    const problems = [];
    page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
    page.on("console", (m) => {
      if (m.type() === "error" && !/status of 40[13]/.test(m.text())) problems.push(`console error: ${m.text()} (${m.location().url})`);
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
