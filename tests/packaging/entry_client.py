"""Start an MCP server the way a client's config entry says, with the official Python SDK.

Usage:
  entry_client.py ENTRY_JSON --expect open|pinned:SLUG [--write]

ENTRY_JSON is a file holding one stdio entry as MCP clients store it:
{"command": "...", "args": [...], "env": {...}}. The server is started with this process's
environment plus the entry's env (as a client that inherits its environment would), the
tools are listed, guide is called, and the binding is checked: open mode refuses a call
without `workspace`; pinned mode answers without one and refuses any other workspace.
--write also creates a page and reads it back. Prints `first_tool_call_at=<unix time>`
once the first tool call has answered. Exits non-zero on any mismatch.
"""

import argparse
import asyncio
import json
import os
import sys
import time

from mcp import Client, StdioServerParameters


def fail(message: str) -> None:
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def text_of(result) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "text", None))


async def run(args: argparse.Namespace) -> None:
    with open(args.entry) as f:
        entry = json.load(f)
    env = dict(os.environ)
    env.update(entry.get("env") or {})
    server = StdioServerParameters(command=entry["command"], args=entry.get("args", []), env=env)
    async with Client(server, read_timeout_seconds=60) as client:
        tools = await client.list_tools()
        names = sorted(tool.name for tool in tools.tools)
        for wanted in ("guide", "search", "read", "write"):
            if wanted not in names:
                fail(f"tool {wanted} missing from {names}")
        guide = await client.call_tool("guide", {})
        print(f"first_tool_call_at={time.time():.3f}", flush=True)
        if guide.is_error or "alexandria" not in text_of(guide):
            fail(f"guide: {text_of(guide)[:300]}")
        if args.expect == "open":
            scope = {"workspace": "global"}
            unscoped = await client.call_tool("search", {"query": "anything"})
            if not unscoped.is_error or "workspace_required" not in text_of(unscoped):
                fail(f"open mode answered a call without workspace: {text_of(unscoped)[:300]}")
        else:
            pinned = args.expect.removeprefix("pinned:")
            scope = {}
            other = "not-" + pinned
            refused = await client.call_tool("search", {"query": "anything", "workspace": other})
            if not refused.is_error or "workspace_not_accessible" not in text_of(refused):
                fail(f"pinned to {pinned}, yet {other} was not refused: {text_of(refused)[:300]}")
        search = await client.call_tool("search", {"query": "anything", **scope})
        if search.is_error:
            fail(f"search: {text_of(search)[:300]}")
        if args.write:
            body = f"# Packaging check\n\nWritten at {time.time():.3f}.\n"
            wrote = await client.call_tool(
                "write",
                {"command": "create", "path": f"wiki/packaging-{os.getpid()}.md", "content": body, **scope},
            )
            if wrote.is_error:
                fail(f"write: {text_of(wrote)[:300]}")
            read = await client.call_tool("read", {"path": f"wiki/packaging-{os.getpid()}.md", **scope})
            if read.is_error or "Packaging check" not in text_of(read):
                fail(f"read back: {text_of(read)[:300]}")
        print(f"ok: {args.expect}, protocol {client.protocol_version}, tools {names}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("entry")
    parser.add_argument("--expect", required=True)
    parser.add_argument("--write", action="store_true")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
