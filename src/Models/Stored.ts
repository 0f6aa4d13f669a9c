import { Clock, Context, Duration, Effect, Layer } from "effect"
import { InvalidRequest, NotFound } from "../Domain/Errors.js"
import type { Json, StoredResponse, StoredWrite } from "../Responses/Store.js"
import { packRecord, responseIdOf, RETENTION_MS, StoredResponses } from "../Responses/Store.js"
import { Spending } from "../Wallet/Spending.js"
import type { ResponsesBody } from "./Api.js"

/**
 * Conversation state as OpenAI's Responses API keeps it (DESIGN.md, Stored
 * responses): what a call stores, and how a later call finds it again —
 * `previous_response_id`, `item_reference` items, and the stored-response
 * endpoints. Rows are written by the settlement flush; a read first writes
 * this instance's queue, and waits briefly for a row another instance has yet
 * to flush (its flush runs every 20 ms), so a response reads back at once
 * through any instance.
 */

/** What a call keeps when it stores its response: its own input items (references resolved, ids given). */
export interface StoreRequest {
  readonly input: ReadonlyArray<Json>
  readonly instructions: string | null
  readonly previousResponseId: string | null
}

/** How long a read waits for a row not flushed yet, and how often it looks. */
const READ_WAIT = Duration.millis(1000)
const READ_POLL = Duration.millis(10)

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

/** The stored row a turn writes with its settlement, the answer as the caller got it. */
export const storedWrite = (
  store: StoreRequest,
  call: { readonly requestId: string; readonly accountId: string; readonly apiKeyId: string; readonly startedAt: number },
  response: Json
): StoredWrite => ({
  id: responseIdOf(call.requestId),
  accountId: call.accountId,
  apiKeyId: call.apiKeyId,
  previousResponseId: store.previousResponseId,
  body: packRecord({ response, input: store.input, instructions: store.instructions }),
  createdAt: new Date(call.startedAt),
  expiresAt: new Date(call.startedAt + RETENTION_MS)
})

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
  const start = query.after === undefined ? 0 : ordered.findIndex((item) => item["id"] === query.after) + 1 || ordered.length
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
  ) => Effect.Effect<ConversationState, NotFound | InvalidRequest>
}>() {
  static readonly layer = Layer.effect(
    StoredConversations,
    Effect.gen(function*() {
      const store = yield* StoredResponses
      const spending = yield* Spending

      /**
       * The rows among `ids`. Usually all are written already (a flush runs every 20 ms); an id of ours that is
       * not is looked for again after this instance's flush, then every `READ_POLL` until `READ_WAIT` has passed.
       */
      const visible = (ids: ReadonlyArray<string>) =>
        Effect.gen(function*() {
          const missing = (found: ReadonlyArray<StoredResponse>) =>
            ids.some((id) => RESPONSE_ID.test(id) && !found.some((row) => row.id === id))
          let found = yield* store.find(ids)
          if (!missing(found)) return found
          yield* spending.settled
          const deadline = (yield* Clock.currentTimeMillis) + Duration.toMillis(READ_WAIT)
          found = yield* store.find(ids)
          while (missing(found) && (yield* Clock.currentTimeMillis) < deadline) {
            yield* Effect.sleep(READ_POLL)
            found = yield* store.find(ids)
          }
          return found
        }).pipe(Effect.orDie)

      const own = (accountId: string, id: string, param = "response_id") =>
        Effect.flatMap(visible([id]), (rows) => {
          const row = rows.find((r) => r.id === id && r.accountId === accountId)
          return row === undefined ? Effect.fail(notFound(id, param)) : Effect.succeed(row)
        })

      const remove = (accountId: string, id: string) =>
        Effect.flatMap(own(accountId, id), () =>
          Effect.flatMap(Effect.orDie(store.remove(accountId, id)), (removed) =>
            removed ? Effect.void : Effect.fail(notFound(id, "response_id"))))

      /** Each `item_reference` replaced by the stored item it names (of this account); an unknown id is refused by name. */
      const dereference = (accountId: string, input: ReadonlyArray<Json>) =>
        Effect.gen(function*() {
          const wanted = input.flatMap((item) =>
            item["type"] === "item_reference" && typeof item["id"] === "string" ? [item["id"]] : []
          )
          if (wanted.length === 0) return input
          const responses = [...new Set(wanted.flatMap((id) => responseOfItem(id) ?? []))]
          const rows = (yield* visible(responses)).filter((row) => row.accountId === accountId)
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

      const resolve = (accountId: string, requestId: string, body: ResponsesBody) =>
        Effect.gen(function*() {
          const previous = body.previous_response_id ?? undefined
          let history: ReadonlyArray<Json> = []
          if (previous !== undefined) {
            yield* own(accountId, previous, "previous_response_id")
            history = (yield* Effect.orDie(store.chain(accountId, previous))).flatMap(itemsOf)
          }
          const input = typeof body.input === "string" ? body.input : yield* dereference(accountId, body.input)
          const ownItems = typeof input === "string" ? [{ type: "message", role: "user", content: input }] : input
          return {
            history,
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
