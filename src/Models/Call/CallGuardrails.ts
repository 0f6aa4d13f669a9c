import { ContentBlocked } from "../../Domain/Errors.js"
import { Holdback } from "../../Guardrails/Holdback.js"
import type { Found, Scanner } from "../../Guardrails/Policy.js"
import { changesText, redactFound, scanWith, Tally } from "../../Guardrails/Policy.js"
import type { ToolCall, UpstreamMessage } from "../../Providers/Provider.js"
import type { Answer } from "./CallTypes.js"

/**
 * A call's guardrails (docs/api/guardrails.md, "Calls"): its input scanned before anything is held or
 * sent, its answer before the caller sees it, a stream's text as it comes. What matched is only ever
 * counted by rule (`Tally`); no matched text leaves this file but as its placeholder.
 */

const DETECTOR_NAMES: Readonly<Record<string, string>> = {
  email: "an email address (email)",
  phone: "a phone number (phone)",
  mykad: "a MyKad number (mykad)",
  card: "a card number (card)",
  ip: "an IP address (ip)",
  injection: "a prompt-injection phrase (injection)"
}

/** What blocked: the detector or the filter's label, never the text. */
const ruleText = (finding: Found) =>
  finding.type === "filter" ? `text matching the filter ${finding.label ?? ""}` : DETECTOR_NAMES[finding.type] ?? ""

export const blockedInput = (finding: Found, param: string) =>
  new ContentBlocked({ message: `The guardrail policy blocked ${param}: it holds ${ruleText(finding)}.`, param })

export const blockedOutput = (finding: Found) =>
  new ContentBlocked({ message: `The guardrail policy blocked the answer: it held ${ruleText(finding)}.`, param: null })

/** A stored or sent JSON value with each string redacted, but for the fields that name rather than say. */
const NAMING_FIELDS: ReadonlySet<string> = new Set(["type", "role", "id", "call_id", "status", "name", "detail"])

/** Tool arguments nested deeper than this are scanned as text: their walk stays shallow. */
const MAX_DEPTH = 64

/** Whether `value` nests deeper than `limit`, found without recursion. */
const depthOver = (value: unknown, limit: number): boolean => {
  const stack: Array<readonly [unknown, number]> = [[value, 0]]
  while (stack.length > 0) {
    const [item, depth] = stack.pop()!
    if (typeof item !== "object" || item === null) continue
    if (depth >= limit) return true
    for (const child of Object.values(item)) stack.push([child, depth + 1])
  }
  return false
}

/** One direction's scan of texts: the first block met, or each text redacted, the findings tallied. */
class Guard {
  blocked: { readonly finding: Found; readonly where: string } | undefined

  constructor(readonly scanner: Scanner, readonly tally: Tally, readonly direction: "input" | "output") {}

  text(text: string, where: string): string {
    if (this.blocked !== undefined || text.length === 0) return text
    const found = scanWith(this.scanner, text)
    if (found.length === 0) return text
    const block = found.find((finding) => finding.action === "block")
    this.tally.add(this.direction, block === undefined ? found : [block])
    if (block !== undefined) {
      this.blocked = { finding: block, where }
      return text
    }
    return redactFound(text, found)
  }

  /**
   * A tool call's arguments: JSON whose strings are scanned as decoded (an escaped `\n` would otherwise
   * glue an `n` to the value after it), and written again only when a string changed; text that is not
   * JSON, or nests deeper than `MAX_DEPTH`, is scanned as it is.
   */
  arguments(raw: string, where: string): string {
    let parsed: unknown
    try {
      parsed = JSON.parse(raw)
    } catch {
      return this.text(raw, where)
    }
    if (typeof parsed !== "object" || parsed === null || depthOver(parsed, MAX_DEPTH)) return this.text(raw, where)
    const redacted = this.json(parsed, where, false)
    return this.blocked !== undefined || JSON.stringify(redacted) === JSON.stringify(parsed)
      ? raw
      : JSON.stringify(redacted)
  }

  toolCalls(calls: ReadonlyArray<ToolCall>, where: string): ReadonlyArray<ToolCall> {
    return calls.map((call) => {
      const args = this.arguments(call.function.arguments, where)
      return args === call.function.arguments
        ? call
        : { id: call.id, type: call.type, function: { name: call.function.name, arguments: args } }
    })
  }

  /**
   * A JSON value's strings, redacted (a stored copy of the input: it must hold what the upstream got);
   * `naming`: the fields that name rather than say are left as they are.
   */
  json(value: unknown, where: string, naming = true): unknown {
    if (typeof value === "string") return this.text(value, where)
    if (Array.isArray(value)) return value.map((item) => this.json(item, where, naming))
    if (typeof value !== "object" || value === null) return value
    return Object.fromEntries(
      Object.entries(value).map((
        [field, item]
      ) => [
        field,
        naming && NAMING_FIELDS.has(field)
          ? item
          : field === "arguments" && typeof item === "string"
          ? this.arguments(item, where)
          : this.json(item, where, naming)
      ])
    )
  }
}

/** The field a message's text is named by in errors: the whole field, or the message's content. */
const paramOf = (path: string, part: "content" | "tool_calls") => path.includes("[") ? `${path}.${part}` : path

export type GuardedInput =
  | { readonly _tag: "Passed"; readonly upstream: ReadonlyArray<UpstreamMessage>; readonly tally: Tally }
  | { readonly _tag: "Blocked"; readonly error: ContentBlocked; readonly tally: Tally }

/**
 * The conversation as the upstream may see it: each text redacted where the policy redacts, or the
 * refusal that names the first field blocked. `paths` names each message (`messages[2]`, `input[0]`,
 * `instructions`, `previous_response_id`).
 */
export const guardInput = (
  scanner: Scanner,
  upstream: ReadonlyArray<UpstreamMessage>,
  paths: ReadonlyArray<string>,
  fallbackParam: string
): GuardedInput => {
  const guard = new Guard(scanner, new Tally(), "input")
  const guarded = upstream.map((message, i): UpstreamMessage => {
    const path = paths[i] ?? fallbackParam
    if (message.role === "assistant" && "tool_calls" in message) {
      return {
        role: "assistant",
        content: message.content === null ? null : guard.text(message.content, paramOf(path, "content")),
        tool_calls: guard.toolCalls(message.tool_calls, paramOf(path, "tool_calls"))
      }
    }
    if (message.role === "tool") {
      return {
        role: "tool",
        tool_call_id: message.tool_call_id,
        content: guard.text(message.content, paramOf(path, "content"))
      }
    }
    const where = paramOf(path, "content")
    if (typeof message.content === "string") return { role: message.role, content: guard.text(message.content, where) }
    return {
      role: message.role,
      content: message.content.map((part) =>
        part.type === "text" ? { type: "text", text: guard.text(part.text, where) } : part
      )
    } as UpstreamMessage
  })
  if (guard.blocked !== undefined) {
    return { _tag: "Blocked", error: blockedInput(guard.blocked.finding, guard.blocked.where), tally: guard.tally }
  }
  return { _tag: "Passed", upstream: guarded, tally: guard.tally }
}

/** A JSON value (a Responses call's stored input) with every text redacted as the input was. */
export const redactedJson = <A>(scanner: Scanner, value: A): A =>
  new Guard(scanner, new Tally(), "input").json(value, "") as A

/** A whole answer under the output policy: redacted, or the finding that blocks it. */
export const guardAnswer = (
  scanner: Scanner,
  tally: Tally,
  answer: Answer
): { readonly answer: Answer } | { readonly blocked: Found } => {
  const guard = new Guard(scanner, tally, "output")
  const text = guard.text(answer.text, "")
  const toolCalls = guard.toolCalls(answer.toolCalls, "")
  if (guard.blocked !== undefined) return { blocked: guard.blocked.finding }
  // Logprobs would spell out what a redaction took away.
  return changesText(scanner)
    ? { answer: { text, toolCalls, logprobs: undefined, finishReason: answer.finishReason } }
    : { answer }
}

/**
 * A stream's output under the policy: its text and each tool call's arguments held back as
 * `Holdback` says. A tool call's arguments are whole when the next call starts or the stream ends.
 */
export class StreamGuard {
  readonly tally = new Tally()
  private readonly text: Holdback
  private readonly calls: Array<Holdback> = []
  private lastCall = -1
  /** Whether the policy changes what passes: then logprobs, which would spell out a redaction, are not sent. */
  readonly changes: boolean

  constructor(private readonly scanner: Scanner) {
    this.text = new Holdback(scanner, "output", this.tally)
    this.changes = changesText(scanner)
  }

  /** The finding that blocked the answer, once one did. */
  get blocked(): Found | undefined {
    return this.text.blocked ?? this.calls.find((call) => call.blocked !== undefined)?.blocked
  }

  delta(text: string): string {
    return this.text.push(text)
  }

  /** A tool call's next arguments; `ended`: the arguments of the call before it, released whole. */
  toolArguments(index: number, piece: string): { readonly shown: string; readonly ended?: readonly [number, string] } {
    let ended: readonly [number, string] | undefined
    if (index !== this.lastCall) {
      const previous = this.calls[this.lastCall]
      if (previous !== undefined) ended = [this.lastCall, previous.end()]
      this.lastCall = index
    }
    const holdback = this.calls[index] ?? (this.calls[index] = new Holdback(this.scanner, "output", this.tally))
    const shown = holdback.push(piece)
    return ended === undefined ? { shown } : { shown, ended }
  }

  /** The stream's end: the text's rest, and the last tool call's. */
  end(): { readonly text: string; readonly call: readonly [number, string] | undefined } {
    const text = this.text.end()
    const last = this.calls[this.lastCall]
    return { text, call: last === undefined ? undefined : [this.lastCall, last.end()] }
  }

  /** The answer as the caller was shown it. */
  shown(answer: Answer): Answer {
    return {
      text: this.text.shown,
      toolCalls: answer.toolCalls.map((call, i) => {
        const shown = this.calls[i]?.shown
        return shown === undefined
          ? call
          : { id: call.id, type: call.type, function: { name: call.function.name, arguments: shown } }
      }),
      logprobs: this.changes ? undefined : answer.logprobs,
      finishReason: answer.finishReason
    }
  }
}
