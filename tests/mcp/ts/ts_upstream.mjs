// An upstream MCP server on the official TypeScript SDK (npm
// @modelcontextprotocol/sdk, McpServer over Streamable HTTP), for the mcp
// test layer: keyturn must take its tools as it serves them. This SDK sets
// `execution` (2025-11-25) on every tool, a field the Rust SDK's Tool does
// not keep, and the tool here carries a vendor key in `_meta` too.
//
// Every tools/call it receives is appended, as received, to the file named
// by KT_TS_UPSTREAM_CALLS (one JSON object a line: tool, arguments, _meta).
//
// Usage: node ts_upstream.mjs PORT
import http from "node:http";
import { randomUUID } from "node:crypto";
import { appendFileSync } from "node:fs";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";

const port = Number(process.argv[2]);
const calls = process.env.KT_TS_UPSTREAM_CALLS;

function server() {
  const s = new McpServer({ name: "board", version: "1.0.0" });
  s.registerTool(
    "pin-Message",
    {
      description: "Pin a message to a board.",
      inputSchema: { board: z.string(), text: z.string().max(200) },
      _meta: { "com.example/audience": "ops" },
    },
    async (args, extra) => {
      appendFileSync(calls, JSON.stringify({ tool: "pin-Message", arguments: args, _meta: extra._meta ?? null }) + "\n");
      return { content: [{ type: "text", text: `pinned to ${args.board}` }] };
    },
  );
  return s;
}

const sessions = new Map();

async function body(req) {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  const text = Buffer.concat(chunks).toString("utf8");
  return text ? JSON.parse(text) : undefined;
}

http
  .createServer(async (req, res) => {
    try {
      const id = req.headers["mcp-session-id"];
      const parsed = req.method === "POST" ? await body(req) : undefined;
      let transport = id ? sessions.get(id) : undefined;
      if (!transport && req.method === "POST" && isInitializeRequest(parsed)) {
        transport = new StreamableHTTPServerTransport({
          sessionIdGenerator: () => randomUUID(),
          onsessioninitialized: (sid) => sessions.set(sid, transport),
        });
        transport.onclose = () => transport.sessionId && sessions.delete(transport.sessionId);
        await server().connect(transport);
      }
      if (!transport) {
        res.writeHead(404).end();
        return;
      }
      await transport.handleRequest(req, res, parsed);
    } catch (e) {
      if (!res.headersSent) res.writeHead(500).end(String(e));
    }
  })
  .listen(port, "127.0.0.1");
