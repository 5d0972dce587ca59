// The mcp layer's second client: the official MCP TypeScript SDK
// (@modelcontextprotocol/sdk, npm), which nobody here wrote, against
// keyturnd's /mcp. Lists the tools, calls one write tool, and prints one JSON
// object: the tool names, the raw results (for the layer's scan for the
// token), and the URLs of any elicitation keyturnd sent.
//
// Usage: node ts_agent.mjs BASE_URL TOOL ARGS_JSON   (the agent's JWT in KT_AGENT_JWT)

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const [base, tool, args] = process.argv.slice(2);
const elicited = [];
const client = new Client(
  { name: "keyturn-ts-check", version: "1.0.0" },
  { capabilities: { elicitation: { url: {} } } },
);
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  elicited.push(request.params.url ?? null);
  return { action: "accept" };
});
const transport = new StreamableHTTPClientTransport(new URL("/mcp", base), {
  requestInit: { headers: { Authorization: `Bearer ${process.env.KT_AGENT_JWT}` } },
});
await client.connect(transport);
const listed = await client.listTools();
const called = await client.callTool({ name: tool, arguments: JSON.parse(args) });
await client.close();
console.log(JSON.stringify({
  protocol: transport.protocolVersion ?? null,
  tools: listed.tools.map((t) => t.name),
  listed,
  called,
  elicited,
}));
