import { DateTime, Effect } from "effect"
import { InvalidRequest } from "../Domain/Errors.js"

/** The time range of a logs or usage read, as the dashboard's `from` and `to` give it. */

/** PostgreSQL holds no instant before 4714 BC, which a JavaScript date can name; years 1–9999 are plenty. */
const EARLIEST = Date.parse("0001-01-01T00:00:00Z")
const LATEST = Date.parse("9999-12-31T23:59:59.999Z")

export const dateOf = (at: DateTime.Utc | undefined): Date | undefined =>
  at === undefined ? undefined : DateTime.toDate(at)

export interface Range {
  readonly from?: Date | undefined
  readonly to?: Date | undefined
}

/** The instants a caller gave are within range, and the effective `from` is before `to`. */
export const checkRange = (given: Range, { from, to }: Range = given) =>
  Effect.gen(function*() {
    for (const param of ["from", "to"] as const) {
      const at = given[param]?.getTime()
      if (at !== undefined && (at < EARLIEST || at > LATEST)) {
        return yield* new InvalidRequest({ message: `'${param}' must be between 0001-01-01 and 9999-12-31.`, param })
      }
    }
    if (from !== undefined && to !== undefined && from >= to) {
      return yield* new InvalidRequest({ message: "'from' must be earlier than 'to'.", param: "from" })
    }
  })
