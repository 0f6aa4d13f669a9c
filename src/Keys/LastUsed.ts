import { Context, Duration, Effect, Layer, Option, Schedule } from "effect"
import { KeysRepo } from "./Repo.js"

/**
 * `last_used_at` without a write per request: uses are kept in memory, the
 * latest per key, and written in one statement every few seconds and at shutdown.
 */
export class KeyLastUsed extends Context.Tag("nenas/KeyLastUsed")<KeyLastUsed, {
  readonly touch: (keyId: string, at: Date) => Effect.Effect<void>
  /** A use not written yet, so that listings are exact on this instance. */
  readonly pending: (keyId: string) => Option.Option<Date>
  readonly flush: Effect.Effect<void>
}>() {
  static readonly layer = (interval: Duration.DurationInput = "5 seconds") =>
    Layer.scoped(
      KeyLastUsed,
      Effect.gen(function*() {
        const repo = yield* KeysRepo
        let uses = new Map<string, Date>()
        const keep = (id: string, at: Date) => {
          const known = uses.get(id)
          if (known === undefined || known < at) uses.set(id, at)
        }
        const flush = Effect.suspend(() => {
          if (uses.size === 0) return Effect.void
          const batch = uses
          uses = new Map()
          return repo.recordLastUsed(Array.from(batch, ([id, at]) => ({ id, at }))).pipe(
            Effect.catchAll((error) =>
              Effect.logWarning("last_used_at not written; kept for the next flush", error).pipe(
                Effect.tap(() => batch.forEach((at, id) => keep(id, at)))
              )
            )
          )
        })
        yield* Effect.forkScoped(Effect.repeat(flush, Schedule.spaced(interval)).pipe(Effect.delay(interval)))
        yield* Effect.addFinalizer(() => flush)
        return KeyLastUsed.of({
          touch: (keyId, at) => Effect.sync(() => keep(keyId, at)),
          pending: (keyId) => Option.fromNullable(uses.get(keyId)),
          flush
        })
      })
    )
}
