import type { Json, StoredResponse } from "./Store.js"

/** One line of a stored conversation as the dashboard shows it: who said what, or which function ran. */
export interface ConversationLine {
  readonly kind: string
  readonly role: string
  readonly text: string
}

const isRecord = (value: unknown): value is Json => typeof value === "object" && value !== null && !Array.isArray(value)

const textOf = (content: unknown): string =>
  typeof content === "string"
    ? content
    : Array.isArray(content)
    ? content.map((part) =>
      isRecord(part) && typeof part["text"] === "string"
        ? part["text"]
        : isRecord(part)
        ? `[${String(part["type"])}]`
        : ""
    ).join("")
    : ""

const lineOf = (item: Json): ConversationLine => {
  const kind = typeof item["type"] === "string" ? item["type"] : "message"
  switch (kind) {
    case "message":
      return { kind, role: typeof item["role"] === "string" ? item["role"] : "user", text: textOf(item["content"]) }
    case "function_call":
      return { kind, role: "assistant", text: `${String(item["name"])}(${String(item["arguments"])})` }
    case "function_call_output":
      return { kind, role: "tool", text: textOf(item["output"]) }
    default:
      return { kind, role: "", text: "" }
  }
}

/** A conversation up to its last response (`chain`, oldest first): that response's instructions, then every turn's input and output. */
export const conversationLines = (chain: ReadonlyArray<StoredResponse>): ReadonlyArray<ConversationLine> => {
  const last = chain[chain.length - 1]
  const instructions: ReadonlyArray<ConversationLine> = last?.instructions === null || last?.instructions === undefined
    ? []
    : [{ kind: "instructions", role: "system", text: last.instructions }]
  return [
    ...instructions,
    ...chain.flatMap((stored) => {
      const output = stored.response["output"]
      return [...stored.input, ...(Array.isArray(output) ? output.filter(isRecord) : [])].map(lineOf)
    })
  ]
}
