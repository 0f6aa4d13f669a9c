import { SqlClient } from "@effect/sql"
import { expect, layer } from "@effect/vitest"
import { Context, Effect, Layer, Option, Redacted } from "effect"
import { AccountsRepo } from "../../../src/Accounts/Repo.js"
import { AppConfig } from "../../../src/AppConfig.js"
import { DatabaseLive } from "../../../src/Database/Database.js"
import { newId } from "../../../src/Domain/Ids.js"
import { hashKey } from "../../../src/Keys/ApiKeys.js"
import { KeyLastUsed } from "../../../src/Keys/LastUsed.js"
import { KeysRepo } from "../../../src/Keys/Repo.js"
import { MembersRepo } from "../../../src/Members/Repo.js"
import { freshDatabase } from "../../support/TestServer.js"
import { WalletRepoLive } from "../../support/Wallet.js"

const Database = Layer.unwrapScoped(
  Effect.map(
    freshDatabase,
    ({ url }) =>
      DatabaseLive.pipe(Layer.provideMerge(AppConfig.layerWith({ databaseUrl: Option.some(Redacted.make(url)) })))
  )
)

const Repos = Layer.mergeAll(KeysRepo.layer, AccountsRepo.layer).pipe(
  Layer.provide(Layer.merge(WalletRepoLive, MembersRepo.layer)),
  Layer.provideMerge(Database)
)

layer(Repos, { excludeTestServices: true })("last_used_at", (it) => {
  const makeKey = Effect.gen(function*() {
    const accounts = yield* AccountsRepo
    const keys = yield* KeysRepo
    const account = yield* accounts.signIn({ issuer: "test", subject: newId("sub"), email: null, name: null })
    return yield* keys.create({
      id: newId("key"),
      accountId: account.id,
      name: "k",
      prefix: "nns_live_abc",
      environment: "live",
      keyHash: hashKey(newId("secret")),
      monthlySpendLimitMicroMyr: null,
      expiresAt: null
    })
  })
  const stored = (id: string) =>
    Effect.flatMap(
      SqlClient.SqlClient,
      (sql) => sql<{ lastUsedAt: Date | null }>`SELECT last_used_at FROM api_keys WHERE id = ${id}`
    ).pipe(
      Effect.map((rows) => rows[0]?.lastUsedAt ?? null)
    )

  it.effect("many uses become one write of the latest time, on the interval and at shutdown", () =>
    Effect.gen(function*() {
      const a = yield* makeKey
      const b = yield* makeKey
      const t1 = new Date("2026-01-01T00:00:01Z")
      const t2 = new Date("2026-01-01T00:00:02Z")
      yield* Effect.scoped(Effect.gen(function*() {
        const tracker = Context.get(yield* Layer.build(KeyLastUsed.layer("1 hour")), KeyLastUsed)
        yield* tracker.touch(a.id, t2)
        yield* tracker.touch(a.id, t1)
        yield* tracker.touch(b.id, t1)
        expect(Option.getOrNull(tracker.pending(a.id))).toEqual(t2)
        expect(yield* stored(a.id)).toBeNull()
      }))
      // The scope closed: its finalizer flushed both keys in one statement.
      expect(yield* stored(a.id)).toEqual(t2)
      expect(yield* stored(b.id)).toEqual(t1)
    }))

  it.effect("an older use never moves last_used_at back", () =>
    Effect.gen(function*() {
      const keys = yield* KeysRepo
      const key = yield* makeKey
      yield* keys.recordLastUsed([{ id: key.id, at: new Date("2026-03-01T00:00:00Z") }])
      yield* keys.recordLastUsed([{ id: key.id, at: new Date("2026-02-01T00:00:00Z") }])
      expect(yield* stored(key.id)).toEqual(new Date("2026-03-01T00:00:00Z"))
    }))
})
