import { SqlClient } from "@effect/sql"
import { Effect, Layer, Option, Redacted, Scope } from "effect"
import { AppConfig } from "../../src/AppConfig.js"
import { PaymentsRepo } from "../../src/Billing/Repo.js"
import { DatabaseLive } from "../../src/Database/Database.js"
import { newId } from "../../src/Domain/Ids.js"
import { RequestLogs } from "../../src/Logs/RequestLogs.js"
import { ReservationLeases } from "../../src/Wallet/Instances/Leases.js"
import { ReservationSweeper } from "../../src/Wallet/Instances/Sweeper.js"
import { checkInvariant } from "../../src/Wallet/Invariant.js"
import { WalletRepo } from "../../src/Wallet/Repo.js"
import { call, devToken } from "./Http.js"
import { query, TestServer } from "./TestServer.js"

/**
 * The wallet repository with what it needs (request logs, this process's
 * leases), on a database layer's SqlClient and AppConfig: what AccountsRepo
 * opens new accounts' wallets with.
 */
export const WalletRepoLive = WalletRepo.layer.pipe(
  Layer.provide(Layer.merge(RequestLogs.layer, ReservationLeases.layer()))
)

/**
 * A second service instance's money parts (wallet, leases, sweeper, payments
 * repository) on the test server's database, as another process would have
 * them. Closing `scope` stops its lease renewals: the instance has died.
 */
export const walletInstance = (scope: Scope.Scope) =>
  Effect.gen(function*() {
    const { clock, databaseUrl } = yield* TestServer
    const config = AppConfig.layerWith({
      databaseUrl: Option.some(Redacted.make(databaseUrl)),
      instanceId: newId("test")
    })
    const layer = Layer.mergeAll(ReservationSweeper.layer, PaymentsRepo.layer).pipe(
      Layer.provideMerge(WalletRepo.layer),
      Layer.provideMerge(RequestLogs.layer),
      Layer.provideMerge(ReservationLeases.layer()),
      Layer.provideMerge(DatabaseLive),
      Layer.provideMerge(config),
      Layer.provide(Layer.setClock(clock))
    )
    const context = yield* Layer.buildWithScope(layer, scope)
    return {
      wallet: context.unsafeMap.get(WalletRepo.key) as WalletRepo["Type"],
      sweeper: context.unsafeMap.get(ReservationSweeper.key) as ReservationSweeper["Type"],
      leases: context.unsafeMap.get(ReservationLeases.key) as ReservationLeases["Type"],
      /** Runs an effect that needs the instance's services, on the server's clock. */
      run: <A, E>(effect: Effect.Effect<A, E, WalletRepo | SqlClient.SqlClient | PaymentsRepo | ReservationSweeper>) =>
        effect.pipe(Effect.provide(context), Effect.withClock(clock)),
      /** The ledger invariant (docs/money.md, "The ledger invariant"): `violations` empty when it holds. */
      invariant: (accountId: string) => checkInvariant(accountId).pipe(Effect.provide(context), Effect.orDie)
    }
  })

/** A signed-in developer: a session token and the account it belongs to. */
export const developer = (email: string) =>
  Effect.gen(function*() {
    const token = yield* devToken(email)
    // The account is made at the first signed-in dashboard call.
    yield* call("GET", "/dashboard/billing/balance", { token })
    const rows = yield* query<{ id: string }>("SELECT id FROM accounts WHERE email = $1", [email.toLowerCase()])
    const accountId = rows[0]?.id
    if (accountId === undefined) throw new Error(`no account for ${email}`)
    return { token, accountId }
  })
