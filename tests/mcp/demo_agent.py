"""The demo's MCP agent (tests/demo, step 14): the official Python SDK client
proposes a message through keyturnd's /mcp. The card link arrives by URL
elicitation, for the person; the model's tool result holds none of it.

Usage: python demo_agent.py URL   (the agent's JWT in KT_AGENT_JWT)
Prints the tool result's text, the link the person was shown, and last the
action id.
"""

import asyncio
import os
import sys

import httpx2
from mcp import types
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client


async def main(url):
    links = []

    async def elicit(context, params):
        links.append(params.url)
        return types.ElicitResult(action="accept")

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {os.environ['KT_AGENT_JWT']}"})
    # The 2025-11-25 handshake: the revision in which a server may send the
    # URL elicitation during the call (2026-07-28 has no such request).
    async with Client(streamable_http_client(url, http_client=http), mode="legacy",
                      elicitation_callback=elicit) as c:
        names = [t.name for t in (await c.list_tools()).tools]
        print("tools the agent sees:", ", ".join(names))
        r = await c.call_tool("chat.send_message", {"channel": "sales", "text": "Northwind renewed: 3 years"})
        print("the model reads:", r.content[0].text)
        for link in links:
            print("the person is shown:", link)
        print(r.structured_content["action_id"])


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
