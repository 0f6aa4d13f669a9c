import type { Message } from "../Domain/Tokens.js"

/**
 * The planning call (docs/api/models.md, "Web search"): the model reads the conversation
 * and writes the search queries, one a line. The prompt is bounded so the
 * estimate can count it before the call: the last few turns, each cut short.
 */

/** The first words of the planner's instructions; the simulated model knows a planning call by them. */
export const PLANNER_MARKER = "You plan web searches."

const TURNS = 6
const TURN_CHARS = 2_000
const QUERY_CHARS = 200
/** What a result shows the second round's planner: enough to see what is missing. */
const DIGEST_TITLE_CHARS = 120
const DIGEST_URL_CHARS = 200
const DIGEST_SNIPPET_CHARS = 300
const DIGEST_PAGE_CHARS = 600
/** Per result: the characters above and the line's framing; tokens never exceed characters. */
export const DIGEST_RESULT_CHARS = DIGEST_TITLE_CHARS + DIGEST_URL_CHARS + DIGEST_SNIPPET_CHARS + 16
export const DIGEST_PAGE_BOUND_CHARS = DIGEST_PAGE_CHARS + 4

export interface ReadResult {
  readonly title: string
  readonly url: string
  readonly snippet: string
  /** The page's text when it was read. */
  readonly page?: string | undefined
}

const clip = (text: string, chars: number) => text.replace(/\s+/g, " ").trim().slice(0, chars)

const instructions = (count: number, today: string) =>
  `${PLANNER_MARKER} Today is ${today}. Read the conversation and write up to ${count} web search ${
    count === 1 ? "query" : "queries"
  } that together find what the last user message needs: short keyword queries a search engine answers well, ` +
  "each on its own line, different from each other, with no numbering, quotes or other text."

const digest = (earlier: ReadonlyArray<string>, results: ReadonlyArray<ReadResult>) =>
  [
    `Searches already run: ${earlier.map((query) => clip(query, QUERY_CHARS)).join("; ")}.`,
    "They found:",
    ...results.map((result, i) =>
      `${i + 1}. ${clip(result.title, DIGEST_TITLE_CHARS)} (${clip(result.url, DIGEST_URL_CHARS)}): ${
        clip(result.snippet, DIGEST_SNIPPET_CHARS)
      }${result.page === undefined ? "" : ` | ${clip(result.page, DIGEST_PAGE_CHARS)}`}`
    ),
    "Write queries for what these do not yet answer; do not repeat a search already run."
  ].join("\n")

/**
 * The planning call's messages: its instructions, the conversation's last
 * turns, and for a second round what the first found.
 */
export const planningMessages = (
  conversation: ReadonlyArray<Message>,
  count: number,
  today: string,
  earlier?: { readonly queries: ReadonlyArray<string>; readonly results: ReadonlyArray<ReadResult> }
): ReadonlyArray<Message> => [
  { role: "system", content: instructions(count, today) },
  ...conversation
    .filter((message) => message.role === "user" || message.role === "assistant")
    .slice(-TURNS)
    .map((message) => ({ role: message.role, content: message.content.slice(0, TURN_CHARS) })),
  ...(earlier === undefined ? [] : [{ role: "system" as const, content: digest(earlier.queries, earlier.results) }])
]

/** The queries in a planner's answer: one a line, list markers and quotes stripped, repeats dropped, at most `count`. */
export const parseQueries = (text: string, count: number): ReadonlyArray<string> => {
  const seen = new Set<string>()
  const queries: Array<string> = []
  for (const line of text.split(/\r?\n/)) {
    const query = clip(
      line.replace(/^\s*(?:[-*•]|\d+[.)]|q\d+:)\s*/i, "").replace(/^["'“”`]+|["'“”`]+$/g, ""),
      QUERY_CHARS
    )
    const key = query.toLowerCase()
    if (query.length === 0 || seen.has(key)) continue
    seen.add(key)
    queries.push(query)
    if (queries.length >= count) break
  }
  return queries
}

const STOPWORDS = new Set(
  ("a an and are as at be by can could did do does for from had has have how i in is it its me my of on or our " +
    "please should so tell that the their them there these they this to us was we were what when where which who " +
    "why will with would you your about into than then also just any some").split(" ")
)

/** The words of a text that carry its meaning, in order, lower case, once each. */
const keywords = (text: string): ReadonlyArray<string> => {
  const seen = new Set<string>()
  for (const word of text.toLowerCase().match(/[\p{L}\p{N}][\p{L}\p{N}'-]*/gu) ?? []) {
    if (!STOPWORDS.has(word) && word.length > 1) seen.add(word)
  }
  return [...seen]
}

const ANGLES = ["", "latest", "explained", "analysis", "official"]

/**
 * What the simulated model answers a planning call with, or `undefined` when
 * the request is not one: queries made deterministically from the last user
 * message's keywords (and, in a second round, from the titles found), as many
 * as the instructions ask for.
 */
export const simulatedPlannerAnswer = (
  request: ReadonlyArray<{ readonly role: string; readonly content: unknown }>
): string | undefined => {
  // A planning call carries text only (`planningMessages`); anything else is not one.
  const head = request[0]
  if (head?.role !== "system" || typeof head.content !== "string" || !head.content.startsWith(PLANNER_MARKER)) {
    return undefined
  }
  const messages = request.flatMap((m) => typeof m.content === "string" ? [{ role: m.role, content: m.content }] : [])
  const first = { role: "system", content: head.content }
  const count = Number(/write up to (\d+) web search/.exec(first.content)?.[1] ?? "1")
  const question = [...messages].reverse().find((message) => message.role === "user")?.content ?? ""
  const terms = keywords(question).slice(0, 8)
  const base = terms.length > 0 ? terms.join(" ") : clip(question, 80) || "web search"
  const found = messages.length > 1 ? messages[messages.length - 1] : undefined
  const followUp = found?.role === "system" && found.content.startsWith("Searches already run:")
  const titles = followUp
    ? keywords(found.content.split("\n").slice(2, 4).join(" ")).filter((word) => !terms.includes(word))
    : []
  // Angles the question already names would only repeat it.
  const angles = ANGLES.filter((angle) => !terms.includes(angle))
  return Array.from({ length: count }, (_, i) =>
    followUp
      ? `${base} ${titles.slice(i * 2, i * 2 + 2).join(" ") || angles[(i + 1) % angles.length]} details`.trim()
      : `${base} ${angles[i % angles.length] ?? ""}`.trim()).join("\n")
}
