/**
 * The TypeScript client against a hostile server (a local node:http one, no SABRE needed): a redirect
 * is refused, not followed, so the API key and the request body never reach where it points; one
 * endless event of a stream fails it instead of being buffered.
 */
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { MAX_EVENT_BYTES, Sabre, SabreEventTooLargeError, SabreRedirectError } from "../src/index.js";

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

test("an oversized event fails the stream, which stops reading it", async () => {
  const first = {
    id: "evt_1", seq: 1, turn_id: "turn_1", parent_id: null, type: "turn.started",
    created_at: "2025-01-01T00:00:00Z", data: {},
  };
  let finished!: (broken: boolean) => void;
  const served = new Promise<boolean>((resolve) => (finished = resolve));
  const endless = await listen((_request, response) => {
    response.writeHead(200, {
      "content-type": "text/event-stream",
      location: "/v1/conversations/conv_1/turns/turn_1",
    });
    response.write(`id: 1\ndata: ${JSON.stringify(first)}\n\n`);
    response.write('data: "');
    // Twice the cap, written as the client reads it: a client that stops reading leaves it unsent.
    const chunk = Buffer.alloc(65536, "x");
    let left = (2 * MAX_EVENT_BYTES) / chunk.length;
    const more = (): void => {
      while (left > 0) {
        left -= 1;
        if (!response.write(chunk)) {
          response.once("drain", more);
          return;
        }
      }
      response.end('"\n\n', () => finished(false));
    };
    response.on("close", () => finished(left > 0));
    more();
  });
  try {
    const sabre = new Sabre({ baseUrl: endless.url, apiKey: "k" });
    const stream = sabre.streamConversation({ input: "hi" });
    const seqs: number[] = [];
    await assert.rejects(async () => {
      for await (const event of stream) seqs.push(event.seq);
    }, (error: unknown) => {
      assert.ok(error instanceof SabreEventTooLargeError, String(error));
      assert.equal(error.limit, MAX_EVENT_BYTES);
      assert.match(error.message, new RegExp(String(MAX_EVENT_BYTES)));
      return true;
    });
    assert.deepEqual(seqs, [1]);
    assert.equal(stream.resumes, 0);
    // The client hung up mid-line instead of reading (and keeping) the rest.
    assert.equal(await served, true);
  } finally {
    await close(endless.server);
  }
});
