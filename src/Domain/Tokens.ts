import { createHash } from "node:crypto"
import { countTokens } from "gpt-tokenizer"

/** A message as the service passes it on: a role and plain text. */
export interface Message {
  readonly role: "system" | "developer" | "user" | "assistant"
  readonly content: string
}

/** Special-token text in a prompt is counted as ordinary text, never refused. */
const ENCODE_OPTIONS = { disallowedSpecial: new Set<string>() }

/**
 * Byte-pair encoding takes time quadratic in the length of one piece (a run
 * without whitespace, or of whitespace): a 100,000-letter word took 10 s. Runs
 * longer than this are counted in slices of this length, which costs at most a
 * token or so per slice more than the exact count: an estimate that errs high.
 */
const MAX_PIECE = 64
const LONG_RUN = new RegExp(`\\S{${MAX_PIECE + 1},}|\\s{${MAX_PIECE + 1},}`, "g")

/**
 * Even sliced, the tokenizer reads about 1 MB of varied text a second. Texts
 * up to this many characters are counted exactly; longer ones are estimated
 * from SAMPLES windows as many characters in all (well under 0.2 s). The
 * reservation adds its own safety margin to the estimate.
 */
const EXACT_CHARS = 65_536
const SAMPLES = 64
const WINDOW = EXACT_CHARS / SAMPLES
/** How far a window's ends move to reach whitespace, so that it holds whole words. */
const ALIGN = 64

const isHighSurrogate = (code: number): boolean => code >= 0xd800 && code <= 0xdbff
const isLowSurrogate = (code: number): boolean => code >= 0xdc00 && code <= 0xdfff

const countPiece = (text: string): number => text.length === 0 ? 0 : countTokens(text, ENCODE_OPTIONS)

/** A long run, cut every MAX_PIECE code units but never inside a surrogate pair. */
const countSlices = (run: string): number => {
  let total = 0
  for (let start = 0; start < run.length;) {
    let end = Math.min(start + MAX_PIECE, run.length)
    if (end < run.length && isHighSurrogate(run.charCodeAt(end - 1))) end -= 1
    total += countPiece(run.slice(start, end))
    start = end
  }
  return total
}

/** Exact but for the slicing of long runs: time linear in the length. */
const countExact = (text: string): number => {
  let total = 0
  let start = 0
  for (const match of text.matchAll(LONG_RUN)) {
    total += countPiece(text.slice(start, match.index)) + countSlices(match[0])
    start = match.index + match[0].length
  }
  return total + countPiece(start === 0 ? text : text.slice(start))
}

/** The index just after the next whitespace at or after `from` (within ALIGN), or `from`. */
const afterSpace = (text: string, from: number): number => {
  for (let i = from; i < Math.min(from + ALIGN, text.length); i++) if (/\s/.test(text[i] ?? "")) return i + 1
  return from
}

/**
 * Where each stratum's window starts, from a digest of the text itself: the
 * same text always gets the same count, yet no caller can know beforehand
 * which parts are read, so cheap text placed where the windows fall cannot
 * hide costly text elsewhere (which would be reserved, and billed, too low).
 */
const windowOffsets = (text: string, room: number): ReadonlyArray<number> => {
  const digest = Buffer.concat([0, 1, 2, 3].map((round) => createHash("sha256").update(String(round)).update(text).digest()))
  return Array.from({ length: SAMPLES }, (_, i) => room <= 0 ? 0 : digest.readUInt16BE(i * 2) % room)
}

/** One window of whole words at an offset of each of SAMPLES equal strata chosen by the text's digest. */
const countSampled = (text: string): number => {
  const stratum = Math.floor(text.length / SAMPLES)
  const offsets = windowOffsets(text, stratum - WINDOW)
  let tokens = 0
  let chars = 0
  for (let i = 0; i < SAMPLES; i++) {
    // A window runs from a word's leading space to before the next one's, as the tokenizer splits words.
    let start = Math.max(0, afterSpace(text, i * stratum + (offsets[i] ?? 0)) - 1)
    if (isLowSurrogate(text.charCodeAt(start))) start += 1
    let end = Math.max(start + 1, afterSpace(text, start + WINDOW) - 1)
    if (isHighSurrogate(text.charCodeAt(end - 1))) end -= 1
    tokens += countExact(text.slice(start, end))
    chars += end - start
  }
  return Math.ceil(tokens / chars * text.length)
}

/**
 * Tokens of a text, by the o200k tokenizer of OpenAI's current models: exact
 * up to EXACT_CHARS characters, estimated beyond; in bounded time either way.
 */
export const countText = (text: string): number => text.length <= EXACT_CHARS ? countExact(text) : countSampled(text)

/** OpenAI's chat accounting: each message adds its role framing (4 tokens) and the reply is primed (3). */
export const countMessages = (messages: ReadonlyArray<Message>): number => {
  const framing = 3 + 4 * messages.length
  const length = messages.reduce((sum, message) => sum + message.content.length, 0)
  // Many long messages are estimated as one text, so that the whole count stays bounded.
  if (length > EXACT_CHARS) return framing + countText(messages.map((message) => message.content).join("\n"))
  return messages.reduce((sum, message) => sum + countText(message.content), framing)
}
