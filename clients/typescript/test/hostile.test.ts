/**
 * The TypeScript client against a hostile server (a local node:http one, no SABRE needed): a redirect
 * is refused, not followed, so the API key and the request body never reach where it points.
 */
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { Sabre, SabreRedirectError } from "../src/index.js";

interface Seen {
  method: string;
  url: string;
  authorization: string | undefined;
  body: string;
}

/** A server on a free loopback port; `seen` lists every request it received, body read. */
async function listen(
  answer: (request: IncomingMessage, response: ServerResponse) => void,
): Promise<{ server: Server; url: string; seen: Seen[] }> {
  const seen: Seen[] = [];
  const server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on("data", (chunk: Buffer) => chunks.push(chunk));
    request.on("end", () => {
      seen.push({
        method: request.method ?? "",
        url: request.url ?? "",
        authorization: request.headers.authorization,
        body: Buffer.concat(chunks).toString(),
      });
      answer(request, response);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return { server, url: `http://127.0.0.1:${port}`, seen };
}

async function close(server: Server): Promise<void> {
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
}

test("a redirect is refused: neither the key nor the body follows it", async () => {
  const elsewhere = await listen((_request, response) => {
    response.writeHead(200, { "content-type": "application/json" });
    response.end("{}");
  });
  const targets = [
    `${elsewhere.url}/steal`, // another origin (another port)
    "/steal", // the same origin, another path
  ];
  let target = "";
  const redirecting = await listen((request, response) => {
    if (request.url === "/steal") {
      response.writeHead(200, { "content-type": "application/json" });
      response.end("{}");
      return;
    }
    response.writeHead(307, { location: target });
    response.end();
  });
  try {
    const sabre = new Sabre({ baseUrl: redirecting.url, apiKey: "sk-secret" });
    for (target of targets) {
      await assert.rejects(sabre.createConversation({ input: "the secret plan" }), (error: unknown) => {
        assert.ok(error instanceof SabreRedirectError, String(error));
        assert.equal(error.status, 307);
        assert.match(error.message, /redirect/);
        return true;
      });
      await assert.rejects(sabre.api.GET("/v1/conversations/{conversation_id}", {
        params: { path: { conversation_id: "conv_1" } },
      }), SabreRedirectError);
      await assert.rejects(async () => {
        for await (const _ of sabre.streamConversation({ input: "the secret plan" })) {
          // nothing arrives
        }
      }, SabreRedirectError);
    }
    const followed = [...elsewhere.seen, ...redirecting.seen.filter((seen) => seen.url === "/steal")];
    assert.deepEqual(followed, []);
    // Every request reached the first server, and only it.
    assert.equal(redirecting.seen.length, 3 * targets.length);
  } finally {
    await close(redirecting.server);
    await close(elsewhere.server);
  }
});
