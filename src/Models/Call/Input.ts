import { Effect } from "effect"
import { InvalidRequest, NotImplemented, UnsupportedInput } from "../../Domain/Errors.js"
import type { Message } from "../../Domain/Tokens.js"
import type {
  Capabilities,
  ResponseFormat,
  ToolCall,
  ToolChoice,
  ToolDefinition,
  UpstreamMessage,
  UpstreamPart
} from "../../Providers/Provider.js"
import { withinCounts } from "../Admission/CountLimits.js"
import type { ChatCompletionRequest, InputItem, ResponsesBody } from "../OpenAi/Api.js"
import { CHAT_NOT_IMPLEMENTED, RESPONSES_NOT_IMPLEMENTED } from "../OpenAi/Api.js"

/**
 * A request's conversation in the upstream's chat shape (images and tool turns
 * forwarded as they came), its plain-text view for routing and search, and the
 * capabilities it asked for.
 */
export interface Conversation {
  readonly messages: ReadonlyArray<Message>
  readonly upstream: ReadonlyArray<UpstreamMessage>
  /** The field each message of `upstream` came from (`messages[2]`, `instructions`): what a guardrail's refusal names. */
  readonly paths: ReadonlyArray<string>
  readonly capabilities: Capabilities
  /** A Responses `web_search` tool: web search runs (`mode: on`). */
  readonly webSearchTool: boolean
  /** Each remote image URL, with the param of its first use (for `UPSTREAM_IMAGE_URLS=inline`). */
  readonly remoteImages: ReadonlyMap<string, string>
}

/** What a call's input takes from its conversation, whichever endpoint parsed it. */
export const conversationInput = (
  conversation: Pick<Conversation, "messages" | "upstream" | "paths" | "remoteImages" | "capabilities">
) => ({
  messages: conversation.messages,
  upstream: conversation.upstream,
  paths: conversation.paths,
  remoteImages: conversation.remoteImages,
  capabilities: conversation.capabilities
})

/** Remote image URLs met while parsing, each with the param of its first use; `false` where images are refused. */
type ImageSink = Map<string, string> | false

type InputError = UnsupportedInput | InvalidRequest
type Json = { readonly [key: string]: unknown }

const isRecord = (value: unknown): value is Json => typeof value === "object" && value !== null && !Array.isArray(value)

const invalid = (message: string, param: string) => Effect.fail(new InvalidRequest({ message, param }))

const TEXT_PARTS: ReadonlySet<string> = new Set(["input_text", "output_text", "text"])
const ROLES: ReadonlySet<string> = new Set(["system", "developer", "user", "assistant"])
const DETAILS: ReadonlySet<string> = new Set(["low", "high", "auto"])

/** An image reference: an https URL or a `data:` URL, forwarded byte for byte. */
const imagePart = (
  url: unknown,
  detail: unknown,
  path: string,
  remote: Map<string, string>
): Effect.Effect<UpstreamPart, InputError> => {
  if (typeof url !== "string" || url.length === 0) return invalid("An image needs a URL: https or a data: URL.", path)
  if (!/^https:\/\//i.test(url) && !/^data:image\/[a-z0-9.+-]+(;[^,]*)?,/i.test(url)) {
    return invalid("An image URL must be an https URL or a data:image/... URL.", path)
  }
  if (detail !== undefined && detail !== null && (typeof detail !== "string" || !DETAILS.has(detail))) {
    return invalid(
      `Expected detail "low", "high" or "auto", actual ${JSON.stringify(detail)}.`,
      path.replace(/\.(image_url|url)$/, ".detail")
    )
  }
  const known = detail === "low" || detail === "high" || detail === "auto" ? detail : undefined
  if (/^https:/i.test(url) && !remote.has(url)) remote.set(url, path)
  return Effect.succeed({ type: "image_url", image_url: known === undefined ? { url } : { url, detail: known } })
}

/** A content part: text, or (where `images`) an image in chat's or Responses' shape; anything else is named and refused. */
const partOf = (part: Json, path: string, images: ImageSink): Effect.Effect<UpstreamPart, InputError> => {
  const type = part["type"]
  if (typeof type === "string" && TEXT_PARTS.has(type)) {
    return typeof part["text"] === "string"
      ? Effect.succeed({ type: "text", text: part["text"] })
      : invalid("A text part needs a string 'text'.", `${path}.text`)
  }
  if (images !== false && type === "image_url") {
    const image = part["image_url"]
    return isRecord(image)
      ? imagePart(image["url"], image["detail"], `${path}.image_url.url`, images)
      : imagePart(image, undefined, `${path}.image_url`, images)
  }
  if (images !== false && type === "input_image") {
    if (part["image_url"] === undefined && part["file_id"] !== undefined) {
      return Effect.fail(
        new UnsupportedInput({
          message: "Images by file_id are not supported; send an https or data: URL.",
          param: path
        })
      )
    }
    return imagePart(part["image_url"], part["detail"], `${path}.image_url`, images)
  }
  return Effect.fail(
    new UnsupportedInput({
      message: `Content parts of type '${String(type)}' are not supported here; text${
        images !== false ? " and images are" : " is"
      } accepted.`,
      param: path
    })
  )
}

const partsOf = Effect.fnUntraced(function*(content: ReadonlyArray<Json>, path: string, images: ImageSink) {
  const parts: Array<UpstreamPart> = []
  for (let j = 0; j < content.length; j++) parts.push(yield* partOf(content[j] ?? {}, `${path}[${j}]`, images))
  return parts
})

const textOfParts = (parts: ReadonlyArray<UpstreamPart>): string =>
  parts.map((p) => p.type === "text" ? p.text : "").join("")

/** Content as the upstream takes it: a string stays a string; parts are checked, images kept. */
const contentOf = (content: string | ReadonlyArray<Json>, path: string, images: ImageSink) =>
  typeof content === "string"
    ? Effect.succeed<string | ReadonlyArray<UpstreamPart>>(content)
    : Effect.map(
      partsOf(content, path, images),
      (parts): string | ReadonlyArray<UpstreamPart> =>
        parts.every((p) => p.type === "text") ? textOfParts(parts) : parts
    )

const plain = (content: string | ReadonlyArray<UpstreamPart>): string =>
  typeof content === "string" ? content : textOfParts(content)

/** The first field of `names` the body carries (not null), as `not_implemented`. */
const refuseNotImplemented = (body: Json, names: ReadonlyArray<string>) => {
  const present = names.find((name) => body[name] !== undefined && body[name] !== null)
  return present === undefined
    ? Effect.void
    : Effect.fail(new NotImplemented({ message: `The '${present}' parameter is not implemented yet.`, param: present }))
}

/** An assistant's tool call in chat's shape. */
const toolCallOf = (value: unknown, path: string): Effect.Effect<ToolCall, InputError> => {
  if (!isRecord(value) || !isRecord(value["function"])) {
    return invalid("A tool call needs 'id', 'type: function' and 'function'.", path)
  }
  const fn = value["function"]
  if (typeof value["id"] !== "string") return invalid("A tool call needs a string 'id'.", `${path}.id`)
  if (typeof fn["name"] !== "string") {
    return invalid("A tool call needs a string 'function.name'.", `${path}.function.name`)
  }
  if (typeof fn["arguments"] !== "string") {
    return invalid("A tool call needs string 'function.arguments'.", `${path}.function.arguments`)
  }
  return Effect.succeed({
    id: value["id"],
    type: "function",
    function: { name: fn["name"], arguments: fn["arguments"] }
  })
}

/** Tools and the choice among them, checked as OpenAI checks them: unique names, a named choice among the tools. */
export const toolsOf = Effect.fnUntraced(
  function*(tools: ReadonlyArray<ToolDefinition>, choice: ToolChoice | undefined, choiceParam: string) {
    const names = new Set<string>()
    for (const [i, tool] of tools.entries()) {
      if (names.has(tool.function.name)) {
        return yield* invalid(
          `The function name '${tool.function.name}' is used twice; names must be unique.`,
          `tools[${i}]`
        )
      }
      names.add(tool.function.name)
    }
    if (typeof choice === "object" && !names.has(choice.function.name)) {
      return yield* invalid(`tool_choice names '${choice.function.name}', which is not among the tools.`, choiceParam)
    }
    if (choice === "required" && tools.length === 0) {
      return yield* invalid("tool_choice 'required' needs at least one function in 'tools'.", choiceParam)
    }
    return tools.length === 0 ? {} : { tools, toolChoice: choice }
  }
)

const definition = (
  name: string,
  description: string | null | undefined,
  parameters: Json | null | undefined,
  strict: boolean | null | undefined
): ToolDefinition => ({
  type: "function",
  // eslint-disable-next-line nenas/no-spread-adding-field -- once per tool of a call
  function: {
    name,
    ...(description === undefined || description === null ? {} : { description }),
    ...(parameters === undefined || parameters === null ? {} : { parameters }),
    ...(strict === undefined || strict === null ? {} : { strict })
  }
})

const sampling = (body: ChatCompletionRequest): Capabilities => ({
  presencePenalty: body.presence_penalty ?? undefined,
  frequencyPenalty: body.frequency_penalty ?? undefined,
  logitBias: body.logit_bias ?? undefined,
  seed: body.seed ?? undefined,
  logprobs: body.logprobs ?? undefined,
  topLogprobs: body.logprobs === true ? body.top_logprobs ?? undefined : undefined
})

/** Each tool result answers a call made before it, as OpenAI requires. */
const checkToolResults = (upstream: ReadonlyArray<UpstreamMessage>, param: (index: number) => string) => {
  const called = new Set<string>()
  for (const [i, message] of upstream.entries()) {
    if ("tool_calls" in message) { for (const call of message.tool_calls) called.add(call.id) }
    if (message.role === "tool" && !called.has(message.tool_call_id)) {
      return invalid(`No tool call found for the tool result with call id '${message.tool_call_id}'.`, param(i))
    }
  }
  return Effect.void
}

/** The text view of the upstream turns, for routing and search: what people and the model said. */
export const textView = (upstream: ReadonlyArray<UpstreamMessage>): ReadonlyArray<Message> =>
  upstream.flatMap((m): ReadonlyArray<Message> => {
    if (m.role === "tool") return []
    const content = m.content === null ? "" : plain(m.content)
    return m.role === "assistant" && content === "" ? [] : [{ role: m.role, content }]
  })

/** The field each message of `upstream` came from: `mark` names those pushed since the last mark. */
export const pathsOf = (upstream: ReadonlyArray<UpstreamMessage>) => {
  const all: Array<string> = []
  return {
    all,
    mark: (path: string) => {
      while (all.length < upstream.length) all.push(path)
    }
  }
}

/** Consecutive function calls belong to one assistant turn, as chat carries them. */
const appendCall = (upstream: Array<UpstreamMessage>, call: ToolCall) => {
  const last = upstream[upstream.length - 1]
  if (last !== undefined && last.role === "assistant") {
    const content = last.content === null ? null : plain(last.content)
    upstream[upstream.length - 1] = {
      role: "assistant",
      content,
      tool_calls: [...("tool_calls" in last ? last.tool_calls : []), call]
    }
  } else {
    upstream.push({ role: "assistant", content: null, tool_calls: [call] })
  }
}

const WEB_SEARCH_TOOLS = /^web_search(_preview)?(_\d{4}_\d{2}_\d{2})?$/

/**
 * `input` (a string or OpenAI's items: messages, function calls and their outputs) and `instructions`, with tools and format;
 * `history`, a stored conversation's items (`previous_response_id`), comes between the instructions and the input.
 */
export const responsesConversation = Effect.fnUntraced(
  function*(body: ResponsesBody, history: ReadonlyArray<Json> = []) {
    yield* refuseNotImplemented(body, RESPONSES_NOT_IMPLEMENTED)
    yield* withinCounts(body.input, body.tools, "input")
    const upstream: Array<UpstreamMessage> = []
    const paths = pathsOf(upstream)
    const remoteImages = new Map<string, string>()
    if (typeof body.instructions === "string" && body.instructions.length > 0) {
      upstream.push({ role: "system", content: body.instructions })
      paths.mark("instructions")
    }
    if (typeof body.input !== "string" && body.input.length === 0) {
      return yield* invalid("'input' must hold at least one message.", "input")
    }
    const items: ReadonlyArray<{ readonly item: typeof InputItem.Type; readonly path: string }> = [
      // Stored items were checked when they were stored.
      ...history.map((item) => ({ item: item as typeof InputItem.Type, path: "previous_response_id" })),
      ...(typeof body.input === "string"
        ? [{ item: { type: "message", role: "user", content: body.input }, path: "input" }]
        : body.input.map((item, i) => ({ item, path: `input[${i}]` })))
    ]
    for (const { item, path } of items) {
      if (item.type === "function_call") {
        const call = yield* toolCallOf({ id: item["call_id"], type: "function", function: item }, path)
        appendCall(upstream, call)
        paths.mark(path)
        continue
      }
      if (item.type === "function_call_output") {
        if (typeof item["call_id"] !== "string") {
          return yield* invalid("A function_call_output needs a string 'call_id'.", `${path}.call_id`)
        }
        const output = item["output"]
        const content = typeof output === "string"
          ? output
          : Array.isArray(output)
          ? plain(yield* partsOf(output.filter(isRecord), `${path}.output`, false))
          : yield* invalid("A function_call_output needs 'output', a string.", `${path}.output`)
        upstream.push({ role: "tool", tool_call_id: item["call_id"], content })
        paths.mark(path)
        continue
      }
      if (item.type !== undefined && item.type !== "message") {
        return yield* new UnsupportedInput({
          message: item.type === "item_reference"
            ? "This item reference could not be resolved: send the item itself."
            : `Input items of type '${item.type}' are not supported; messages, function_call and function_call_output are accepted.`,
          param: path
        })
      }
      if (item.role === undefined || !ROLES.has(item.role)) {
        return yield* invalid(
          `Expected role "user", "assistant", "system" or "developer", actual ${JSON.stringify(item.role ?? null)}.`,
          `${path}.role`
        )
      }
      if (item.content === undefined) return yield* invalid("A message needs 'content'.", `${path}.content`)
      const role = item.role as Message["role"]
      const content = yield* contentOf(item.content, `${path}.content`, role !== "assistant" && remoteImages)
      upstream.push(role === "assistant" ? { role, content: plain(content) } : { role, content })
      paths.mark(path)
    }
    // Items and messages do not map one to one (instructions, merged calls): the check names the input.
    yield* checkToolResults(upstream, () => "input")
    const functions: Array<ToolDefinition> = []
    let webSearchTool = false
    for (const [i, tool] of (body.tools ?? []).entries()) {
      if (tool.type === "function") {
        if (typeof tool.name !== "string" || !/^[A-Za-z0-9_-]{1,64}$/.test(tool.name)) {
          return yield* invalid(
            "A function tool needs a 'name' of 1 to 64 letters, digits, '_' or '-'.",
            `tools[${i}].name`
          )
        }
        functions.push(definition(tool.name, tool.description, tool.parameters, tool.strict))
      } else if (WEB_SEARCH_TOOLS.test(tool.type)) {
        webSearchTool = true
      } else {
        return yield* new UnsupportedInput({
          message: `Tools of type '${tool.type}' are not supported; 'function' and 'web_search' are.`,
          param: `tools[${i}]`
        })
      }
    }
    const choice = body.tool_choice ?? undefined
    const toolChoice: ToolChoice | undefined = choice === undefined || typeof choice === "string"
      ? choice
      : choice.type === "function"
      ? { type: "function", function: { name: choice.name } }
      : undefined
    const tools = yield* toolsOf(functions, toolChoice, "tool_choice")
    const format = body.text?.format ?? undefined
    const responseFormat: ResponseFormat | undefined = format === undefined
      ? undefined
      : format.type === "json_schema"
      ? {
        type: "json_schema",
        // eslint-disable-next-line nenas/no-spread-adding-field -- once per call, not per chunk
        json_schema: {
          name: format.name,
          schema: format.schema,
          ...(format.description === undefined || format.description === null
            ? {}
            : { description: format.description }),
          ...(format.strict === undefined || format.strict === null ? {} : { strict: format.strict })
        }
      }
      : { type: format.type }
    return {
      messages: textView(upstream),
      upstream,
      paths: paths.all,
      capabilities: {
        ...tools,
        ...(functions.length > 0 && typeof body.parallel_tool_calls === "boolean"
          ? { parallelToolCalls: body.parallel_tool_calls }
          : {}),
        ...(responseFormat === undefined || responseFormat.type === "text" ? {} : { responseFormat })
      },
      webSearchTool,
      remoteImages
    } satisfies Conversation
  }
)

/** Chat `messages` with their images and tool turns, and the request's tools, format and sampling fields. */
export const chatConversation = Effect.fnUntraced(function*(body: ChatCompletionRequest) {
  yield* refuseNotImplemented(body, CHAT_NOT_IMPLEMENTED)
  yield* withinCounts(body.messages, body.tools, "messages")
  const upstream: Array<UpstreamMessage> = []
  const paths = pathsOf(upstream)
  const remoteImages = new Map<string, string>()
  for (const [i, message] of body.messages.entries()) {
    const path = `messages[${i}]`
    const content = message.content ?? null
    switch (message.role) {
      case "function":
        return yield* new UnsupportedInput({
          message: "'function' messages (the deprecated function calling) are not supported; use 'tool' messages.",
          param: path
        })
      case "tool": {
        const id = message["tool_call_id"]
        if (typeof id !== "string") {
          return yield* invalid("A tool message needs a string 'tool_call_id'.", `${path}.tool_call_id`)
        }
        if (content === null) return yield* invalid("A tool message needs 'content'.", `${path}.content`)
        upstream.push({
          role: "tool",
          tool_call_id: id,
          content: plain(yield* contentOf(content, `${path}.content`, false))
        })
        break
      }
      case "assistant": {
        const raw = message["tool_calls"]
        const calls = raw === undefined || raw === null
          ? []
          : Array.isArray(raw)
          ? yield* Effect.forEach(raw, (call, j) => toolCallOf(call, `${path}.tool_calls[${j}]`))
          : yield* invalid("'tool_calls' must be a list.", `${path}.tool_calls`)
        if (content === null && calls.length === 0) {
          return yield* invalid("A message needs 'content'.", `${path}.content`)
        }
        const text = content === null ? null : plain(yield* contentOf(content, `${path}.content`, false))
        upstream.push(
          calls.length > 0
            ? { role: "assistant", content: text, tool_calls: calls }
            : { role: "assistant", content: text ?? "" }
        )
        break
      }
      default: {
        if (content === null) return yield* invalid("A message needs 'content'.", `${path}.content`)
        upstream.push({ role: message.role, content: yield* contentOf(content, `${path}.content`, remoteImages) })
      }
    }
    paths.mark(path)
  }
  yield* checkToolResults(upstream, (i) => `messages[${i}]`)
  const functions = (body.tools ?? []).map((tool) =>
    definition(tool.function.name, tool.function.description, tool.function.parameters, tool.function.strict)
  )
  const tools = yield* toolsOf(functions, body.tool_choice ?? undefined, "tool_choice")
  const format = body.response_format ?? undefined
  const responseFormat: ResponseFormat | undefined = format === undefined || format.type === "text"
    ? undefined
    : format.type === "json_object"
    ? { type: "json_object" }
    : {
      type: "json_schema",
      // eslint-disable-next-line nenas/no-spread-adding-field -- once per call, not per chunk
      json_schema: {
        name: format.json_schema.name,
        ...(format.json_schema.description === undefined || format.json_schema.description === null
          ? {}
          : { description: format.json_schema.description }),
        ...(format.json_schema.schema === undefined || format.json_schema.schema === null
          ? {}
          : { schema: format.json_schema.schema }),
        ...(format.json_schema.strict === undefined || format.json_schema.strict === null
          ? {}
          : { strict: format.json_schema.strict })
      }
    }
  return {
    messages: textView(upstream),
    upstream,
    paths: paths.all,
    capabilities: {
      ...sampling(body),
      ...tools,
      ...(functions.length > 0 && typeof body.parallel_tool_calls === "boolean"
        ? { parallelToolCalls: body.parallel_tool_calls }
        : {}),
      ...(responseFormat === undefined ? {} : { responseFormat })
    },
    webSearchTool: false,
    remoteImages
  } satisfies Conversation
})
