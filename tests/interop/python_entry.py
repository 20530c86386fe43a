"""Start alexandria exactly as an MCP client entry written by `alexandria mcp install` says,
with the official Python SDK's default (reduced) environment, and check that it reaches
the home the entry was installed from.

Usage: python_entry.py CONFIG_JSON WORKSPACE

CONFIG_JSON is a client file with {"mcpServers": {"alexandria": {...}}} (Cursor's shape).
The SDK passes only HOME, PATH, USER, … plus the entry's own "env" to the server, so an
ALEXANDRIA_HOME exported in this process's environment never reaches it: the entry must
carry it. WORKSPACE must show up in guide (it exists only in that home).
"""

import asyncio
import json
import sys

from mcp import Client, StdioServerParameters


def fail(message: str) -> None:
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


async def run(config_path: str, workspace: str) -> None:
    with open(config_path) as f:
        entry = json.load(f)["mcpServers"]["alexandria"]
    # Exactly the entry's fields; env=None would mean "the SDK default only".
    server = StdioServerParameters(
        command=entry["command"], args=entry.get("args", []), env=entry.get("env")
    )
    async with Client(server, read_timeout_seconds=30) as client:
        guide = await client.call_tool("guide", {})
        text = "\n".join(b.text for b in guide.content if getattr(b, "text", None))
        if guide.is_error or workspace not in text:
            fail(f"guide did not list {workspace}: {text[:400]}")
        print(f"ok: the entry reached the home with workspace {workspace}")


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1], sys.argv[2]))
