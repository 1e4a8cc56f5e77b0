/**
 * SABRE's TypeScript client: `paths`/`components` generated from openapi/openapi.json by
 * openapi-typescript (src/schema.d.ts, `npm run generate`), calls made by openapi-fetch, plus what a
 * generator cannot write: typed errors carrying the problem's `code`, and a turn's events over SSE
 * resumed from the last event id when the connection drops.
 */
import createClient, { type Client } from "openapi-fetch";
import { EventSourceParserStream } from "eventsource-parser/stream";

import type { components, operations, paths } from "./schema.js";

export type { components, operations, paths };
export type Schemas = components["schemas"];
export type Problem = Schemas["Problem"];
export type TurnOut = Schemas["TurnOut"];
export type EventOut = Schemas["EventOut"];
export type ConversationOut = Schemas["ConversationOut"];
export type CreateConversation = Schemas["CreateConversation"];
export type ToolResults = Schemas["ToolResults"];

/** The events that end a turn; their `data` is the turn. */
export const END_TYPES: ReadonlySet<string> = new Set([
  "turn.completed",
  "turn.awaiting_tool_results",
  "turn.failed",
  "turn.cancelled",
]);

/** The server answered with an error (RFC 9457 problem+json); `code` is stable, for programs. */
export class SabreApiError extends Error {
  readonly status: number;
  readonly code: string;
  readonly detail: string;
  readonly problem: Partial<Problem>;

  constructor(status: number, body: unknown) {
    const problem: Partial<Problem> = typeof body === "object" && body !== null ? (body as Partial<Problem>) : {};
    const code = problem.code ?? `http_${status}`;
    super(`${status} ${code}: ${problem.detail ?? problem.title ?? ""}`);
    this.name = "SabreApiError";
    this.status = status;
    this.code = code;
    this.detail = problem.detail ?? "";
    this.problem = problem;
  }

  /** `current` of the problem (the conversation's version on a 412, the running turn on a 409). */
  get current(): Record<string, unknown> {
    return (this.problem.current as Record<string, unknown> | null | undefined) ?? {};
  }

  get expectedToolCallIds(): string[] {
    return this.problem.expected_tool_call_ids ?? [];
  }
}

/** The server could not be reached, or a stream broke and could not be resumed. */
export class SabreConnectionError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "SabreConnectionError";
  }
}

/** The server answered with a redirect (3xx), which the client never follows: following it would send
 * the API key, and replay a POST's body (307/308), to wherever it points (another path, port or scheme
 * of the same host keeps the `Authorization` header). */
export class SabreRedirectError extends Error {
  readonly status: number;
  readonly location: string;

  constructor(status: number, location: string, url: string) {
    super(
      `${url} answered ${status}, a redirect to ${location || "(no location)"}: redirects are not followed` +
        " (point baseUrl at the server itself)",
    );
    this.name = "SabreRedirectError";
    this.status = status;
    this.location = location;
  }
}

/** The most one event of a stream may hold (its lines as sent): past it the stream fails with
 * `SabreEventTooLargeError` instead of buffering whatever a broken or hostile server keeps sending. */
export const MAX_EVENT_BYTES = 16 * 1024 * 1024;

/** One event of a stream passed `limit` bytes (`MAX_EVENT_BYTES`): the stream stops there and is not
 * resumed (the server would send the same event again). */
export class SabreEventTooLargeError extends Error {
  readonly limit: number;

  constructor(limit: number) {
    super(`an event of the stream passed ${limit} bytes; the stream was dropped`);
    this.name = "SabreEventTooLargeError";
    this.limit = limit;
  }
}

export interface SabreOptions {
  /** Default: the local server, http://127.0.0.1:8011. */
  baseUrl?: string;
  /** Sent as `Authorization: Bearer <key>`; none for a local server in open mode. */
  apiKey?: string;
  fetch?: typeof globalThis.fetch;
  /** How many times a broken event stream is resumed before giving up (default 5). */
  maxResumes?: number;
}

interface Answer<T> {
  data?: T;
  error?: unknown;
  response: Response;
}

/** The body of a successful answer of an openapi-fetch call; a `SabreApiError` for an error answer,
 * a `SabreConnectionError` when the server cannot be reached. */
export async function unwrap<T>(call: Promise<Answer<T>>): Promise<T> {
  let answer: Answer<T>;
  try {
    answer = await call;
  } catch (cause) {
    if (cause instanceof SabreRedirectError) throw cause;
    throw new SabreConnectionError(`cannot reach the server: ${String(cause)}`, { cause });
  }
  if (!answer.response.ok || answer.error !== undefined) {
    throw new SabreApiError(answer.response.status, answer.error);
  }
  return answer.data as T;
}

/** A turn's events as they happen; `turn` is set once its end event has been read. */
export class TurnStream implements AsyncIterable<EventOut> {
  turn: TurnOut | undefined;
  resumes = 0;
  lastEventId: string | undefined;
  conversationId: string | undefined;
  turnId: string | undefined;
  private readonly seen = new Set<number>();

  constructor(
    private readonly sabre: Sabre,
    private readonly first: { method: "GET" | "POST"; path: string; body?: unknown; headers?: Record<string, string> },
  ) {}

  async *[Symbol.asyncIterator](): AsyncIterator<EventOut> {
    let request = this.first;
    let attempt = 0;
    for (;;) {
      let response: Response | undefined;
      try {
        response = await this.sabre.fetchRaw(request.method, request.path, {
          body: request.body,
          headers: { Accept: "text/event-stream", ...request.headers },
        });
        if (!response.ok) {
          throw new SabreApiError(response.status, await response.json().catch(() => ({})));
        }
        if (this.conversationId === undefined) {
          const parts = (response.headers.get("location") ?? "").split("/").filter(Boolean);
          if (parts.length >= 5 && parts.at(-4) === "conversations" && parts.at(-2) === "turns") {
            this.conversationId = parts.at(-3);
            this.turnId = parts.at(-1);
          }
        }
        const reader = response
          .body!.pipeThrough(eventSizeLimit(MAX_EVENT_BYTES))
          .pipeThrough(new TextDecoderStream())
          .pipeThrough(new EventSourceParserStream())
          .getReader();
        for (;;) {
          const { done, value: message } = await reader.read();
          if (done) break;
          if (!message.data) continue;
          const event = JSON.parse(message.data) as EventOut;
          if (this.turnId !== undefined && event.turn_id !== this.turnId) continue;
          if (this.seen.has(event.seq)) continue;
          this.seen.add(event.seq);
          this.turnId = event.turn_id;
          this.lastEventId = message.id ?? String(event.seq);
          attempt = 0;
          if (END_TYPES.has(event.type)) this.turn = event.data as unknown as TurnOut;
          yield event;
          if (this.turn !== undefined) return;
        }
      } catch (error) {
        const final = error instanceof SabreApiError || error instanceof SabreRedirectError;
        if (final || error instanceof SabreEventTooLargeError) throw error;
        if (this.conversationId === undefined) {
          throw new SabreConnectionError(`cannot reach the server: ${String(error)}`, { cause: error });
        }
      }
      if (this.turn !== undefined) return;
      // Broke (or ended) before the end event: go on from the last event received.
      if (attempt >= this.sabre.maxResumes) {
        throw new SabreConnectionError(`the event stream broke ${attempt + 1} times (last event ${this.lastEventId})`);
      }
      await new Promise((resolve) => setTimeout(resolve, Math.min(200 * 2 ** attempt, 3000)));
      attempt += 1;
      this.resumes += 1;
      request = {
        method: "GET",
        path: `/v1/conversations/${this.conversationId}/events`,
        headers: this.lastEventId === undefined ? {} : { "Last-Event-ID": this.lastEventId },
      };
    }
  }

  /** Read the stream to its end; the ended turn. */
  async untilDone(): Promise<TurnOut> {
    for await (const _ of this) {
      // drain
    }
    if (this.turn === undefined) throw new SabreConnectionError("the stream ended without the turn's end event");
    return this.turn;
  }
}

/** A client: `api` is the typed openapi-fetch client of every operation; the methods cover the turn
 * flow with typed errors and streaming. */
export class Sabre {
  readonly api: Client<paths>;
  readonly baseUrl: string;
  readonly maxResumes: number;
  private readonly headers: Record<string, string>;
  private readonly fetchImpl: typeof globalThis.fetch;

  constructor(options: SabreOptions = {}) {
    this.baseUrl = (options.baseUrl ?? "http://127.0.0.1:8011").replace(/\/+$/, "");
    this.headers = options.apiKey ? { Authorization: `Bearer ${options.apiKey}` } : {};
    this.fetchImpl = refusingRedirects(options.fetch ?? globalThis.fetch);
    this.maxResumes = options.maxResumes ?? 5;
    this.api = createClient<paths>({ baseUrl: this.baseUrl, headers: this.headers, fetch: this.fetchImpl });
  }

  /** A raw request on the same base URL and key (what the streams use). */
  fetchRaw(
    method: string,
    path: string,
    init: { body?: unknown; headers?: Record<string, string> } = {},
  ): Promise<Response> {
    const headers: Record<string, string> = { ...this.headers, ...init.headers };
    if (init.body !== undefined) headers["Content-Type"] = "application/json";
    return this.fetchImpl(`${this.baseUrl}${path}`, {
      method,
      headers,
      body: init.body === undefined ? undefined : JSON.stringify(init.body),
    });
  }

  /** Start a conversation and wait for its first turn. */
  createConversation(body: CreateConversation): Promise<TurnOut> {
    return asTurn(unwrap(this.api.POST("/v1/conversations", { body })));
  }

  /** Send the next message and wait for the turn. */
  sendMessage(conversationId: string, input: string, options: { ifMatch?: number } = {}): Promise<TurnOut> {
    return asTurn(unwrap(
      this.api.POST("/v1/conversations/{conversation_id}/messages", {
        params: { path: { conversation_id: conversationId }, header: ifMatchHeader(options.ifMatch) },
        body: { input },
      }),
    ));
  }

  /** Answer the pending tool calls (`{callId: output}` or result objects) and wait for the turn. */
  submitToolResults(
    conversationId: string,
    results: Record<string, unknown> | ToolResults["results"],
    options: { ifMatch?: number } = {},
  ): Promise<TurnOut> {
    return asTurn(unwrap(
      this.api.POST("/v1/conversations/{conversation_id}/tool-results", {
        params: { path: { conversation_id: conversationId }, header: ifMatchHeader(options.ifMatch) },
        body: { results: asResults(results) },
      }),
    ));
  }

  getConversation(conversationId: string): Promise<ConversationOut> {
    return unwrap(
      this.api.GET("/v1/conversations/{conversation_id}", { params: { path: { conversation_id: conversationId } } }),
    );
  }

  /** Start a conversation; its first turn's events as they happen. */
  streamConversation(body: CreateConversation): TurnStream {
    return new TurnStream(this, { method: "POST", path: "/v1/conversations", body: { ...body, stream: true } });
  }

  /** Send the next message; the turn's events as they happen. */
  streamMessage(conversationId: string, input: string): TurnStream {
    return new TurnStream(this, {
      method: "POST",
      path: `/v1/conversations/${encodeURIComponent(conversationId)}/messages`,
      body: { input, stream: true },
    });
  }

  /** Answer the pending tool calls; the resumed turn's events as they happen. */
  streamToolResults(conversationId: string, results: Record<string, unknown> | ToolResults["results"]): TurnStream {
    return new TurnStream(this, {
      method: "POST",
      path: `/v1/conversations/${encodeURIComponent(conversationId)}/tool-results`,
      body: { results: asResults(results), stream: true },
    });
  }
}

/** `fetch` for every request of the client (openapi-fetch's and the streams'): a redirect is not followed
 * (`redirect: "manual"`) but thrown as a `SabreRedirectError`, its body left unread. */
function refusingRedirects(fetchImpl: typeof globalThis.fetch): typeof globalThis.fetch {
  return async (input, init) => {
    const response = await fetchImpl(input, { ...init, redirect: "manual" });
    const redirected = response.status >= 300 && response.status < 400 && response.status !== 304;
    if (redirected || response.type === "opaqueredirect") {
      await response.body?.cancel();
      const url = typeof input === "string" ? input : input instanceof URL ? input.href : input.url;
      throw new SabreRedirectError(response.status, response.headers.get("location") ?? "", url);
    }
    return response;
  };
}

const CR = 0x0d;
const LF = 0x0a;

/** Passes an event stream's bytes on, counting each event's (its lines, each ending counted once) as
 * they arrive, and fails with `SabreEventTooLargeError` once one passes `limit`: the parser after it
 * (which buffers a line however long it grows) holds at most `limit` and one chunk. An empty line ends
 * an event; CR, LF and CRLF end a line (a CR and LF never occur inside a UTF-8 character). */
function eventSizeLimit(limit: number): TransformStream<Uint8Array<ArrayBuffer>, Uint8Array<ArrayBuffer>> {
  let size = 0;
  let lineEmpty = true;
  let afterCR = false;
  return new TransformStream({
    transform(chunk, controller) {
      for (const byte of chunk) {
        if (byte === LF && afterCR) {
          afterCR = false;
          continue;
        }
        afterCR = byte === CR;
        if (byte === CR || byte === LF) {
          size = lineEmpty ? 0 : size + 1;
          lineEmpty = true;
          continue;
        }
        lineEmpty = false;
        size += 1;
        if (size > limit) {
          controller.error(new SabreEventTooLargeError(limit));
          return;
        }
      }
      controller.enqueue(chunk);
    },
  });
}

/** The turn-starting POSTs answer JSON unless asked to stream (which these calls never do). */
function asTurn(answer: Promise<unknown>): Promise<TurnOut> {
  return answer as Promise<TurnOut>;
}

function ifMatchHeader(version: number | undefined): { "If-Match"?: string } {
  return version === undefined ? {} : { "If-Match": `"${version}"` };
}

function asResults(results: Record<string, unknown> | ToolResults["results"]): ToolResults["results"] {
  if (Array.isArray(results)) return results;
  return Object.entries(results).map(([tool_call_id, output]) => ({ tool_call_id, output }));
}
