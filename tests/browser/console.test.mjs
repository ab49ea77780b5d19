// The console in a real browser (Debian's Chromium through playwright-core), against the local
// stack, with a worker process whose bug is "fixed" by a flag file (examples/incident_worker.rs):
// the overview shows the queues' real depths; a DLQ group and a message open; a group replayed
// after the fix leaves the DLQ and its jobs succeed; a forced breaker changes phase; a hostile
// body is shown as text. Run by tests/browser/run.sh, which builds the binaries.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, writeFileSync, readFileSync, existsSync, mkdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";
import { createServer } from "node:http";
import { chromium } from "playwright-core";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const TARGET = process.env.CARGO_TARGET_DIR || join(ROOT, "target");
const TRIAGE = join(TARGET, "debug", "triage");
const WORKER = join(TARGET, "debug", "examples", "incident_worker");
const SHOTS = process.env.CONSOLE_SCREENSHOTS || join(ROOT, "docs", "img");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";

const work = mkdtempSync(join(tmpdir(), "console-browser-"));
const fixedFile = join(work, "fixed");
const doneFile = join(work, "done");
const name = `console-browser-${process.pid}-${Date.now() % 1e9}`;
const children = [];
let env, base, browser, page;
const dialogs = [];

function triage(args, input) {
  return execFileSync(TRIAGE, args, { env, input, encoding: "utf8", stdio: ["pipe", "pipe", "inherit"] });
}

function done(type) {
  if (!existsSync(doneFile)) return 0;
  return readFileSync(doneFile, "utf8").split("\n").filter((l) => l.startsWith(type + " ")).length;
}

async function until(what, check, ms = 60000) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

async function overview() {
  const r = await fetch(`${base}/api/overview`);
  assert.equal(r.status, 200);
  return r.json();
}

before(async () => {
  env = { ...process.env, TRIAGE_TABLE: name };
  delete env.TRIAGE_CONSOLE_TOKEN;
  const setup = JSON.parse(triage(["--json", "setup", "--queue", name, "--dlq", `${name}-dlq`]));
  Object.assign(env, {
    TRIAGE_QUEUE_URL: setup.queue_url,
    TRIAGE_DLQ_URL: setup.dlq_url,
    INCIDENT_FIXED_FILE: fixedFile,
    INCIDENT_DONE_FILE: doneFile,
    RUST_LOG: "warn",
  });
  const worker = spawn(WORKER, [], { env, stdio: ["ignore", "ignore", "inherit"] });
  children.push(worker);
  const jobs = [];
  for (let i = 0; i < 6; i++) jobs.push({ type: "email.send", id: `mail-${i}`, payload: { to: `u${i}@example.com` } });
  for (let i = 0; i < 4; i++) jobs.push({ type: "billing.charge", id: `charge-${i}`, payload: { order: `o-${i}`, cents: 100 + i } });
  // No handler for this type: dead-lettered as `invalid`, with a body built to run if it were HTML.
  jobs.push({
    type: "hostile.job",
    id: "hostile-1",
    payload: { html: "<script>window.__pwned = 1; alert(1)</script><img src=x onerror=\"window.__pwned = 2\">" },
  });
  triage(["--json", "send", "--file", "-"], jobs.map((j) => JSON.stringify(j)).join("\n") + "\n");

  const console_ = spawn(TRIAGE, ["console", "--port", "0"], { env, stdio: ["ignore", "pipe", "inherit"] });
  children.push(console_);
  const line = await new Promise((resolve, reject) => {
    createInterface({ input: console_.stdout }).once("line", resolve);
    console_.once("exit", (c) => reject(new Error(`triage console exited with ${c}`)));
  });
  base = line.replace(/^triage console: /, "").replace(/\/$/, "");
  await until("the failed jobs in the DLQ and the mails sent", async () => {
    const o = await overview();
    return o.dlq.visible === 5 && o.source.visible + o.source.in_flight === 0 && done("email.send") === 6;
  });

  browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox"] });
  page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
  page.on("dialog", (d) => {
    dialogs.push(d.message());
    d.dismiss().catch(() => {});
  });
  mkdirSync(SHOTS, { recursive: true });
});

after(async () => {
  if (browser) await browser.close();
  for (const c of children) c.kill("SIGTERM");
  rmSync(work, { recursive: true, force: true });
});

test("the overview shows the queues' real depths", async () => {
  await page.goto(`${base}/`);
  assert.equal(await page.textContent("#dlq-visible"), "5");
  assert.equal(await page.textContent("#source-visible"), "0");
  assert.match(await page.textContent("#oldest-note"), /SQS does not tell it/);
  assert.equal(await page.locator("#arrivals-chart rect").count() > 0, true);
  await page.screenshot({ path: join(SHOTS, "console-overview.png"), fullPage: true });
});

test("a DLQ group opens to its messages, and a message to its record and body", async () => {
  await page.goto(`${base}/dlq`);
  await page.locator("#groups tr", { hasText: "billing.charge" }).locator("a.open-group").click();
  assert.equal(await page.textContent("#group-count"), "4 message(s).");
  assert.match(await page.textContent("#group-error"), /card token is None/);
  await page.screenshot({ path: join(SHOTS, "console-dlq-group.png"), fullPage: true });
  await page.locator("a.message-link").first().click();
  assert.match(await page.textContent("#message-body"), /"type": "billing.charge"/);
  assert.match(await page.textContent("#failure-record"), /"class": "fatal"/);
});

test("a hostile body is shown as text and runs nothing", async () => {
  await page.goto(`${base}/dlq?type=hostile.job`);
  await page.locator("a.open-group").first().click();
  await page.locator("a.message-link").first().click();
  const body = await page.textContent("#message-body");
  assert.match(body, /<script>window.__pwned = 1; alert\(1\)<\/script>/);
  assert.equal(await page.evaluate(() => window.__pwned), undefined);
  assert.equal(await page.locator("main script, main img, #message-body *").count(), 0);
  // The edit form holds it as text too.
  assert.match(await page.inputValue("textarea[name=body]"), /<script>/);
  assert.deepEqual(dialogs, []);
});

test("after the fix, replaying the group empties it from the DLQ and its jobs succeed", async () => {
  writeFileSync(fixedFile, "fixed\n");
  await page.goto(`${base}/dlq`);
  await page.locator("#groups tr", { hasText: "billing.charge" }).getByText("replay…").click();
  assert.match(await page.textContent("#plan"), /Replay 4 message\(s\)/);
  assert.equal((await overview()).dlq.visible, 5, "the confirmation page moved something");
  await page.fill("input[name=rate]", "20");
  await page.click("#confirm");
  assert.match(await page.textContent("#result"), /Replayed 4 of the 4 confirmed/);
  assert.match(await page.textContent("#audited"), /Recorded in the audit trail/);
  await page.goto(`${base}/`);
  // The live refresh shows the DLQ falling to the hostile message alone.
  await page.waitForFunction(() => document.querySelector("#dlq-visible").textContent === "1", null, { timeout: 30000 });
  await until("the replayed charges to succeed", async () => done("billing.charge") === 4);
  await until("the source queue to drain", async () => {
    const o = await overview();
    return o.source.visible + o.source.in_flight === 0;
  });
});

test("forcing a breaker changes its phase", async () => {
  await page.goto(`${base}/`);
  await page.fill("form.inline input[name=type]", "billing.charge");
  await page.selectOption("form.inline select[name=action]", "open");
  await page.click("form.inline button");
  assert.match(await page.textContent("#plan"), /Nothing changes until you confirm/);
  await page.click("#confirm");
  assert.match(await page.textContent("#result"), /is now open/);
  await page.goto(`${base}/`);
  const phase = page.locator('[data-breaker="billing.charge"][data-part="phase"]');
  assert.equal(await phase.textContent(), "open");
  await page.locator("#breakers tr", { hasText: "billing.charge" }).getByText("reset…").click();
  await page.click("#confirm");
  assert.match(await page.textContent("#result"), /is now closed/);
  assert.deepEqual(dialogs, []);
});

test("the live refresh shows a new dead letter without a reload", async () => {
  // A breaker open until a date JavaScript cannot print must not stop the refresh.
  triage(["--json", "breaker", "open", "far.future", "--for", "300000y", "--yes"]);
  await page.goto(`${base}/`);
  assert.equal(await page.locator('[data-breaker="far.future"][data-part="phase"]').textContent(), "open");
  const before = Number(await page.textContent("#dlq-visible"));
  // Gone if the page were loaded again.
  await page.evaluate(() => { window.__sameLoad = true; });
  // No handler for this type: the worker dead-letters it as `invalid`.
  triage(["--json", "send", "--type", "no.such.handler", "--payload", "{}"]);
  await page.waitForFunction(
    (n) => document.querySelector("#dlq-visible").textContent === String(n),
    before + 1,
    { timeout: 30000 },
  );
  assert.equal(await page.evaluate(() => window.__sameLoad), true, "the page was reloaded");
  assert.equal(await page.getAttribute("body", "data-stale"), null, "the refresh failed");
});

test("with a token, the cookie never reaches another server on this host", async () => {
  // Another web server on this host, as an operator may run one: it records every Cookie header.
  const seen = [];
  const other = createServer((req, res) => {
    if (req.url !== "/favicon.ico") seen.push(req.headers.cookie || "");
    res.end("<!doctype html><p>another server</p>");
  });
  await new Promise((r) => other.listen(0, "127.0.0.1", r));
  const otherBase = `http://127.0.0.1:${other.address().port}`;
  const tokened = spawn(TRIAGE, ["console", "--port", "0", "--bind", "127.0.0.1"], { env, stdio: ["ignore", "pipe", "inherit"] });
  children.push(tokened);
  const printed = await new Promise((resolve, reject) => {
    createInterface({ input: tokened.stdout }).once("line", resolve);
    tokened.once("exit", (c) => reject(new Error(`triage console exited with ${c}`)));
  });
  const url = printed.replace(/^triage console: /, "");
  const token = url.split("?token=")[1];
  const p = await browser.newPage();
  try {
    await p.goto(url);
    assert.equal(new URL(p.url()).search, "", "the token left the address bar");
    assert.match(await p.textContent("#dlq-visible"), /^\d+$/);
    // The live refresh works under the console's path.
    const at = await p.textContent("#refreshed");
    await p.waitForFunction((t) => document.querySelector("#refreshed").textContent !== t, at, { timeout: 30000 });
    assert.equal(await p.getAttribute("body", "data-stale"), null, "the refresh failed");
    await p.click("nav a[href$='/dlq']");
    assert.match(await p.textContent("h1"), /Dead-letter queue/);
    assert.match(new URL(p.url()).pathname, /^\/s\/[0-9a-f]{32}\/dlq$/);
    const secret = new URL(p.url()).pathname.replace(/\/dlq$/, "");
    for (const path of ["/", "/dlq", "/index.html", "/s/"]) await p.goto(otherBase + path);
    assert.equal(seen.length, 4);
    for (const c of seen) assert.ok(!c.includes(token), `another server got the token: ${c}`);
    // Cookies do cross ports: at the console's secret path another server would get it.
    await p.goto(otherBase + secret + "/dlq");
    assert.ok(seen[4].includes(token), `the browser did not send the cookie across ports: ${seen[4]}`);
  } finally {
    await p.close();
    other.close();
  }
});
