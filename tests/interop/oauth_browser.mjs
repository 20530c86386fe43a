// The OAuth consent page in a real browser (Debian's Chromium via playwright-core):
// what a person sees when Claude.ai or ChatGPT connects. The script registers a client
// (dynamic registration, PKCE), opens /authorize in the browser, types the pairing code
// from `alexandria remote pair` and clicks Approve; the browser must post the form
// (Origin, CSRF cookie, CSP form-action) and follow the redirect to the client's
// callback, whose code is exchanged for a token that opens an MCP session.
//
// Usage: node oauth_browser.mjs ALEXANDRIA_BIN BASE_URL SCREENSHOT_DIR
// (remote access on with BASE_URL as its public URL; workspace `global` exists)

import { execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { mkdirSync } from "node:fs";
import { chromium } from "playwright-core";

const [bin, base, shots] = process.argv.slice(2);
if (!bin || !base || !shots) {
  console.error("usage: node oauth_browser.mjs ALEXANDRIA_BIN BASE_URL SCREENSHOT_DIR");
  process.exit(2);
}
mkdirSync(shots, { recursive: true });

function fail(message) {
  console.error(`FAIL: ${message}`);
  process.exit(1);
}

const redirectUri = "http://127.0.0.1:9/callback";
const resource = `${base}/mcp/global`;
const registered = await fetch(`${base}/register`, {
  method: "POST",
  headers: { "content-type": "application/json" },
  body: JSON.stringify({
    client_name: "Browser test client",
    redirect_uris: [redirectUri],
    token_endpoint_auth_method: "none",
    grant_types: ["authorization_code", "refresh_token"],
  }),
});
if (registered.status !== 201) fail(`register: ${registered.status} ${await registered.text()}`);
const { client_id: clientId } = await registered.json();

const verifier = randomBytes(32).toString("base64url");
const challenge = createHash("sha256").update(verifier).digest("base64url");
const authorize = new URL(`${base}/authorize`);
for (const [key, value] of Object.entries({
  response_type: "code",
  client_id: clientId,
  redirect_uri: redirectUri,
  state: "browser-state",
  code_challenge: challenge,
  code_challenge_method: "S256",
  resource,
  scope: "wiki:read",
})) {
  authorize.searchParams.set(key, value);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking"],
});
let callback;
try {
  const page = await browser.newPage();
  // The client's callback: catch the redirect instead of reaching 127.0.0.1:9.
  await page.route("http://127.0.0.1:9/**", (route) => {
    callback = new URL(route.request().url());
    return route.fulfill({ status: 200, contentType: "text/plain", body: "callback reached" });
  });
  await page.goto(authorize.toString());
  await page.getByRole("button", { name: "Approve" }).waitFor();
  if (!(await page.textContent("body")).includes("Browser test client")) fail("the consent page does not name the client");
  const code = execFileSync(bin, ["remote", "pair"], { env: process.env }).toString().trim();
  await page.fill("#pairing_code", code);
  await page.screenshot({ path: `${shots}/consent.png`, fullPage: true });
  await page.getByRole("button", { name: "Approve" }).click();
  await page.waitForFunction(() => document.body?.textContent?.includes("callback reached"), null, { timeout: 15000 }).catch(async () => {
    fail(`approving did not reach the client's callback; the browser shows ${page.url()}: ${(await page.textContent("body"))?.slice(0, 400)}`);
  });
} finally {
  await browser.close();
}
if (!callback) fail("no callback");
if (callback.searchParams.get("state") !== "browser-state") fail(`state ${callback.searchParams.get("state")}`);
const code = callback.searchParams.get("code");
if (!code) fail(`no code in ${callback}`);

const token = await fetch(`${base}/token`, {
  method: "POST",
  headers: { "content-type": "application/x-www-form-urlencoded" },
  body: new URLSearchParams({
    grant_type: "authorization_code",
    code,
    redirect_uri: redirectUri,
    client_id: clientId,
    code_verifier: verifier,
    resource,
  }),
});
if (token.status !== 200) fail(`token: ${token.status} ${await token.text()}`);
const { access_token: accessToken } = await token.json();
const init = await fetch(resource, {
  method: "POST",
  headers: {
    authorization: `Bearer ${accessToken}`,
    "content-type": "application/json",
    accept: "application/json, text/event-stream",
  },
  body: JSON.stringify({
    jsonrpc: "2.0",
    id: 1,
    method: "initialize",
    params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "oauth-browser", version: "1" } },
  }),
});
if (init.status !== 200) fail(`initialize with the token: ${init.status} ${await init.text()}`);
console.log("ok: consent approved in Chromium, token opens an MCP session");
