"""The official Python SDK's OAuth client against alexandria's authorization server.

Usage: python_oauth.py --url URL --alexandria ALEXANDRIA_BIN [--mode auto|legacy]

URL is a pinned endpoint under the daemon's public URL (remote access on, public URL
http://127.0.0.1:<port>). The SDK's `OAuthClientProvider` discovers the metadata from
the 401 challenge, registers dynamically, and sends the user to the consent page; the
redirect handler plays the user: it fetches the form, asks `alexandria remote pair`
for a code, posts it and hands the code from the redirect to the callback handler.
Then the client lists tools and searches. Exits non-zero on any failure.
"""

import argparse
import asyncio
import re
import subprocess
import sys
from urllib.parse import parse_qs, urlparse

import httpx2
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata


def fail(message: str) -> None:
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


class MemoryStorage:
    def __init__(self):
        self.tokens = None
        self.client_info = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client_info

    async def set_client_info(self, client_info):
        self.client_info = client_info


def hidden(page: str, name: str) -> str:
    match = re.search(rf'name={name} value="([^"]*)"', page)
    if not match:
        fail(f"no {name} in the consent page: {page[:500]}")
    return match.group(1)


async def run(args: argparse.Namespace) -> None:
    redirect = {}

    async def redirect_handler(authorization_url: str) -> None:
        async with httpx2.AsyncClient(follow_redirects=False) as browser:
            page = await browser.get(authorization_url)
            if page.status_code != 200:
                fail(f"consent page: {page.status_code} {page.text[:300]}")
            origin = "{0.scheme}://{0.netloc}".format(urlparse(authorization_url))
            fields = {"request_id": hidden(page.text, "request_id"), "csrf": hidden(page.text, "csrf")}
            # A wrong code first: no redirect, no code.
            wrong = await browser.post(f"{origin}/authorize", data={**fields, "pairing_code": "AAAA-AAAA", "decision": "approve"}, headers={"Origin": origin})
            if wrong.status_code != 400 or "location" in wrong.headers:
                fail(f"a wrong pairing code was not refused: {wrong.status_code}")
            code = subprocess.run([args.alexandria, "remote", "pair"], capture_output=True, text=True, check=True).stdout.strip()
            approved = await browser.post(f"{origin}/authorize", data={**fields, "pairing_code": code, "decision": "approve"}, headers={"Origin": origin})
            if approved.status_code != 303:
                fail(f"approval: {approved.status_code} {approved.text[:300]}")
            redirect["location"] = approved.headers["location"]

    async def callback_handler() -> AuthorizationCodeResult:
        query = parse_qs(urlparse(redirect["location"]).query)
        return AuthorizationCodeResult(code=query["code"][0], state=query.get("state", [None])[0], iss=query.get("iss", [None])[0])

    storage = MemoryStorage()
    provider = OAuthClientProvider(
        server_url=args.url,
        client_metadata=OAuthClientMetadata(
            client_name="python-sdk-interop",
            redirect_uris=["http://127.0.0.1:3030/callback"],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="client_secret_post",
        ),
        storage=storage,
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
    )
    async with httpx2.AsyncClient(auth=provider, timeout=30) as http_client:
        async with Client(streamable_http_client(args.url, http_client=http_client), mode=args.mode, read_timeout_seconds=30) as client:
            tools = await client.list_tools()
            names = sorted(tool.name for tool in tools.tools)
            if "search" not in names:
                fail(f"no search tool in {names}")
            search = await client.call_tool("search", {"query": "Fresnel"})
            text = "\n".join(b.text for b in search.content if getattr(b, "text", None))
            if search.is_error or "raw/notes.md" not in text:
                fail(f"search: {text[:300]}")
    if storage.tokens is None or not storage.tokens.refresh_token:
        fail("no tokens stored")
    # The token is bound to this endpoint: another workspace refuses it.
    other = args.url.rsplit("/", 1)[0] + "/other"
    async with httpx2.AsyncClient(timeout=30) as plain:
        refused = await plain.post(other, headers={"Authorization": f"Bearer {storage.tokens.access_token}", "Accept": "application/json, text/event-stream", "Content-Type": "application/json"}, content=b'{"jsonrpc":"2.0","id":1,"method":"ping"}')
        if refused.status_code != 401:
            fail(f"the token was accepted on {other}: {refused.status_code}")
    print(f"ok: OAuth (client {storage.client_info.client_id}), tools {names}, scope {storage.tokens.scope}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--alexandria", required=True)
    parser.add_argument("--mode", choices=["auto", "legacy"], default="auto")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
