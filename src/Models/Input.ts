import { Effect } from "effect"
import { InvalidRequest, NotImplemented, UnsupportedInput } from "../Domain/Errors.js"
import type { ChatCompletionRequest, ResponsesBody } from "./Api.js"
import { CHAT_NOT_IMPLEMENTED, RESPONSES_NOT_IMPLEMENTED } from "./Api.js"
import type { Message } from "./Tokens.js"

type Part = { readonly type: string; readonly text?: string | undefined }

const TEXT_PARTS: ReadonlySet<string> = new Set(["input_text", "output_text", "text"])
const ROLES: ReadonlySet<string> = new Set(["system", "developer", "user", "assistant"])

/** The text of a message's content; any part that is not text is refused, named by its path. */
const textOf = (content: string | ReadonlyArray<Part>, path: string): Effect.Effect<string, UnsupportedInput | InvalidRequest> => {
  if (typeof content === "string") return Effect.succeed(content)
  const texts: Array<string> = []
  for (const [j, part] of content.entries()) {
    if (!TEXT_PARTS.has(part.type)) {
      return Effect.fail(new UnsupportedInput({
        message: `Content parts of type '${part.type}' are not supported; only text is accepted.`,
        param: `${path}[${j}]`
      }))
    }
    if (typeof part.text !== "string") {
      return Effect.fail(new InvalidRequest({ message: "A text part needs a string 'text'.", param: `${path}[${j}].text` }))
    }
    texts.push(part.text)
  }
  return Effect.succeed(texts.join(""))
}

/** The first field of `names` the body carries (not null), as `not_implemented`. */
const refuseNotImplemented = (body: Record<string, unknown>, names: ReadonlyArray<string>) => {
  const present = names.find((name) => body[name] !== undefined && body[name] !== null)
  return present === undefined
    ? Effect.void
    : Effect.fail(new NotImplemented({ message: `The '${present}' parameter is not implemented yet.`, param: present }))
}

/** `input` (a string or OpenAI's message items) and `instructions` as messages. */
export const responsesMessages = (body: ResponsesBody) =>
  Effect.gen(function*() {
    yield* refuseNotImplemented(body, RESPONSES_NOT_IMPLEMENTED)
    const messages: Array<Message> = []
    if (typeof body.instructions === "string" && body.instructions.length > 0) {
      messages.push({ role: "system", content: body.instructions })
    }
    if (typeof body.input === "string") {
      messages.push({ role: "user", content: body.input })
      return messages
    }
    if (body.input.length === 0) {
      return yield* new InvalidRequest({ message: "'input' must hold at least one message.", param: "input" })
    }
    for (const [i, item] of body.input.entries()) {
      if (item.type !== undefined && item.type !== "message") {
        return yield* new UnsupportedInput({
          message: `Input items of type '${item.type}' are not supported; only messages are accepted.`,
          param: `input[${i}]`
        })
      }
      if (item.role === undefined || !ROLES.has(item.role)) {
        return yield* new InvalidRequest({
          message: `Expected role "user", "assistant", "system" or "developer", actual ${JSON.stringify(item.role ?? null)}.`,
          param: `input[${i}].role`
        })
      }
      if (item.content === undefined) {
        return yield* new InvalidRequest({ message: "A message needs 'content'.", param: `input[${i}].content` })
      }
      const content = yield* textOf(item.content, `input[${i}].content`)
      messages.push({ role: item.role as Message["role"], content })
    }
    return messages
  })

/** Chat `messages` as plain-text messages; tool turns and non-text parts are refused. */
export const chatMessages = (body: ChatCompletionRequest) =>
  Effect.gen(function*() {
    yield* refuseNotImplemented(body, CHAT_NOT_IMPLEMENTED)
    const messages: Array<Message> = []
    for (const [i, message] of body.messages.entries()) {
      if (message.role === "tool" || message.role === "function" || message["tool_calls"] !== undefined) {
        return yield* new UnsupportedInput({
          message: "Tool calls and tool results are not supported; send text messages.",
          param: `messages[${i}]`
        })
      }
      if (message.content === null) {
        return yield* new InvalidRequest({ message: "A message needs 'content'.", param: `messages[${i}].content` })
      }
      const content = yield* textOf(message.content, `messages[${i}].content`)
      messages.push({ role: message.role, content })
    }
    return messages
  })
