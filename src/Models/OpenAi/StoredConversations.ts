import { Context, Duration, Effect, Layer } from "effect"
import { InvalidRequest, NotFound } from "../../Domain/Errors.js"
import type { BeyondBounds, Json, StoredResponse, StoredWrite } from "../../Responses/Store.js"
import {
  MAX_CHAIN_BYTES,
  MAX_CHAIN_RESPONSES,
  packRecord,
  responseIdOf,
  retentionMs,
  StoredResponses
} from "../../Responses/Store.js"
import { Spending } from "../../Wallet/Spending.js"
import type { ResponsesBody } from "./Api.js"

/**
 * Conversation state as OpenAI's Responses API keeps it
 * (docs/api/models.md, "Stored responses"): what a call stores, and how a later
 * call finds it again — `previous_response_id`, `item_reference` items, and the
 * stored-response endpoints. Rows are written by the settlement flush; a read
 * first writes this instance's queue, and looks again a few times, further
 * apart each time, for a row another instance has yet to flush (its flush runs
 * every 20 ms), so a response reads back at once through any instance. Every
 * read here runs after the call was admitted (its key's rate limit taken).
 */

/** What a call keeps when it stores its response: its own input items (references resolved, ids given). */
export interface StoreRequest {
  readonly input: ReadonlyArray<Json>
  readonly instructions: string | null
  readonly previousResponseId: string | null
}

/** When a read looks again for a row not flushed yet: a handful of queries over about 0.4 s, never a poll. */
const READ_RETRIES = [25, 50, 100, 200].map(Duration.millis)
/** The most `item_reference` items a call may send (docs/api/models.md, "Stored responses"). */
export const MAX_ITEM_REFERENCES = 100

/** Our response ids: `resp_` and a request id's 24 characters. Only these are waited for. */
const RESPONSE_ID = /^resp_[0-9A-Za-z]{24}$/
/** Our item ids carry their response's 24 characters: `msg_X`, `fc_X_0`, `msg_X_2`, `fco_X_1`. */
const ITEM_ID = /^[a-z]+_([0-9A-Za-z]{24})(?:_[0-9A-Za-z]+)?$/

/** The response an item id of ours belongs to. */
export const responseOfItem = (itemId: string): string | undefined => {
  const match = ITEM_ID.exec(itemId)
  return match?.[1] === undefined ? undefined : `resp_${match[1]}`
}

const suffixOf = (requestId: string) => requestId.replace(/^req_/, "")

const isRecord = (value: unknown): value is Json => typeof value === "object" && value !== null && !Array.isArray(value)

/** A caller's input item as it is stored: with an id of ours, a message's text as OpenAI lists it (parts). */
const storedItem = (item: Json, requestId: string, index: number): Json => {
  const suffix = suffixOf(requestId)
  switch (item["type"] ?? "message") {
    case "message": {
      const content = item["content"]
      const textType = item["role"] === "assistant" ? "output_text" : "input_text"
      return {
        ...item,
        type: "message",
        id: `msg_${suffix}_${index}`,
        content: typeof content === "string" ? [{ type: textType, text: content }] : content
      }
    }
    case "function_call":
      return { ...item, id: `fc_${suffix}_in${index}` }
    case "function_call_output":
      return { ...item, id: `fco_${suffix}_${index}` }
    default:
      return { ...item, id: `item_${suffix}_${index}` }
  }
}

/** The items a stored response contributes to a conversation: its input, then its output. */
const itemsOf = (stored: StoredResponse): ReadonlyArray<Json> => {
  const output = stored.response["output"]
  return [...stored.input, ...(Array.isArray(output) ? output.filter(isRecord) : [])]
}

/** The stored row a turn writes with its settlement, the answer as the caller got it; a test key's is kept 24 hours. */
export const storedWrite = (
  store: StoreRequest,
  call: {
    readonly requestId: string
    readonly accountId: string
    readonly apiKeyId: string
    readonly environment: "live" | "test"
    readonly startedAt: number
  },
  response: Json,
  quotaBytes: number
): Effect.Effect<StoredWrite> =>
  Effect.map(packRecord({ response, input: store.input, instructions: store.instructions }), ({ body, bytes }) => ({
    id: responseIdOf(call.requestId),
    accountId: call.accountId,
    apiKeyId: call.apiKeyId,
    previousResponseId: store.previousResponseId,
    body,
    bytes,
    quotaBytes,
    createdAt: new Date(call.startedAt),
    expiresAt: new Date(call.startedAt + retentionMs(call.environment))
  }))

/** A stored response as `GET /v1/responses/{id}` answers it. */
export const renderStored = (stored: StoredResponse) => ({
  ...stored.response,
  instructions: stored.instructions,
  previous_response_id: stored.previousResponseId,
  store: true
})

export interface InputItemsQuery {
  readonly after?: string | undefined
  readonly limit: number
  readonly order: "asc" | "desc"
}

/** A response's input items, paged as OpenAI pages them (`after` an item id, in `order`). */
export const inputItemsPage = (stored: StoredResponse, query: InputItemsQuery) => {
  const ordered = query.order === "asc" ? [...stored.input] : [...stored.input].reverse()
  // After an id the response does not have: nothing (an empty last page).
  const start = query.after === undefined
    ? 0
    : ordered.findIndex((item) => item["id"] === query.after) + 1 || ordered.length
  const data = ordered.slice(start, start + query.limit)
  const idOf = (item: Json | undefined) => typeof item?.["id"] === "string" ? item["id"] : null
  return {
    object: "list" as const,
    data,
    first_id: idOf(data[0]),
    last_id: idOf(data[data.length - 1]),
    has_more: start + data.length < ordered.length
  }
}

/** The caller's conversation: the stored history before the input, the input with references resolved. */
export interface ConversationState {
  readonly history: ReadonlyArray<Json>
  readonly input: string | ReadonlyArray<Json>
  /** The input as stored (ids given), when the call stores. */
  readonly store: StoreRequest | undefined
}

const notFound = (id: string, param: string) =>
  new NotFound({ message: `No response with id '${id}' found for this account.`, param })

/** OpenAI's answer to a `previous_response_id` it does not have: a 400 naming the param. */
const unknownPrevious = (id: string) =>
  new InvalidRequest({ message: `Previous response with id '${id}' not found.`, param: "previous_response_id" })

const tooLong = (error: BeyondBounds) =>
  new InvalidRequest({
    message: error.limit === "responses"
      ? `This conversation is longer than ${MAX_CHAIN_RESPONSES} responses, the most previous_response_id may continue; ` +
        "start a new one, sending what matters as input."
      : `This conversation's stored responses (instructions included) exceed ${MAX_CHAIN_BYTES / 1024 / 1024} MiB, ` +
        "the most previous_response_id may continue; start a new one, sending what matters as input.",
    param: "previous_response_id"
  })

export class StoredConversations extends Context.Tag("nenas/StoredConversations")<StoredConversations, {
  /** The account's stored response, read through any instance at once after it was answered. */
  readonly own: (accountId: string, id: string, param?: string) => Effect.Effect<StoredResponse, NotFound>
  /** Deletes the account's stored response. */
  readonly remove: (accountId: string, id: string) => Effect.Effect<void, NotFound>
  /** A `/v1/responses` body's history and input, from `previous_response_id` and `item_reference` items. */
  readonly resolve: (
    accountId: string,
    requestId: string,
    body: ResponsesBody
  ) => Effect.Effect<ConversationState, InvalidRequest>
}>() {
  static readonly layer = Layer.effect(
    StoredConversations,
    Effect.gen(function*() {
      const store = yield* StoredResponses
      const spending = yield* Spending

      /**
       * Which of `ids` the account has. Usually all are written already (a flush runs every 20 ms); an id of ours
       * that is not is looked for again after this instance's flush, then at `READ_RETRIES`: a handful of queries.
       */
      const visible = Effect.fnUntraced(function*(accountId: string, ids: ReadonlyArray<string>) {
        const missing = (found: ReadonlySet<string>) => ids.some((id) => RESPONSE_ID.test(id) && !found.has(id))
        let found = yield* store.present(accountId, ids)
        if (!missing(found)) return found
        yield* spending.settled
        found = yield* store.present(accountId, ids)
        for (const delay of READ_RETRIES) {
          if (!missing(found)) return found
          yield* Effect.sleep(delay)
          found = yield* store.present(accountId, ids)
        }
        return found
      })

      /** A stored response is one record: within the bounds by construction, so going past them is a defect. */
      const own = Effect.fnUntraced(function*(accountId: string, id: string, param = "response_id") {
        if (!(yield* visible(accountId, [id])).has(id)) return yield* notFound(id, param)
        const rows = yield* Effect.orDie(store.find(accountId, [id]))
        const row = rows.find((r) => r.id === id)
        return row === undefined ? yield* notFound(id, param) : row
      })

      const remove = (accountId: string, id: string) =>
        Effect.flatMap(
          own(accountId, id),
          () =>
            Effect.flatMap(store.remove(accountId, id), (removed) =>
              removed ? Effect.void : Effect.fail(notFound(id, "response_id")))
        )

      /** Each `item_reference` replaced by the stored item it names (of this account); an unknown id is refused by name. */
      const dereference = Effect.fnUntraced(function*(accountId: string, input: ReadonlyArray<Json>) {
        const wanted = input.flatMap((item) =>
          item["type"] === "item_reference" && typeof item["id"] === "string" ? [item["id"]] : []
        )
        if (wanted.length === 0) return input
        if (wanted.length > MAX_ITEM_REFERENCES) {
          return yield* new InvalidRequest({
            message:
              `At most ${MAX_ITEM_REFERENCES} item_reference items may be sent a call; this input has ${wanted.length}.`,
            param: "input"
          })
        }
        const responses = [...new Set(wanted.flatMap((id) => responseOfItem(id) ?? []))]
        const present = [...yield* visible(accountId, responses)]
        const rows = yield* store.find(accountId, present).pipe(
          Effect.catchTags({
            BeyondBounds: () =>
              new InvalidRequest({
                message: `The responses these item references name exceed ${
                  MAX_CHAIN_BYTES / 1024 / 1024
                } MiB together; send fewer.`,
                param: "input"
              })
          })
        )
        const items = new Map(rows.flatMap((row) => itemsOf(row)).map((item) => [item["id"], item]))
        return yield* Effect.forEach(input, (item, i) => {
          if (item["type"] !== "item_reference") return Effect.succeed(item)
          const id = item["id"]
          const found = typeof id === "string" ? items.get(id) : undefined
          return found !== undefined ? Effect.succeed(found) : Effect.fail(
            new InvalidRequest({ message: `Item with id '${String(id)}' not found.`, param: `input[${i}]` })
          )
        })
      })

      /** The conversation before `previous`: read whole within the bounds, refused (400) past them or when unknown. */
      const history = Effect.fnUntraced(function*(accountId: string, previous: string) {
        if (!(yield* visible(accountId, [previous])).has(previous)) return yield* unknownPrevious(previous)
        const chain = yield* store.chain(accountId, previous, true).pipe(
          Effect.catchTag("BeyondBounds", (error) => Effect.fail(tooLong(error)))
        )
        // Deleted (or expired) between the two reads.
        if (chain.length === 0) return yield* unknownPrevious(previous)
        return chain.flatMap(itemsOf)
      })

      const resolve = Effect.fnUntraced(function*(accountId: string, requestId: string, body: ResponsesBody) {
        const previous = body.previous_response_id ?? undefined
        const past = previous === undefined ? [] : yield* history(accountId, previous)
        const input = typeof body.input === "string" ? body.input : yield* dereference(accountId, body.input)
        const ownItems = typeof input === "string" ? [{ type: "message", role: "user", content: input }] : input
        return {
          history: past,
          input,
          store: body.store === false ? undefined : {
            input: ownItems.map((item, i) => storedItem(item, requestId, i)),
            instructions: body.instructions ?? null,
            previousResponseId: previous ?? null
          }
        } satisfies ConversationState
      })

      return StoredConversations.of({ own, remove, resolve })
    })
  )
}
