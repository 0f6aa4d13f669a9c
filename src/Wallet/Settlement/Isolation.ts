import type { SqlError } from "@effect/sql"
import { Cause, Effect, Exit } from "effect"

/** The SQLSTATE of a database's refusal, unless it says the connection, the server or the transaction's luck failed. */
export const refusalOf = (cause: Cause.Cause<unknown>): string | undefined => {
  for (const failure of Cause.failures(cause)) {
    const inner = typeof failure === "object" && failure !== null && "cause" in failure ? failure.cause : undefined
    const code = typeof inner === "object" && inner !== null && "code" in inner ? inner.code : undefined
    // 08 connection, 40 deadlock or serialization, 53 resources, 55 lock not available, 57 shutdown, 58 and XX the server.
    if (typeof code === "string" && code.length === 5 && !/^(08|40|53|55|57|58|XX)/.test(code)) return code
  }
  return undefined
}

/** What writing a refused batch in parts came to. */
export interface Isolated<A> {
  /** Some part was written. */
  readonly written: boolean
  /** The last failure that was no refusal: the database did not answer. */
  readonly unanswered: Cause.Cause<SqlError.SqlError> | undefined
  /** What was not written for want of an answer, in its order: first in line again. */
  readonly kept: ReadonlyArray<A>
}

/**
 * Writes a batch the database refused (docs/money.md, "Parking and replay"): in halves, a half
 * refused again split in two, until each part is written or is one entry
 * the database refuses (`refuse`d, to be retried alone and parked). k such
 * entries among n cost about 2k·log2(n) transactions, not n, so the rest
 * flows on at the speed of batches; the entries keep their order.
 */
export const writeInParts = <A>(
  entries: ReadonlyArray<A>,
  writePart: (part: ReadonlyArray<A>) => Effect.Effect<void, SqlError.SqlError>,
  refuse: (entry: A, cause: Cause.Cause<SqlError.SqlError>) => void
): Effect.Effect<Isolated<A>> =>
  Effect.gen(function*() {
    const outcome: { written: boolean; unanswered: Cause.Cause<SqlError.SqlError> | undefined; kept: Array<A> } = {
      written: false,
      unanswered: undefined,
      kept: []
    }
    const halves = (part: ReadonlyArray<A>): Effect.Effect<void> => {
      const half = Math.ceil(part.length / 2)
      return Effect.zipRight(attempt(part.slice(0, half)), attempt(part.slice(half)))
    }
    const attempt = (part: ReadonlyArray<A>): Effect.Effect<void> =>
      Effect.gen(function*() {
        const [only] = part
        if (only === undefined) return
        const exit = yield* Effect.exit(writePart(part))
        if (Exit.isSuccess(exit)) {
          outcome.written = true
        } else if (refusalOf(exit.cause) === undefined) {
          outcome.unanswered = exit.cause
          outcome.kept.push(...part)
        } else if (part.length === 1) {
          refuse(only, exit.cause)
        } else {
          yield* halves(part)
        }
      })
    // The whole batch was refused already: its halves first.
    yield* entries.length > 1 ? halves(entries) : attempt(entries)
    return outcome
  })
