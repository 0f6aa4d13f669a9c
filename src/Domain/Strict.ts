import { DateTime, ParseResult, Schema } from "effect"

/** An unpaired UTF-16 surrogate: with the `u` flag a pair is one code point, so only a lone half matches. */
const LONE_SURROGATE = /\p{Cs}/u

/** Why PostgreSQL could not store `text`, or undefined when it can (text refuses U+0000; jsonb, a lone surrogate's escape). */
export const unstorable = (text: string): string | undefined =>
  text.includes("\u0000")
    ? "must not contain the character U+0000"
    : LONE_SURROGATE.test(text)
    ? "must not contain an unpaired UTF-16 surrogate (U+D800 to U+DFFF alone)"
    : undefined

/** `text` made storable: U+0000 and each lone surrogate become U+FFFD (what a UTF-8 decoder shows for them). */
export const storable = (text: string): string =>
  unstorable(text) === undefined ? text : text.replaceAll("\u0000", "\uFFFD").replace(/\p{Cs}/gu, "\uFFFD")

/**
 * A string PostgreSQL can store: its text type refuses U+0000, jsonb refuses
 * the escape of an unpaired surrogate, and a write that tried would fail (a
 * 500, or a settlement refused after the call answered). Every client string
 * that is kept or reaches SQL is one.
 */
export const SqlString = Schema.String.pipe(
  Schema.filter((text) => unstorable(text) ?? true)
)

// RFC 3339 section 5.6: full-date "T" full-time; seconds may carry a fraction; a zone is required.
const RFC3339 = /^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?([Zz]|([+-])(\d{2}):(\d{2}))$/

const daysIn = (year: number, month: number): number =>
  month === 2
    ? (year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0) ? 29 : 28)
    : [4, 6, 9, 11].includes(month)
    ? 30
    : 31

/** The instant of an RFC 3339 date-time, or undefined when the text is not one (2024-06-31, 24:00, no zone). */
export const parseRfc3339 = (text: string): Date | undefined => {
  const parts = RFC3339.exec(text)
  if (parts === null) return undefined
  const [year, month, day, hour, minute, second] = parts.slice(1, 7).map(Number) as [
    number,
    number,
    number,
    number,
    number,
    number
  ]
  const zoneHours = parts[10] === undefined ? 0 : Number(parts[10])
  const zoneMinutes = parts[11] === undefined ? 0 : Number(parts[11])
  const valid = month >= 1 && month <= 12 && day >= 1 && day <= daysIn(year, month) && hour <= 23 && minute <= 59 &&
    second <= 59 && zoneHours <= 23 && zoneMinutes <= 59
  if (!valid) return undefined
  const date = new Date(text.replace(" ", "T"))
  return Number.isNaN(date.getTime()) ? undefined : date
}

/**
 * An RFC 3339 date-time (`2024-06-30T00:00:00Z`, `2024-06-30T08:00:00+08:00`),
 * decoded to a UTC DateTime. Unlike `Date`, it refuses what is not one rather
 * than guessing: `2024-06-31` is not read as 1 July.
 */
export const Rfc3339DateTime = Schema.transformOrFail(Schema.String, Schema.DateTimeUtcFromSelf, {
  strict: true,
  decode: (text, _, ast) => {
    const date = parseRfc3339(text)
    return date === undefined
      ? ParseResult.fail(new ParseResult.Type(ast, text, "must be an RFC 3339 date-time, e.g. 2024-06-30T00:00:00Z"))
      : ParseResult.succeed(DateTime.unsafeMake(date))
  },
  encode: (dateTime) => ParseResult.succeed(DateTime.formatIso(dateTime))
}).annotations({ identifier: "DateTime", description: "An RFC 3339 date-time, e.g. 2024-06-30T00:00:00Z" })

/** Deeper JSON is no request a client means; the schema's error formatter would recurse through all of it. */
export const MAX_JSON_DEPTH = 64

/** True when a JSON text nests arrays and objects deeper than `max`: one pass, no recursion. */
export const jsonDeeperThan = (text: string, max: number): boolean => {
  let depth = 0
  let inString = false
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (inString) {
      if (c === 0x5c) i++ // a backslash escapes the next character
      else if (c === 0x22) inString = false
    } else if (c === 0x22) inString = true
    else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) return true
    } else if (c === 0x5d || c === 0x7d) depth--
  }
  return false
}

const storableKeys = (object: object): object =>
  Object.fromEntries(Object.entries(object).map(([key, value]) => [storable(key), value]))

/**
 * `value` as JSON that jsonb and text both take, whatever its strings hold:
 * U+0000 and lone surrogates, in keys as in values, become U+FFFD.
 */
export const storableJson = (value: unknown): string =>
  JSON.stringify(value, (_key, field: unknown) =>
    typeof field === "string"
      ? storable(field)
      : typeof field === "object" && field !== null && !Array.isArray(field) &&
          Object.keys(field).some((key) => unstorable(key) !== undefined)
      ? storableKeys(field)
      : field)

/**
 * A list's query parameters: one it does not take answers 400 `invalid_request` naming it
 * (`param`), rather than being dropped, so a misspelt filter never returns the unfiltered list.
 */
export const StrictUrlParams = <Fields extends Schema.Struct.Fields>(fields: Fields) =>
  Schema.Struct(fields).annotations({ parseOptions: { onExcessProperty: "error" } })

/** A list that takes no query parameters: any one answers 400 naming it (an empty `Schema.Struct` would accept every object). */
export const NoUrlParams = Schema.Struct({}).pipe(Schema.filter((params) => {
  const [first] = Object.keys(params)
  return first === undefined || { path: [first], message: "is not a parameter of this list (it takes none)" }
}))
