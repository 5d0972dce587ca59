// An agent of the official MCP TypeScript SDK (npm @modelcontextprotocol/client
// 2.x) with the official Tasks extension client (@modelcontextprotocol/ext-tasks),
// on revision 2026-07-28, for the mcp test layer (tests/mcp/test_mcp.py).
//
//   node tasks_agent.mjs <keyturnd base URL> <tool> <arguments JSON>
//   (the agent's JWT in KT_AGENT_JWT)
//
// Calls the tool as a task and prints one JSON line once the person has been
// asked (the task id, its statuses so far, the links elicited, how keyturnd
// answered a foreign task id and a cancel), then, once the task settled, a
// second line with its outcome. The test approves in between.
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { createTaskSessionFromClient } from "@modelcontextprotocol/ext-tasks/client";
import { randomUUID } from "node:crypto";

const [base, tool, argsJson] = process.argv.slice(2);
const jwt = process.env.KT_AGENT_JWT;
const VERSION = "2026-07-28";
const endpoint = new URL("/mcp", base);

// The Tasks client's raw JSON-RPC path (the SDK's own codecs do not carry
// 2026-07-28 task shapes): one POST a request, its answer as JSON or SSE.
let nextId = 1;
async function rawDispatch(request) {
  const body = { jsonrpc: "2.0", id: nextId++, ...request };
  const headers = {
    authorization: `Bearer ${jwt}`,
    "content-type": "application/json",
    accept: "application/json, text/event-stream",
    "mcp-protocol-version": VERSION,
    "mcp-method": body.method,
  };
  // The standard headers of 2026-07-28: what is called, and on what.
  if (body.method === "tools/call") headers["mcp-name"] = body.params.name;
  if (body.method.startsWith("tasks/")) headers["mcp-name"] = body.params.taskId;
  const response = await fetch(endpoint, { method: "POST", headers, body: JSON.stringify(body) });
  const text = await response.text();
  let message;
  if ((response.headers.get("content-type") || "").includes("text/event-stream")) {
    for (const line of text.split("\n")) {
      if (!line.startsWith("data:")) continue;
      const data = line.slice(5).trim();
      if (!data) continue;
      const parsed = JSON.parse(data);
      if (parsed.id === body.id) message = parsed;
    }
  } else if (text) {
    message = JSON.parse(text);
  }
  if (!message) throw new Error(`HTTP ${response.status} without a JSON-RPC answer: ${text}`);
  return message.error ? { kind: "error", error: message.error } : { kind: "result", result: message.result };
}

const clientInfo = { name: "keyturn-tasks-check", version: "1.0.0" };
const clientCapabilities = { elicitation: { url: {} } };
const client = new Client(clientInfo, {
  capabilities: clientCapabilities,
  versionNegotiation: { mode: { pin: VERSION } },
});
await client.connect(
  new StreamableHTTPClientTransport(endpoint, { requestInit: { headers: { authorization: `Bearer ${jwt}` } } }),
);

const elicited = [];
let asked;
const personAsked = new Promise((resolve) => { asked = resolve; });
const session = createTaskSessionFromClient(client, {
  endpointId: "keyturn-test",
  rawDispatch,
  v2RequestFraming: { protocolVersion: VERSION, clientInfo, clientCapabilities },
  onInputRequest: async (request) => {
    elicited.push(request.params);
    asked();
    return { action: "accept" };
  },
});

const statuses = [];
const execution = await session.callTool(tool, JSON.parse(argsJson));
const taskId = execution.handle?.taskId;
const settled = execution.settle({
  onEvent: (event) => {
    if (event.type === "task") statuses.push(event.task.status);
  },
});
const settledFirst = await Promise.race([personAsked.then(() => false), settled.then(() => true)]);

// What keyturnd answers for a task that is not this agent's, for a cancel,
// and for an input it never asked for (each framed as 2026-07-28 asks).
const framed = (method, params) => rawDispatch({
  method,
  params: {
    ...params,
    _meta: {
      "io.modelcontextprotocol/protocolVersion": VERSION,
      "io.modelcontextprotocol/clientInfo": clientInfo,
      "io.modelcontextprotocol/clientCapabilities": {
        ...clientCapabilities,
        extensions: { "io.modelcontextprotocol/tasks": {} },
      },
    },
  },
});
const foreign = await framed("tasks/get", { taskId: randomUUID() });
const cancel = await framed("tasks/cancel", { taskId });
const update = await framed("tasks/update", {
  taskId,
  inputResponses: { something_else: { action: "accept" } },
});
console.log(JSON.stringify({
  kind: execution.kind, taskId, statuses, elicited, settledFirst, foreign, cancel, update,
  early: settledFirst ? (await settled).outcome : undefined,
}));

const { outcome } = await settled;
console.log(JSON.stringify({ statuses, outcome }));
await session.close();
await client.close();
