// The server entry Claude Desktop would run for an unpacked MCP Bundle, computed by the
// official @anthropic-ai/mcpb package's own getMcpConfigForManifest (the code Claude for
// macOS and Windows uses to turn manifest + user settings into a command line).
//
//   node mcpb_entry.mjs UNPACKED_DIR USER_CONFIG_JSON > entry.json
//
// USER_CONFIG_JSON is what the user entered in the bundle's settings, e.g.
// '{"workspace":"global"}' or '{}'. Prints {"command", "args", "env"}.
import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import path from "node:path";
import { getMcpConfigForManifest } from "@anthropic-ai/mcpb";

const [dir, userConfigText] = process.argv.slice(2);
const manifest = JSON.parse(readFileSync(path.join(dir, "manifest.json"), "utf8"));
const home = homedir();
const config = await getMcpConfigForManifest({
  manifest,
  extensionPath: path.resolve(dir),
  systemDirs: {
    HOME: home,
    DESKTOP: path.join(home, "Desktop"),
    DOCUMENTS: path.join(home, "Documents"),
    DOWNLOADS: path.join(home, "Downloads"),
  },
  userConfig: JSON.parse(userConfigText || "{}"),
  pathSeparator: path.sep,
});
if (!config) {
  console.error("getMcpConfigForManifest returned nothing (missing required configuration?)");
  process.exit(1);
}
process.stdout.write(JSON.stringify({ command: config.command, args: config.args ?? [], env: config.env ?? {} }) + "\n");
