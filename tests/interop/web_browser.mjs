// A real browser clicks through the web view: Debian's Chromium (no browser download)
// driven by playwright-core. An agent writes a page through the official TypeScript
// SDK first (a citation of raw/notes.md), then the browser signs in with the one-time
// URL of `alexandria web`, and follows links the way a person does:
// login → workspaces → workspace → wiki page → citation → raw file → search → history
// → diff → subscriptions (Ingest, Dismiss) → the captured file → sign out. DOM checks at every step; screenshots into SCREENSHOT_DIR.
//
// Usage: node web_browser.mjs ALEXANDRIA_BIN SCREENSHOT_DIR
// Env: ALEXANDRIA_HOME (a home with workspace `global` holding raw/notes.md);
//      CHROMIUM (default /usr/bin/chromium).

import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [bin, shots] = process.argv.slice(2);
if (!bin || !shots) {
  console.error("usage: node web_browser.mjs ALEXANDRIA_BIN SCREENSHOT_DIR");
  process.exit(2);
}
mkdirSync(shots, { recursive: true });

function fail(message) {
  console.error(`FAIL: ${message}`);
  process.exit(1);
}

// 1. An agent writes a page that cites the raw note.
const env = Object.fromEntries(
  Object.entries(process.env).filter(([k]) => k.startsWith("ALEXANDRIA") || k.startsWith("GIT_") || k === "PATH"),
);
const transport = new StdioClientTransport({
  command: bin,
  args: ["mcp", "serve", "--workspace", "global"],
  env,
  stderr: "inherit",
});
const client = new Client({ name: "alexandria-web-browser", version: "1.0.0" });
await client.connect(transport);
const page_md = [
  "# Lighthouse optics",
  "",
  "The Fresnel lens let a small flame be seen for miles.[^1]",
  "See also [the notes](../raw/notes.md).",
  "",
  "[^1]: raw/notes.md",
  "",
].join("\n");
const wrote = await client.callTool({
  name: "write",
  arguments: { command: "create", path: "wiki/optics.md", content: page_md },
});
if (wrote.isError) fail(`write: ${JSON.stringify(wrote.content)}`);
await client.close();

// A folder source that waits for the user's decision (not auto): two pending items.
const inbox = mkdtempSync(join(tmpdir(), "alx-browser-inbox-"));
writeFileSync(`${inbox}/tides.md`, "# Tides\n\nSpring tides follow the new moon.\n");
writeFileSync(`${inbox}/spam.md`, "# Spam\n\nBuy now.\n");
await new Promise((resolve) => setTimeout(resolve, 1100)); // a file counts once it has settled
execFileSync(bin, ["source", "add", "global", "folder", inbox, "--name", "inbox", "--no-auto"], { env: process.env });
execFileSync(bin, ["source", "sync", "global", "inbox"], { env: process.env });

// 2. The one-time login URL.
const loginUrl = execFileSync(bin, ["web", "--no-open"], { env: process.env }).toString().trim();
if (!loginUrl.includes("/login?token=")) fail(`alexandria web printed ${loginUrl}`);

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking"],
});
try {
  const context = await browser.newContext({ viewport: { width: 1100, height: 800 } });
  const page = await context.newPage();
  const errors = [];
  page.on("pageerror", (error) => errors.push(String(error)));
  page.on("console", (message) => {
    if (message.type() === "error" && !message.text().startsWith("Failed to load resource")) errors.push(message.text());
  });
  page.on("response", (response) => {
    if (response.status() >= 400) errors.push(`${response.status()} ${response.url()}`);
  });

  await page.goto(loginUrl);
  if (new URL(page.url()).searchParams.has("token")) fail(`the token stays in the address bar: ${page.url()}`);
  await page.getByRole("heading", { name: "Workspaces" }).waitFor();
  await page.screenshot({ path: `${shots}/1-workspaces.png` });
  // The login URL works once.
  const again = await context.request.get(loginUrl, { maxRedirects: 0 });
  if (again.status() === 303) fail("the one-time login URL worked twice");

  await page.getByRole("link", { name: "global", exact: true }).first().click();
  await page.getByRole("heading", { name: "global" }).waitFor();
  if (!(await page.locator("text=Recent history").count())) fail("workspace page has no history");
  await page.getByRole("link", { name: "wiki/optics.md" }).first().click();
  await page.getByRole("heading", { name: "Lighthouse optics" }).waitFor();
  await page.screenshot({ path: `${shots}/2-page.png`, fullPage: true });

  // The citation's footnote links to the raw file.
  const citation = page.locator('section.footnotes a[href$="raw/notes.md"], .footnotes a[href$="raw/notes.md"]').first();
  if (!(await citation.count())) fail(`no citation link in ${await page.content()}`);
  await citation.click();
  await page.waitForURL(/\/w\/global\/raw\/notes\.md$/);
  const raw = await page.textContent("body");
  if (!raw.includes("Fresnel lens")) fail(`the raw file does not show: ${raw.slice(0, 300)}`);
  await page.goBack();
  await page.getByRole("heading", { name: "Lighthouse optics" }).waitFor();

  // Search from the form.
  await page.getByRole("searchbox", { name: "search" }).fill("Fresnel");
  await page.getByRole("button", { name: "Search" }).click();
  await page.waitForURL(/\/w\/global\/search\?q=Fresnel/);
  const hits = await page.locator("mark").allTextContents();
  if (!hits.some((hit) => /fresnel/i.test(hit))) fail(`no highlighted hit: ${await page.content()}`);
  if (!(await page.getByRole("link", { name: "wiki/optics.md" }).count())) fail("the new page is not a search hit");
  await page.screenshot({ path: `${shots}/3-search.png` });

  // History, then the write's diff.
  await page.getByRole("link", { name: "history", exact: true }).first().click();
  await page.waitForURL(/\/w\/global\/history$/);
  await page.getByRole("link", { name: "diff" }).first().click();
  await page.waitForURL(/\/w\/global\/history\/[^/]+$/);
  const added = await page.locator(".diff .add").allTextContents();
  if (!added.some((line) => line.includes("Lighthouse optics"))) fail(`the diff lacks the new page: ${added.slice(0, 5)}`);
  await page.screenshot({ path: `${shots}/4-diff.png`, fullPage: true });

  // Subscriptions: Ingest one item, Dismiss the other, by their buttons.
  await page.getByRole("link", { name: "subscriptions", exact: true }).first().click();
  await page.getByRole("heading", { name: "Subscriptions" }).waitFor();
  await page.screenshot({ path: `${shots}/5-subscriptions.png`, fullPage: true });
  const tides = page.locator("li.item", { hasText: "tides.md" });
  await tides.getByRole("button", { name: "Ingest" }).click();
  await page.locator(".notice", { hasText: "Captured 1 item" }).waitFor();
  const spam = page.locator("li.item", { hasText: "spam.md" });
  await spam.getByRole("button", { name: "Dismiss" }).click();
  await page.locator(".notice", { hasText: "Dismissed 1 item" }).waitFor();
  if (await page.locator("li.item").count()) fail("pending items remain after ingest and dismiss");
  await page.getByRole("link", { name: "captured", exact: true }).click();
  await page.getByRole("link", { name: /raw\/sources\/inbox\/tides\.md/ }).click();
  if (!(await page.textContent("body")).includes("Spring tides")) fail("the captured file does not show");
  await page.goBack();
  await page.getByRole("heading", { name: "Subscriptions" }).waitFor();

  if (errors.length) fail(`browser errors (CSP violations, scripts, failed loads): ${errors.join(" | ")}`);

  // Sign out: the session ends on the server, so even the old cookie stops working.
  const cookie = (await context.cookies()).map((c) => `${c.name}=${c.value}`).join("; ");
  const home = new URL("/", loginUrl).toString();
  const before = await fetch(home, { headers: { cookie }, redirect: "manual" });
  if (before.status !== 200) fail(`signed in, / answers ${before.status}`);
  await page.getByRole("button", { name: "sign out" }).click();
  await page.waitForURL(/\/login$/);
  const after = await fetch(home, { headers: { cookie }, redirect: "manual" });
  if (after.status !== 401) fail(`after sign-out the old cookie still gets ${after.status}`);

  console.log(`ok: clicked through 9 pages, screenshots in ${shots}`);
} finally {
  await browser.close();
  rmSync(inbox, { recursive: true, force: true });
}
