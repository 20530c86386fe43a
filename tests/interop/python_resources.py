"""The official Python SDK against alexandria's resources: list (all pages), templates, read,
subscribe, and a notifications/resources/updated after a write.

Usage:
  python_resources.py --stdio ALEXANDRIA_BIN [--workspace SLUG]
  python_resources.py --url URL [--workspace SLUG]

Runs in legacy mode (initialize, 2025-11-25): resources/subscribe belongs to that era.
"""

import argparse
import asyncio
import os
import sys
import uuid

import anyio

from mcp import Client, StdioServerParameters


def fail(message: str) -> None:
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


async def run(args: argparse.Namespace) -> None:
    if args.stdio:
        serve = ["mcp", "serve"] + (["--workspace", args.workspace] if args.workspace else [])
        env = {k: v for k, v in os.environ.items() if k.startswith(("ALEXANDRIA", "GIT_"))}
        env["PATH"] = os.environ.get("PATH", "")
        server = StdioServerParameters(command=args.stdio, args=serve, env=env)
    else:
        server = args.url
    slug = args.workspace or "global"
    scope = {} if args.workspace else {"workspace": slug}
    updated: list[str] = []

    async def on_message(message) -> None:
        root = getattr(message, "root", message)
        if getattr(root, "method", None) == "notifications/resources/updated":
            updated.append(str(root.params.uri))

    async with Client(server, mode="legacy", read_timeout_seconds=30, message_handler=on_message, cache=None) as client:
        page = await client.list_resources()
        uris = [str(r.uri) for r in page.resources]
        while page.next_cursor:
            page = await client.list_resources(cursor=page.next_cursor)
            uris += [str(r.uri) for r in page.resources]
        index = f"alexandria://{slug}/wiki/index.md"
        if index not in uris:
            fail(f"{index} not in resources/list: {uris[:20]}")
        if args.workspace and any(not u.startswith(f"alexandria://{slug}/") for u in uris):
            fail(f"a pinned session lists other workspaces: {uris[:20]}")
        templates = await client.list_resource_templates()
        patterns = [t.uri_template for t in templates.resource_templates]
        if not any("/wiki/{path}" in p for p in patterns):
            fail(f"no wiki template: {patterns}")
        read = await client.read_resource(index)
        text = read.contents[0].text
        if not text or read.contents[0].mime_type != "text/markdown":
            fail(f"read {index}: {read}")

        page_path = f"wiki/interop-{uuid.uuid4().hex[:8]}.md"
        uri = f"alexandria://{slug}/{page_path}"
        await client.subscribe_resource(uri)
        created = await client.call_tool(
            "write", {"command": "create", "path": page_path, "content": "# Interop\n\nSubscribed.\n", **scope}
        )
        if created.is_error:
            fail(f"write: {created.content}")
        with anyio.fail_after(20):
            while uri not in updated:
                await anyio.sleep(0.05)
        fresh = await client.read_resource(uri)
        if "Subscribed." not in (fresh.contents[0].text or ""):
            fail(f"read after update: {fresh}")
        print(f"ok: {len(uris)} resources, templates {patterns}, update for {uri}")

    if args.listen:
        await listen(server, scope, slug)


async def listen(server, scope: dict, slug: str) -> None:
    """2026-07-28: subscriptions/listen with a resource URI, then a write to it."""
    async with Client(server, mode="auto", read_timeout_seconds=30, cache=None) as client:
        if client.protocol_version != "2026-07-28":
            fail(f"negotiated {client.protocol_version}, expected 2026-07-28")
        page_path = f"wiki/listen-{uuid.uuid4().hex[:8]}.md"
        uri = f"alexandria://{slug}/{page_path}"
        async with client.listen(resource_subscriptions=[uri]) as sub:
            created = await client.call_tool(
                "write", {"command": "create", "path": page_path, "content": "# Listen\n", **scope}
            )
            if created.is_error:
                fail(f"write: {created.content}")
            with anyio.fail_after(20):
                async for event in sub:
                    if uri in str(event):
                        break
        print(f"ok: subscriptions/listen delivered an update for {uri}")


def main() -> None:
    parser = argparse.ArgumentParser()
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--stdio")
    target.add_argument("--url")
    parser.add_argument("--workspace")
    parser.add_argument("--listen", action="store_true", help="also check subscriptions/listen (2026-07-28)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
