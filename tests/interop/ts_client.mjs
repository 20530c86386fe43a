// The official TypeScript MCP SDK against alexandria: list tools, call guide/search/read.
//
// Usage:
//   node ts_client.mjs stdio ALEXANDRIA_BIN [SLUG]
//   node ts_client.mjs http URL [SLUG]
// With SLUG the session is pinned (stdio: --workspace SLUG; http: URL is /mcp/SLUG);
// without, calls name workspace "global". Exits non-zero on any mismatch.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [kind, target, slug] = process.argv.slice(2);

function fail(message) {
  console.error(`FAIL: ${message}`);
  process.exit(1);
}

function textOf(result) {
  return (result.content ?? [])
    .filter((block) => block.type === "text")
    .map((block) => block.text)
    .join("\n");
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

const client = new Client({ name: "alexandria-interop-ts", version: "1.0.0" });
await client.connect(transport);
const version = client.getServerVersion();
if (version?.name !== "alexandria") fail(`server name ${JSON.stringify(version)}`);

const scope = slug ? {} : { workspace: "global" };
const { tools } = await client.listTools();
const names = tools.map((tool) => tool.name).sort();
for (const wanted of ["guide", "search", "read"]) {
  if (!names.includes(wanted)) fail(`tool ${wanted} missing from ${names}`);
}
const guide = await client.callTool({ name: "guide", arguments: {} });
if (guide.isError || !textOf(guide).includes("alexandria")) fail(`guide: ${textOf(guide).slice(0, 300)}`);
const search = await client.callTool({ name: "search", arguments: { query: "Fresnel", ...scope } });
if (search.isError || !textOf(search).includes("raw/notes.md")) fail(`search: ${textOf(search).slice(0, 300)}`);
const read = await client.callTool({ name: "read", arguments: { path: "raw/notes.md", ...scope } });
if (read.isError || !textOf(read).includes("Fresnel lens")) fail(`read: ${textOf(read).slice(0, 300)}`);
if (!read.structuredContent) fail("read: no structuredContent");
const pong = await client.ping();
if (pong === undefined) fail("ping");
if (kind === "http") await transport.terminateSession();
await client.close();
console.log(`ok: tools ${names.join(",")}`);
