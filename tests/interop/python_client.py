"""The official Python MCP SDK against alexandria: list tools, call guide/search/read.

Usage:
  python_client.py --stdio ALEXANDRIA_BIN [--workspace SLUG] --mode auto|legacy --expect VERSION
  python_client.py --url URL [--workspace SLUG] --mode auto|legacy --expect VERSION

--mode auto is the SDK's default (probe server/discover, i.e. 2026-07-28, and fall
back to initialize); legacy forces the initialize handshake. --expect is the protocol
version the connection must end up on. Exits non-zero on any mismatch.
"""

import argparse
import asyncio
import os
import sys

from mcp import Client, StdioServerParameters


def fail(message: str) -> None:
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def text_of(result) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "text", None))


async def run(args: argparse.Namespace) -> None:
    if args.stdio:
        serve = ["mcp", "serve"] + (["--workspace", args.workspace] if args.workspace else [])
        env = {k: v for k, v in os.environ.items() if k.startswith(("ALEXANDRIA", "GIT_"))}
        env["PATH"] = os.environ.get("PATH", "")
        server = StdioServerParameters(command=args.stdio, args=serve, env=env)
    else:
        server = args.url
    # Open mode needs workspace on every call; pinned mode may omit it.
    scope = {} if args.workspace else {"workspace": "global"}
    async with Client(server, mode=args.mode, read_timeout_seconds=30) as client:
        if client.protocol_version != args.expect:
            fail(f"negotiated {client.protocol_version}, expected {args.expect}")
        tools = await client.list_tools()
        names = sorted(tool.name for tool in tools.tools)
        for wanted in ("guide", "search", "read"):
            if wanted not in names:
                fail(f"tool {wanted} missing from {names}")
        guide = await client.call_tool("guide", {})
        if guide.is_error or "alexandria" not in text_of(guide):
            fail(f"guide: {text_of(guide)[:300]}")
        search = await client.call_tool("search", {"query": "Fresnel", **scope})
        if search.is_error or "raw/notes.md" not in text_of(search):
            fail(f"search: {text_of(search)[:300]}")
        read = await client.call_tool("read", {"path": "raw/notes.md", **scope})
        if read.is_error or "Fresnel lens" not in text_of(read):
            fail(f"read: {text_of(read)[:300]}")
        if read.structured_content is None:
            fail("read: no structuredContent")
        refused = await client.call_tool("read", {"path": "../config.toml", **scope})
        if not refused.is_error or "invalid_path" not in text_of(refused):
            fail(f"read ../config.toml was not refused: {text_of(refused)[:300]}")
        print(f"ok: {client.protocol_version}, tools {names}")


def main() -> None:
    parser = argparse.ArgumentParser()
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--stdio")
    target.add_argument("--url")
    parser.add_argument("--workspace")
    parser.add_argument("--mode", choices=["auto", "legacy"], required=True)
    parser.add_argument("--expect", required=True)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
