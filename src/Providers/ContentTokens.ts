import { imageSize } from "image-size"
import { countTexts } from "../Domain/Tokens.js"
import type { ResponseFormat, ToolCall, ToolDefinition, UpstreamMessage } from "./Provider.js"

/**
 * Token counts for what is not plain text, built on the string counter of
 * `Domain/Tokens.ts`: images as OpenAI counts them, tool definitions, tool calls and
 * response formats as the JSON the model reads. These feed the estimate a call
 * reserves; the capture uses the upstream's own usage.
 */

/** OpenAI's image accounting: 85 for `low`; for `high`/`auto`, 85 plus 170 per 512-pixel tile of the scaled image. */
const LOW_DETAIL_TOKENS = 85
const TILE_TOKENS = 170

/** The tiles of a `width` × `height` image once fitted in 2048 × 2048 and its shorter side brought down to 768. */
const tilesOf = (width: number, height: number): number => {
  let w = width
  let h = height
  const fit = Math.min(1, 2048 / Math.max(w, h))
  w *= fit
  h *= fit
  const shorter = Math.min(1, 768 / Math.min(w, h))
  w *= shorter
  h *= shorter
  return Math.ceil(w / 512) * Math.ceil(h / 512)
}

/** The most a `high` image can cost: 768 × 2048 after scaling, 8 tiles (1445 tokens). */
export const MAX_IMAGE_TOKENS = LOW_DETAIL_TOKENS + TILE_TOKENS * tilesOf(768, 2048)

const DATA_URL = /^data:[^;,]*(;[^,]*)?;base64,/i

/** The size of an image sent as a `data:` URL; undefined for remote URLs and unreadable data. */
const sizeOf = (url: string): { readonly width: number; readonly height: number } | undefined => {
  const header = DATA_URL.exec(url)
  if (header === null) return undefined
  try {
    const { height, width } = imageSize(Buffer.from(url.slice(header[0].length), "base64"))
    return width > 0 && height > 0 ? { width, height } : undefined
  } catch {
    return undefined
  }
}

/** Tokens of one image; without a known size, the largest a `high` image can cost. */
export const countImage = (url: string, detail: "low" | "high" | "auto" | undefined): number => {
  if (detail === "low") return LOW_DETAIL_TOKENS
  const size = sizeOf(url)
  return size === undefined ? MAX_IMAGE_TOKENS : LOW_DETAIL_TOKENS + TILE_TOKENS * tilesOf(size.width, size.height)
}

/** A request's input as the counter takes it: tokens known without the tokenizer (framing, images), and its texts. */
interface Tally {
  fixed: number
  readonly texts: Array<string>
}

/** OpenAI's chat accounting extended to every turn: each message adds its role framing (4 tokens) and the reply is primed (3). */
const tallyMessages = (messages: ReadonlyArray<UpstreamMessage>, tally: Tally): void => {
  tally.fixed += 3
  for (const message of messages) {
    tally.fixed += 4
    if (typeof message.content === "string") tally.texts.push(message.content)
    else if (message.content !== null) {
      for (const part of message.content) {
        if (part.type === "text") tally.texts.push(part.text)
        else tally.fixed += countImage(part.image_url.url, part.image_url.detail)
      }
    }
    if ("tool_calls" in message) {
      for (const call of message.tool_calls) {
        tally.fixed += 8
        tally.texts.push(call.function.name, call.function.arguments)
      }
    }
    if ("tool_call_id" in message) tally.texts.push(message.tool_call_id)
  }
}

/** Tool definitions as the model reads them: their JSON, with framing per tool. */
const tallyTools = (tools: ReadonlyArray<ToolDefinition> | undefined, tally: Tally): void => {
  if (tools === undefined || tools.length === 0) return
  tally.fixed += 12
  for (const tool of tools) {
    tally.fixed += 8
    tally.texts.push(JSON.stringify(tool.function))
  }
}

/** A JSON schema the answer must follow is read by the model too. */
const tallyFormat = (format: ResponseFormat | undefined, tally: Tally): void => {
  if (format === undefined || format.type !== "json_schema") return
  tally.fixed += 8
  tally.texts.push(JSON.stringify(format.json_schema))
}

const totalOf = (tally: Tally): number => tally.fixed + countTexts(tally.texts)

/**
 * A request's whole input, the turns, tools and format, under one token-counting
 * budget (`countTexts` in `Domain/Tokens.ts`): what a call's estimate and `count_tokens` use.
 */
export const countRequest = (
  messages: ReadonlyArray<UpstreamMessage>,
  tools: ReadonlyArray<ToolDefinition> | undefined,
  format: ResponseFormat | undefined
): number => {
  const tally: Tally = { fixed: 0, texts: [] }
  tallyMessages(messages, tally)
  tallyTools(tools, tally)
  tallyFormat(format, tally)
  return totalOf(tally)
}

/** A tool call as the model writes it: its name and arguments, with a few tokens of framing. */
export const countToolCall = (call: ToolCall): number => 8 + countTexts([call.function.name, call.function.arguments])

/** The turns alone; for text messages this equals `countMessages` of `Domain/Tokens.ts`. */
export const countUpstreamMessages = (messages: ReadonlyArray<UpstreamMessage>): number => {
  const tally: Tally = { fixed: 0, texts: [] }
  tallyMessages(messages, tally)
  return totalOf(tally)
}

/** The tool definitions alone. */
export const countTools = (tools: ReadonlyArray<ToolDefinition> | undefined): number => {
  const tally: Tally = { fixed: 0, texts: [] }
  tallyTools(tools, tally)
  return totalOf(tally)
}

/** The answer's schema alone. */
export const countResponseFormat = (format: ResponseFormat | undefined): number => {
  const tally: Tally = { fixed: 0, texts: [] }
  tallyFormat(format, tally)
  return totalOf(tally)
}
