import { imageSize } from "image-size"
import type { ResponseFormat, ToolCall, ToolDefinition, UpstreamMessage, UpstreamPart } from "./Provider.js"
import { countText } from "../Domain/Tokens.js"

/**
 * Token counts for what is not plain text, built on the string counter of
 * Tokens.ts: images as OpenAI counts them, tool definitions, tool calls and
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

const countPart = (part: UpstreamPart): number =>
  part.type === "text" ? countText(part.text) : countImage(part.image_url.url, part.image_url.detail)

/** A tool call as the model writes it: its name and arguments, with a few tokens of framing. */
export const countToolCall = (call: ToolCall): number => 8 + countText(call.function.name) + countText(call.function.arguments)

/**
 * OpenAI's chat accounting extended to every turn: each message adds its role
 * framing (4 tokens) and the reply is primed (3); for text messages this equals
 * `countMessages` of Tokens.ts.
 */
export const countUpstreamMessages = (messages: ReadonlyArray<UpstreamMessage>): number =>
  messages.reduce((sum, message) => {
    const content = message.content === null
      ? 0
      : typeof message.content === "string"
      ? countText(message.content)
      : message.content.reduce((total, part) => total + countPart(part), 0)
    const calls = "tool_calls" in message ? message.tool_calls.reduce((total, call) => total + countToolCall(call), 0) : 0
    const id = "tool_call_id" in message ? countText(message.tool_call_id) : 0
    return sum + 4 + content + calls + id
  }, 3)

/** Tool definitions as the model reads them: their JSON, with framing per tool. */
export const countTools = (tools: ReadonlyArray<ToolDefinition> | undefined): number =>
  tools === undefined || tools.length === 0 ? 0 : tools.reduce((sum, tool) => sum + 8 + countText(JSON.stringify(tool.function)), 12)

/** A JSON schema the answer must follow is read by the model too. */
export const countResponseFormat = (format: ResponseFormat | undefined): number =>
  format === undefined || format.type !== "json_schema" ? 0 : 8 + countText(JSON.stringify(format.json_schema))
