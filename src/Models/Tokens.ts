import { countTokens } from "gpt-tokenizer"

/** A message as the service passes it on: a role and plain text. */
export interface Message {
  readonly role: "system" | "developer" | "user" | "assistant"
  readonly content: string
}

/** Special-token text in a prompt is counted as ordinary text, never refused. */
const ENCODE_OPTIONS = { disallowedSpecial: new Set<string>() }

/** Tokens of a text, by the o200k tokenizer of OpenAI's current models. */
export const countText = (text: string): number => text.length === 0 ? 0 : countTokens(text, ENCODE_OPTIONS)

/** OpenAI's chat accounting: each message adds its role framing (4 tokens) and the reply is primed (3). */
export const countMessages = (messages: ReadonlyArray<Message>): number =>
  messages.reduce((sum, message) => sum + 4 + countText(message.content), 3)
