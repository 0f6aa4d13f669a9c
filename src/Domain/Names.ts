import { Schema } from "effect"
import { SqlString } from "./Strict.js"

/** How long a person's or an account's name may be where it reaches an email. */
export const MAX_NAME_LENGTH = 100

/** Controls and the Unicode line and paragraph separators: anything that could start a new line in a mail reader. */
const LINE_BREAKING = /[\p{Cc}\u2028\u2029]+/gu

/**
 * An email's one comparable form: NFKC, then case-folded (lower case, normalised again). Undefined when the
 * address is not already in NFKC form: a look-alike (a Kelvin sign for `k`) is refused, not folded into another's.
 */
export const emailForm = (email: string): string | undefined => {
  const trimmed = email.trim()
  if (trimmed.normalize("NFKC") !== trimmed) return undefined
  return trimmed.toLowerCase().normalize("NFKC")
}

/** A name from a token's claims, fit for an email: one line, spaces collapsed, at most `MAX_NAME_LENGTH` characters; null when empty. */
export const singleLineName = (name: string): string | null => {
  const line = name.replace(LINE_BREAKING, " ").replace(/\s+/g, " ").trim().slice(0, MAX_NAME_LENGTH).trim()
  return line.length === 0 ? null : line
}

/** A name quoted where an email shows it, so that the reader sees where what its owner typed begins and ends. */
export const quotedName = (name: string): string => `"${(singleLineName(name) ?? "").replaceAll("\"", "'")}"`

/** A name a client gives: stored and mailed, so on one line and capped. */
export const SingleLineName = SqlString.pipe(
  Schema.minLength(1),
  Schema.maxLength(MAX_NAME_LENGTH),
  Schema.filter((name) =>
    !/[\p{Cc}\u2028\u2029]/u.test(name) || "must be a single line (no line breaks or control characters)"
  )
)

/** An email a client gives, compared after NFKC and case folding: one not in NFKC form is refused. */
export const EmailAddress = Schema.compose(Schema.Trim, SqlString).pipe(
  Schema.pattern(/^[^\s@]+@[^\s@]+$/, { message: () => "must be an email address" }),
  Schema.maxLength(254),
  Schema.filter((email) =>
    emailForm(email) !== undefined || "must be in Unicode NFKC form (no look-alike characters such as the Kelvin sign)"
  )
)
