import { Effect, Schema } from "effect"
import { InvalidRequest, NotFound, UnsupportedInput } from "../../Domain/Errors.js"
import type {
  Capabilities,
  ResponseFormat,
  ToolCall,
  ToolChoice,
  ToolDefinition,
  UpstreamMessage,
  UpstreamPart
} from "../../Providers/Provider.js"
import type { Effort } from "../../Routing/Router.js"
import { MAX_CONTENT_BLOCKS, withinCounts } from "../Admission/CountLimits.js"
import type { CallInput } from "../Call/CallTypes.js"
import type { Conversation } from "../Call/Input.js"
import { conversationInput, pathsOf, textView, toolsOf } from "../Call/Input.js"
import { PUBLIC_MODEL, WebSearchConfig } from "../OpenAi/Api.js"
import type {
  AnthropicContentBlock,
  AnthropicCountTokensRequest,
  AnthropicMessageParam,
  AnthropicMessagesRequest
} from "./AnthropicApi.js"

type InputError = InvalidRequest | UnsupportedInput
type Block = AnthropicContentBlock

const invalid = (message: string, param: string) => Effect.fail(new InvalidRequest({ message, param }))
const unsupported = (message: string, param: string) => Effect.fail(new UnsupportedInput({ message, param }))

/** Blocks that record work Anthropic's servers did for an earlier answer, whose text follows them: dropped, as thinking is. */
const DROPPED: ReadonlySet<string> = new Set(["server_tool_use", "web_search_tool_result"])

/** The one chat upstream takes at most this many stop sequences (OpenAI's limit). */
const MAX_STOP_SEQUENCES = 4

/** Separate system and user blocks are separate pieces of text; an answer's blocks (split at citations) are one text. */
const joinText = (texts: ReadonlyArray<string>, role: "system" | "user" | "assistant") =>
  texts.join(role === "assistant" ? "" : "\n\n")

/** An image block as chat's `image_url` part: base64 becomes a `data:` URL; remote URLs are noted for inlining. */
const imagePart = (
  block: Extract<Block, { type: "image" }>,
  path: string,
  remote: Map<string, string>
): Effect.Effect<UpstreamPart, InputError> => {
  const source = block.source
  switch (source.type) {
    case "base64":
      if (source.data.length === 0) return invalid("A base64 image needs its 'data'.", `${path}.source.data`)
      return Effect.succeed({
        type: "image_url",
        image_url: { url: `data:${source.media_type};base64,${source.data}` }
      })
    case "url":
      if (!/^https:\/\//i.test(source.url)) return invalid("An image URL must be an https URL.", `${path}.source.url`)
      if (!remote.has(source.url)) remote.set(source.url, `${path}.source.url`)
      return Effect.succeed({ type: "image_url", image_url: { url: source.url } })
    case "file":
      return unsupported(
        "Images by file_id are not supported; send the image as base64 or an https URL.",
        `${path}.source`
      )
  }
}

const otherBlock = (type: string, path: string) =>
  unsupported(
    `Content blocks of type '${type}' are not supported here; text, image, tool_use and tool_result are.`,
    path
  )

/** What a tool returned, as the text of a chat `tool` message; its images go to a user message after the results. */
const toolResult = Effect.fnUntraced(function*(
  block: Extract<Block, { type: "tool_result" }>,
  path: string,
  images: Array<UpstreamPart>,
  remote: Map<string, string>
) {
  const texts: Array<string> = []
  const content = block.content ?? ""
  if (typeof content === "string") texts.push(content)
  else {
    for (const [k, part] of content.entries()) {
      const at = `${path}.content[${k}]`
      if (part.type === "text") texts.push(part.text)
      else if (part.type === "image") {
        images.push(yield* imagePart(part, at, remote))
        texts.push(`[image ${images.length} of this turn, sent with the next user message]`)
      } else return yield* otherBlock(part.block_type, at)
    }
  }
  const text = texts.join("\n\n")
  return block.is_error === true ? `The tool reported an error: ${text}` : text
})

/** The id a tool_use block gives its chat tool call: the same one, so the results that answer it match. */
const toolCall = (block: Extract<Block, { type: "tool_use" }>): ToolCall => ({
  id: block.id,
  type: "function",
  function: { name: block.name, arguments: JSON.stringify(block.input) }
})

/** An assistant turn: its text and its tool calls (thinking dropped); nothing at all when only thinking was left. */
const assistantTurn = Effect.fnUntraced(function*(blocks: ReadonlyArray<Block>, path: string, called: Set<string>) {
  const texts: Array<string> = []
  const calls: Array<ToolCall> = []
  for (const [j, block] of blocks.entries()) {
    const at = `${path}.content[${j}]`
    if (block.type === "text") texts.push(block.text)
    else if (block.type === "tool_use") {
      if (called.has(block.id)) {
        return yield* invalid(`The tool_use id '${block.id}' is used twice; ids must be unique.`, `${at}.id`)
      }
      called.add(block.id)
      calls.push(toolCall(block))
    } else if (block.type === "image" || block.type === "tool_result") {
      return yield* invalid(`An assistant turn cannot hold '${block.type}' blocks; they belong to user turns.`, at)
    } else if (block.type === "other" && !DROPPED.has(block.block_type)) {
      return yield* otherBlock(block.block_type, at)
    }
  }
  const text = joinText(texts, "assistant")
  if (calls.length > 0) {
    return [{ role: "assistant", content: text.length > 0 ? text : null, tool_calls: calls }] as const
  }
  return texts.length > 0 ? [{ role: "assistant", content: text }] as const : []
})

/**
 * A user turn: its tool results first, as chat `tool` messages (chat wants them right after the calls),
 * then what the user wrote, with any images (the results' too) as parts.
 */
const userTurn = Effect.fnUntraced(
  function*(blocks: ReadonlyArray<Block>, path: string, called: ReadonlySet<string>, remote: Map<string, string>) {
    const results: Array<UpstreamMessage> = []
    const parts: Array<UpstreamPart> = []
    const images: Array<UpstreamPart> = []
    for (const [j, block] of blocks.entries()) {
      const at = `${path}.content[${j}]`
      switch (block.type) {
        case "text":
          parts.push({ type: "text", text: block.text })
          break
        case "image":
          parts.push(yield* imagePart(block, at, remote))
          break
        case "tool_result":
          if (!called.has(block.tool_use_id)) {
            return yield* invalid(
              `No tool_use block found for the tool_result with id '${block.tool_use_id}'.`,
              `${at}.tool_use_id`
            )
          }
          results.push({
            role: "tool",
            tool_call_id: block.tool_use_id,
            content: yield* toolResult(block, at, images, remote)
          })
          break
        case "tool_use":
          return yield* invalid("A user turn cannot hold 'tool_use' blocks; they belong to assistant turns.", at)
        case "other":
          if (!DROPPED.has(block.block_type)) return yield* otherBlock(block.block_type, at)
      }
    }
    const said = [...images, ...parts]
    if (said.length === 0) return results
    const content = said.every((p) => p.type === "text")
      ? joinText(said.map((p) => p.type === "text" ? p.text : ""), "user")
      : said
    return [...results, { role: "user", content }] as const
  }
)

const turnsOf = Effect.fnUntraced(function*(
  message: AnthropicMessageParam,
  path: string,
  called: Set<string>,
  remote: Map<string, string>
): Effect.fn.Return<ReadonlyArray<UpstreamMessage>, InputError> {
  const blocks: ReadonlyArray<Block> = typeof message.content === "string"
    ? [{ type: "text", text: message.content }]
    : message.content
  if (blocks.length === 0 && message.role !== "assistant") {
    return yield* invalid("A message needs at least one content block.", `${path}.content`)
  }
  switch (message.role) {
    case "assistant":
      return yield* assistantTurn(blocks, path, called)
    case "user":
      return yield* userTurn(blocks, path, called, remote)
    case "system": {
      const texts: Array<string> = []
      for (const [j, block] of blocks.entries()) {
        if (block.type !== "text") {
          return yield* invalid("A system message holds text blocks only.", `${path}.content[${j}]`)
        }
        texts.push(block.text)
      }
      return [{ role: "system", content: joinText(texts, "system") }]
    }
  }
})

const textTurn = (role: AnthropicMessageParam["role"], content: string): UpstreamMessage =>
  role === "user"
    ? { role: "user", content }
    : role === "assistant"
    ? { role: "assistant", content }
    : { role: "system", content }

type ConversationBody = Pick<
  AnthropicCountTokensRequest,
  "messages" | "system" | "tools" | "tool_choice" | "output_config"
>

/** Custom tools as chat functions; a `web_search_*` server tool turns web search on (with its `max_uses`). */
const toolsIn = Effect.fnUntraced(function*(body: ConversationBody) {
  const functions: Array<ToolDefinition> = []
  let webSearch: { readonly maxUses: number | undefined } | undefined
  for (const [i, tool] of (body.tools ?? []).entries()) {
    if (tool.type !== "server") {
      functions.push({
        type: "function",
        // eslint-disable-next-line nenas/no-spread-adding-field -- once per tool of a call
        function: {
          name: tool.name,
          ...(typeof tool.description === "string" ? { description: tool.description } : {}),
          parameters: tool.input_schema,
          ...(typeof tool.strict === "boolean" ? { strict: tool.strict } : {})
        }
      })
    } else if (tool.tool_type.startsWith("web_search_")) {
      webSearch = { maxUses: tool.max_uses ?? undefined }
    } else {
      return yield* unsupported(
        `Tools of type '${tool.tool_type}' are not supported; custom tools (name, input_schema) and web_search are.`,
        `tools[${i}]`
      )
    }
  }
  const choice = body.tool_choice ?? undefined
  const toolChoice: ToolChoice | undefined = choice === undefined
    ? undefined
    : choice.type === "any"
    ? "required"
    : choice.type === "tool"
    ? { type: "function", function: { name: choice.name } }
    : choice.type
  const chosen = yield* toolsOf(functions, toolChoice, "tool_choice")
  const serial = choice !== undefined && "disable_parallel_tool_use" in choice &&
    choice.disable_parallel_tool_use === true
  return { chosen, parallel: functions.length > 0 && serial ? { parallelToolCalls: false } : {}, webSearch }
})

/** `output_config.format` `json_schema`, forwarded as chat's structured output. */
const formatOf = (body: ConversationBody): ResponseFormat | undefined => {
  const format = body.output_config?.format ?? undefined
  return format?.type === "json_schema" && format.schema !== undefined
    ? { type: "json_schema", json_schema: { name: "output", schema: format.schema } }
    : undefined
}

/** What the body asks beyond the conversation's text, and whether web search runs (with `max_uses`). */
export interface AnthropicConversation extends Conversation {
  readonly webSearchMaxUses: number | undefined
}

/**
 * A Messages body as the conversation `chatConversation` makes of a chat body: `system` first, each
 * turn in chat's shape (tool_use as tool calls, tool_result as tool messages, images as parts), and
 * the tools, choice and format. Used by calls and by `count_tokens`.
 */
export const anthropicConversation = Effect.fnUntraced(function*(body: ConversationBody) {
  const system = body.system ?? undefined
  const systemBlocks = system === undefined ? 0 : typeof system === "string" ? 1 : system.length
  yield* withinCounts(
    body.messages,
    body.tools,
    systemBlocks > MAX_CONTENT_BLOCKS ? "system" : "messages",
    systemBlocks
  )
  const upstream: Array<UpstreamMessage> = []
  const paths = pathsOf(upstream)
  const remoteImages = new Map<string, string>()
  const called = new Set<string>()
  if (system !== undefined) {
    const text = typeof system === "string" ? system : joinText(system.map((block) => block.text), "system")
    if (text.length > 0) upstream.push({ role: "system", content: text })
    paths.mark("system")
  }
  for (const [i, message] of body.messages.entries()) {
    // A string is one text block, which every role keeps as it is: no effect per such turn.
    if (typeof message.content === "string") upstream.push(textTurn(message.role, message.content))
    else upstream.push(...(yield* turnsOf(message, `messages[${i}]`, called, remoteImages)))
    paths.mark(`messages[${i}]`)
  }
  const tools = yield* toolsIn(body)
  const responseFormat = formatOf(body)
  const capabilities: Capabilities = {
    ...tools.chosen,
    ...tools.parallel,
    ...(responseFormat === undefined ? {} : { responseFormat })
  }
  return {
    messages: textView(upstream),
    upstream,
    paths: paths.all,
    capabilities,
    webSearchTool: tools.webSearch !== undefined,
    webSearchMaxUses: tools.webSearch?.maxUses,
    remoteImages
  } satisfies AnthropicConversation
})

/** Another model name answers 404 `not_found_error` here (chat and responses answer 400). */
export const requireAnthropicModel = (model: string) =>
  model === PUBLIC_MODEL
    ? Effect.void
    : Effect.fail(
      new NotFound({ message: `The model '${model}' does not exist; the model is '${PUBLIC_MODEL}'.`, param: "model" })
    )

const OUTPUT_EFFORTS: Readonly<Record<string, Effort>> = {
  low: "low",
  medium: "medium",
  high: "high",
  xhigh: "high",
  max: "high"
}

/**
 * The routing effort: `output_config.effort` when it names one; else thinking `enabled` or `adaptive`
 * is `high` (the reasoning model answers); else `medium` (the router reads the prompt).
 */
export const anthropicEffort = (body: Pick<AnthropicMessagesRequest, "thinking" | "output_config">): Effort => {
  const stated = body.output_config?.effort
  if (typeof stated === "string" && stated in OUTPUT_EFFORTS) return OUTPUT_EFFORTS[stated] ?? "medium"
  const thinking = body.thinking?.type
  return thinking === "enabled" || thinking === "adaptive" ? "high" : "medium"
}

const WEB_SEARCH_DEFAULTS = Schema.decodeSync(WebSearchConfig)({})

/** A Messages call as the model calls take it; `endpoint` is `/v1/messages`, which `CallTypes.Endpoint` must name. */
export type AnthropicCallInput = Omit<CallInput, "endpoint"> & { readonly endpoint: "/v1/messages" }

/** The whole call: the model checked, the conversation, and the rest of the fields of a `CallInput`. */
export const anthropicCallInput = Effect.fnUntraced(function*(body: AnthropicMessagesRequest) {
  yield* requireAnthropicModel(body.model)
  const conversation = yield* anthropicConversation(body)
  const stop = body.stop_sequences ?? undefined
  if (stop !== undefined && stop.length > MAX_STOP_SEQUENCES) {
    return yield* invalid(`At most ${MAX_STOP_SEQUENCES} stop_sequences are supported.`, "stop_sequences")
  }
  const userId = body.metadata?.user_id ?? undefined
  const maxUses = conversation.webSearchMaxUses
  // eslint-disable-next-line nenas/no-spread-adding-field -- once per call, not per chunk
  return {
    endpoint: "/v1/messages",
    ...conversationInput(conversation),
    effort: anthropicEffort(body),
    maxOutputTokens: body.max_tokens,
    maxTotalCostMyr: body.max_total_cost_myr,
    webSearch: conversation.webSearchTool
      ? { ...WEB_SEARCH_DEFAULTS, mode: "on", ...(maxUses === undefined ? {} : { max_searches: Math.min(maxUses, 5) }) }
      : undefined,
    temperature: body.temperature,
    topP: body.top_p,
    stop: stop === undefined || stop.length === 0 ? undefined : stop,
    user: userId,
    metadata: userId === undefined ? undefined : { user_id: userId },
    stream: body.stream,
    inputParam: "messages"
  } satisfies AnthropicCallInput
})
