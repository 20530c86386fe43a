// The official TypeScript MCP SDK against alexandria's resources: list (all pages),
// templates, read, subscribe, and notifications/resources/updated after a write.
//
// Usage:
//   node ts_resources.mjs stdio ALEXANDRIA_BIN [SLUG]
//   node ts_resources.mjs http URL [SLUG]

import { randomUUID } from "node:crypto";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ResourceUpdatedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

const [kind, target, slug] = process.argv.slice(2);

function fail(message) {
  console.error(`FAIL: ${message}`);
  process.exit(1);
}

let transport;
if (kind === "stdio") {
  const env = Object.fromEntries(
    Object.entries(process.env).filter(([k]) => k.startsWith("ALEXANDRIA") || k.startsWith("GIT_") || k === "PATH"),
  );
  const args = ["mcp", "serve", ...(slug ? ["--workspace", slug] : [])];
  transport = new StdioClientTransport({ command: target, args, env, stderr: "inherit" });
} else if (kind === "http") {
  transport = new StreamableHTTPClientTransport(new URL(target));
} else {
  fail(`unknown transport ${kind}`);
}

const client = new Client({ name: "alexandria-interop-ts-resources", version: "1.0.0" });
const updated = [];
client.setNotificationHandler(ResourceUpdatedNotificationSchema, (notification) => {
  updated.push(notification.params.uri);
});
await client.connect(transport);
if (!client.getServerCapabilities()?.resources?.subscribe) fail("resources.subscribe not advertised");

const workspace = slug ?? "global";
const scope = slug ? {} : { workspace };
let page = await client.listResources();
const uris = page.resources.map((r) => r.uri);
while (page.nextCursor) {
  page = await client.listResources({ cursor: page.nextCursor });
  uris.push(...page.resources.map((r) => r.uri));
}
const index = `alexandria://${workspace}/wiki/index.md`;
if (!uris.includes(index)) fail(`${index} not listed: ${uris.slice(0, 20)}`);
if (slug && uris.some((u) => !u.startsWith(`alexandria://${slug}/`))) fail("a pinned session lists other workspaces");
const { resourceTemplates } = await client.listResourceTemplates();
if (!resourceTemplates.some((t) => t.uriTemplate.includes("/wiki/{path}"))) fail("no wiki template");
const read = await client.readResource({ uri: index });
if (read.contents[0].mimeType !== "text/markdown" || !read.contents[0].text) fail(`read ${index}`);

const path = `wiki/interop-ts-${randomUUID().slice(0, 8)}.md`;
const uri = `alexandria://${workspace}/${path}`;
await client.subscribeResource({ uri });
const created = await client.callTool({
  name: "write",
  arguments: { command: "create", path, content: "# Interop\n\nFrom TypeScript.\n", ...scope },
});
if (created.isError) fail(`write: ${JSON.stringify(created.content)}`);
const deadline = Date.now() + 20000;
while (!updated.includes(uri)) {
  if (Date.now() > deadline) fail(`no notifications/resources/updated for ${uri} (got ${updated})`);
  await new Promise((resolve) => setTimeout(resolve, 50));
}
if (kind === "http") await transport.terminateSession();
await client.close();
console.log(`ok: ${uris.length} resources, update for ${uri}`);
