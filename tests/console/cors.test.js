// A page on another origin calls a node's JSON API from Debian's headless
// Chromium (playwright-core, /usr/bin/chromium). Run by tests/cors.rs,
// which starts two nodes and passes:
//   IDGEN_OPEN    http://127.0.0.1:PORT of a node whose
//                 server.http.cors_allow_origins lists IDGEN_PAGE_ORIGIN
//   IDGEN_CLOSED  http://127.0.0.1:PORT of a node with CORS off
//   IDGEN_PAGE_PORT  the port this script serves its page on (the origin
//                 http://127.0.0.1:PAGE_PORT)
// The page fetches /v1/ids from both, once plainly and once with a header
// that makes the browser send a preflight. It prints one JSON line,
// "result: {...}", with what each fetch gave; tests/cors.rs judges it.
"use strict";

const fs = require("fs");
const http = require("http");
const os = require("os");
const path = require("path");
const { chromium } = require("playwright-core");

function env(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
}

// In the page: every fetch, its status and body, or the browser's error.
async function fetchAll(urls) {
  const out = {};
  for (const [name, url, headers] of urls) {
    try {
      const r = await fetch(url, { headers });
      out[name] = { status: r.status, body: await r.text() };
    } catch (e) {
      out[name] = { error: String(e) };
    }
  }
  return out;
}

(async () => {
  const open = env("IDGEN_OPEN");
  const closed = env("IDGEN_CLOSED");
  const port = Number(env("IDGEN_PAGE_PORT"));
  const server = http.createServer((_, res) => {
    res.writeHead(200, { "content-type": "text/html" });
    res.end("<!doctype html><title>other origin</title><p>page</p>");
  });
  await new Promise((ok) => server.listen(port, "127.0.0.1", ok));
  const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), "idgen-chromium-"));
  let context;
  let code = 0;
  try {
    context = await chromium.launchPersistentContext(userDataDir, {
      executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
      headless: true,
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    });
    const page = context.pages()[0] || (await context.newPage());
    await page.goto(`http://127.0.0.1:${port}/`);
    const preflighted = { "X-Request-Id": "cors-test" };
    const result = await page.evaluate(fetchAll, [
      ["open", `${open}/v1/ids?count=3`, {}],
      ["open_preflight", `${open}/v1/ids?count=2`, preflighted],
      ["closed", `${closed}/v1/ids?count=3`, {}],
      ["closed_preflight", `${closed}/v1/ids?count=2`, preflighted],
    ]);
    console.log(`result: ${JSON.stringify(result)}`);
  } catch (e) {
    console.error(`cors script failed: ${e.stack || e}`);
    code = 1;
  } finally {
    if (context) await context.close();
    server.close();
    fs.rmSync(userDataDir, { recursive: true, force: true });
  }
  process.exit(code);
})();
