/**
 * The TypeScript client against a live `sabre serve` with the demo scripted model (.ci/clients starts
 * one and sets SABRE_URL and SABRE_API_KEY): create, pause, resume with results, streams (resumed
 * after a dropped connection), typed errors.
 */
import assert from "node:assert/strict";
import { test } from "node:test";

import { Sabre, SabreApiError, SabreConnectionError, type EventOut } from "../src/index.js";

const baseUrl = process.env.SABRE_URL;
const apiKey = process.env.SABRE_API_KEY;
const skip = baseUrl === undefined ? "SABRE_URL is not set (run .ci/clients)" : false;

const orderTool = {
  type: "function" as const,
  name: "get_order",
  description: "Look up an order.",
  parameters: { type: "object", properties: { order_id: { type: "string" } }, required: ["order_id"] },
};

test("create, pause on an external tool, resume with results", { skip }, async () => {
  const sabre = new Sabre({ baseUrl, apiKey });
  const paused = await sabre.createConversation({ input: "tool: where is A1?", tools: [orderTool] });
  assert.equal(paused.status, "awaiting_tool_results");
  const call = paused.pending_tool_calls[0]!;
  assert.deepEqual(call.arguments, { order_id: "A1" });
  const done = await sabre.submitToolResults(paused.conversation_id, { [call.id]: { status: "shipped" } }, {
    ifMatch: paused.version,
  });
  assert.equal(done.status, "completed");
  assert.equal(done.output, "The block printed: {'status': 'shipped'}");
  // The generated types reach every operation through `api`.
  const { data } = await sabre.api.GET("/v1/conversations/{conversation_id}/messages", {
    params: { path: { conversation_id: paused.conversation_id }, query: { limit: 50 } },
  });
  const kinds = data!.data.flatMap((message) => message.parts.map((part) => part.kind));
  assert.ok(kinds.includes("tool_call") && kinds.includes("tool_result"), kinds.join(","));
});

test("a streamed turn yields its events in order and ends with the turn", { skip }, async () => {
  const sabre = new Sabre({ baseUrl, apiKey });
  const stream = sabre.streamConversation({ input: "code: add up" });
  const events: EventOut[] = [];
  for await (const event of stream) events.push(event);
  assert.equal(events[0]!.type, "turn.started");
  assert.equal(events.at(-1)!.type, "turn.completed");
  assert.ok(events.some((event) => event.type === "block.completed"));
  assert.equal(stream.turn!.output, "The block printed: 45");
});

test("a dropped stream resumes from the last event id", { skip }, async () => {
  let dropped = 0;
  // Cut the first streamed POST after two chunks, as a network would.
  const flaky: typeof fetch = async (input, init) => {
    const response = await fetch(input, init);
    if (init?.method !== "POST" || dropped > 0 || !response.headers.get("content-type")?.includes("event-stream")) {
      return response;
    }
    dropped += 1;
    const reader = response.body!.getReader();
    let chunks = 0;
    const cut = new ReadableStream<Uint8Array>({
      async pull(controller) {
        if (chunks++ >= 2) {
          await reader.cancel();
          controller.error(new TypeError("terminated: connection reset"));
          return;
        }
        const { done, value } = await reader.read();
        if (done) controller.close();
        else controller.enqueue(value);
      },
    });
    return new Response(cut, { status: response.status, headers: response.headers });
  };
  const sabre = new Sabre({ baseUrl, apiKey, fetch: flaky });
  const stream = sabre.streamConversation({ input: "slow: tell me" });
  const seqs: number[] = [];
  for await (const event of stream) seqs.push(event.seq);
  assert.equal(dropped, 1);
  assert.equal(stream.resumes, 1);
  assert.deepEqual(
    seqs,
    seqs.map((_, index) => seqs[0]! + index),
    "every event once, in order",
  );
  assert.equal(stream.turn!.status, "completed");
  assert.equal(stream.turn!.output, "This answer streams slowly, word by word.");
});

test("errors are typed and carry the problem's code", { skip }, async () => {
  const sabre = new Sabre({ baseUrl, apiKey });
  await assert.rejects(sabre.getConversation("conv_nope"), (error: unknown) => {
    assert.ok(error instanceof SabreApiError);
    assert.equal(error.status, 404);
    assert.equal(error.code, "not_found");
    return true;
  });
  const paused = await sabre.createConversation({ input: "tool: A1?", tools: [orderTool] });
  await assert.rejects(sabre.sendMessage(paused.conversation_id, "hello?"), { code: "awaiting_tool_results" });
  await assert.rejects(
    sabre.submitToolResults(paused.conversation_id, { x: 1 }, { ifMatch: paused.version + 2 }),
    (error: unknown) => error instanceof SabreApiError && error.current.version === paused.version,
  );
  await assert.rejects(sabre.submitToolResults(paused.conversation_id, { call_unknown: 1 }), (error: unknown) => {
    assert.ok(error instanceof SabreApiError);
    assert.equal(error.code, "tool_call_ids_mismatch");
    assert.deepEqual(error.expectedToolCallIds, [paused.pending_tool_calls[0]!.id]);
    return true;
  });
  await assert.rejects(new Sabre({ baseUrl, apiKey: "sk-wrong" }).getConversation("conv_x"), { status: 401 });
  await assert.rejects(
    new Sabre({ baseUrl: "http://127.0.0.1:9", apiKey }).getConversation("conv_x"),
    SabreConnectionError,
  );
});
