import { countTokens } from "gpt-tokenizer"
import { createHmac, randomBytes } from "node:crypto"

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
 * Even sliced, the tokenizer reads only about 1 MB of varied text a second,
 * so a request has one budget (docs/security.md, "Bounded work per request"): its texts
 * are counted exactly while they hold at most EXACT_CHARS characters in all;
 * beyond, they are estimated from SAMPLES windows of WINDOW characters, as
 * many characters in all (some 30 ms either way).
 */
export const EXACT_CHARS = 32_768
const SAMPLES = 64
const WINDOW = EXACT_CHARS / SAMPLES
/** How far a window's ends move to reach whitespace, so that it holds whole words. */
const ALIGN = 32
/**
 * The estimate errs high: the sampled tokens per character plus this many of
 * its standard errors (from how much the windows differ), besides the hold's
 * own margin. Text of one kind gets little more than its count; text whose
 * windows disagree gets more.
 */
const STANDARD_ERRORS = 2
/** The most tokens one UTF-8 byte past a character's first can cost (three bytes of a character, each a token). */
const TOKENS_PER_EXTRA_BYTE = 1.5

/**
 * Where the windows fall is keyed by a secret of this process: the same text
 * gets the same count here, yet no caller can know which parts are read, so
 * cheap text placed where the windows fall cannot hide costly text elsewhere
 * (which would be held, and billed, too low).
 */
const WINDOW_KEY = randomBytes(32)

const isHighSurrogate = (code: number): boolean => code >= 0xd800 && code <= 0xdbff
const isLowSurrogate = (code: number): boolean => code >= 0xdc00 && code <= 0xdfff
const isSpace = (code: number): boolean => code === 32 || (code >= 9 && code <= 13)

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

/** UTF-8 bytes beyond one a code unit: where text costs more than a token a character, it shows here. */
const extraBytes = (text: string): number => Buffer.byteLength(text, "utf8") - text.length

/**
 * The texts as one text joined by newlines, read without being built: the
 * `length` code units from `from`, wrapping from the end to the start.
 */
const reader = (texts: ReadonlyArray<string>, total: number) => {
  const starts: Array<number> = []
  let at = 0
  for (const text of texts) {
    starts.push(at)
    at += text.length + 1
  }
  /** The index of the text that holds virtual position `position`. */
  const find = (position: number): number => {
    let low = 0
    let high = starts.length - 1
    while (low < high) {
      const middle = (low + high + 1) >> 1
      if ((starts[middle] ?? 0) <= position) low = middle
      else high = middle - 1
    }
    return low
  }
  return (from: number, length: number): string => {
    const position = from % total
    let index = find(position)
    let offset = position - (starts[index] ?? 0)
    let out = ""
    while (out.length < length) {
      const text = texts[index] ?? ""
      if (offset < text.length) {
        const piece = text.slice(offset, offset + length - out.length)
        out += piece
        offset += piece.length
      } else {
        // The newline after a text; after the last, the first text again.
        if (index + 1 < texts.length) out += "\n"
        index = index + 1 < texts.length ? index + 1 : 0
        offset = 0
      }
    }
    return out
  }
}

/** `window` trimmed to whole words: from just after its first whitespace to its last (each within ALIGN). */
const wholeWords = (window: string): string => {
  let start = 0
  while (start < ALIGN && start < window.length && !isSpace(window.charCodeAt(start))) start++
  // A window runs from a word's leading space, as the tokenizer splits words.
  if (start >= ALIGN || start >= window.length) start = 0
  if (isLowSurrogate(window.charCodeAt(start))) start += 1
  let end = window.length
  while (end > window.length - ALIGN && end > start + 1 && !isSpace(window.charCodeAt(end - 1))) end--
  // It ends before the next word's leading space.
  if (end <= window.length - ALIGN || end <= start + 1) end = window.length
  else end -= 1
  if (isHighSurrogate(window.charCodeAt(end - 1))) end -= 1
  return window.slice(start, end)
}

/** SAMPLES offsets in [0, stratum), from a keyed digest of the text's length, bytes, start and end. */
const windowOffsets = (texts: ReadonlyArray<string>, total: number, stratum: number): ReadonlyArray<number> => {
  const mac = createHmac("sha256", WINDOW_KEY).update(`${total}:${texts.length}:`)
  for (const text of [texts[0] ?? "", texts[texts.length - 1] ?? ""]) {
    mac.update(text.slice(0, 256)).update(text.slice(-256))
  }
  const seed = mac.digest()
  const digest = Buffer.concat(
    [0, 1, 2, 3].map((round) => createHmac("sha256", WINDOW_KEY).update(seed).update(String(round)).digest())
  )
  return Array.from({ length: SAMPLES }, (_, i) => Math.floor(digest.readUInt16BE(i * 2) / 65_536 * stratum))
}

/**
 * The sampled estimate: one window of whole words in each of SAMPLES equal
 * strata of the texts joined, at an offset chosen by the keyed digest (a
 * window may run into the next stratum, so every character is read with the
 * same chance and none, at a stratum's edge, is read less). Their tokens per
 * character, plus STANDARD_ERRORS of its standard errors, scale to the whole; UTF-8 bytes the windows
 * make the whole seem to lack (text of several bytes a character, left
 * unsampled) add the most they can cost.
 */
const countSampled = (texts: ReadonlyArray<string>, total: number): number => {
  const read = reader(texts, total)
  const stratum = total / SAMPLES
  const offsets = windowOffsets(texts, total, stratum)
  const counted: Array<number> = []
  const lengths: Array<number> = []
  let tokens = 0
  let chars = 0
  let extra = 0
  for (let i = 0; i < SAMPLES; i++) {
    const window = wholeWords(read(Math.floor(i * stratum) + (offsets[i] ?? 0), WINDOW + ALIGN))
    const windowTokens = countExact(window)
    counted.push(windowTokens)
    lengths.push(window.length)
    tokens += windowTokens
    chars += window.length
    extra += extraBytes(window)
  }
  const ratio = tokens / chars
  let squares = 0
  for (let i = 0; i < SAMPLES; i++) squares += ((counted[i] ?? 0) - ratio * (lengths[i] ?? 0)) ** 2
  // The ratio estimate's standard error: how far the windows' tokens stray from the ratio, per character read.
  const standardError = Math.sqrt(squares / (SAMPLES * (SAMPLES - 1))) / (chars / SAMPLES)
  const unseen = Math.max(0, texts.reduce((sum, text) => sum + extraBytes(text), 0) - extra / chars * total)
  return Math.ceil((ratio + STANDARD_ERRORS * standardError) * total + unseen * TOKENS_PER_EXTRA_BYTE)
}

/**
 * Tokens of a request's texts under one budget, by the o200k tokenizer of
 * OpenAI's current models: exact while they hold EXACT_CHARS characters in
 * all, the sampled estimate (which errs high) beyond; bounded time either way.
 */
export const countTexts = (texts: ReadonlyArray<string>): number => {
  let total = 0
  for (const text of texts) total += text.length
  if (total <= EXACT_CHARS) {
    let tokens = 0
    for (const text of texts) tokens += countExact(text)
    return tokens
  }
  return countSampled(texts, total + texts.length - 1)
}

/** Tokens of one text: `countTexts` of it alone. */
export const countText = (text: string): number => text.length <= EXACT_CHARS ? countExact(text) : countTexts([text])

/** OpenAI's chat accounting: each message adds its role framing (4 tokens) and the reply is primed (3). */
export const countMessages = (messages: ReadonlyArray<Message>): number =>
  3 + 4 * messages.length + countTexts(messages.map((message) => message.content))
