import { Effect } from "effect"
import { InvalidRequest } from "../../Domain/Errors.js"

type Json = { readonly [key: string]: unknown }

const isRecord = (value: unknown): value is Json => typeof value === "object" && value !== null && !Array.isArray(value)

const invalid = (message: string, param: string) => Effect.fail(new InvalidRequest({ message, param }))

/**
 * Count limits (docs/security.md, "Bounded work per request"), far above what real clients send (OpenAI takes
 * 128 tools; a long agent session holds a few thousand turns), so that no body of many tiny items
 * costs more to read than its size allows.
 */
export const MAX_MESSAGES = 10_000
export const MAX_CONTENT_BLOCKS = 20_000
export const MAX_TOOLS = 512

/** A content's blocks: a string is one, a list its items, with a tool result's own blocks and a turn's tool calls. */
const blocksOf = (item: unknown): number => {
  if (!isRecord(item)) return 0
  const content = item["content"] ?? item["output"]
  let blocks = typeof content === "string" ? 1 : 0
  if (Array.isArray(content)) {
    blocks += content.length
    for (const block of content) {
      if (isRecord(block) && Array.isArray(block["content"])) blocks += block["content"].length
    }
  }
  return Array.isArray(item["tool_calls"]) ? blocks + item["tool_calls"].length : blocks
}

/** Refused before any of it is read: more messages, content blocks or tools than one request may hold. */
export const withinCounts = (
  items: unknown,
  tools: unknown,
  param: string,
  blocksBefore = 0
): Effect.Effect<void, InvalidRequest> => {
  const list: ReadonlyArray<unknown> = Array.isArray(items) ? items : []
  if (list.length > MAX_MESSAGES) {
    return invalid(`At most ${MAX_MESSAGES} messages are accepted in one request; this one has ${list.length}.`, param)
  }
  if (Array.isArray(tools) && tools.length > MAX_TOOLS) {
    return invalid(`At most ${MAX_TOOLS} tools are accepted in one request; this one has ${tools.length}.`, "tools")
  }
  let blocks = blocksBefore
  for (const item of list) blocks += blocksOf(item)
  return blocks > MAX_CONTENT_BLOCKS
    ? invalid(
      `At most ${MAX_CONTENT_BLOCKS} content blocks are accepted in one request; this one has ${blocks}.`,
      param
    )
    : Effect.void
}
