import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import { Console, Effect, Layer, Option } from "effect"
import { AppConfig } from "../AppConfig.js"
import { DatabaseLive } from "../Database/Database.js"
import { Consolidation } from "./Consolidation.js"
import { EInvoiceRepo } from "./EInvoiceRepo.js"

/**
 * `DATABASE_URL=postgres://… npm run einvoice:consolidate -- --month 2026-11`: consolidates an ended month's
 * documents into its consolidated e-invoices, as the scheduler does in the first days after the month
 * (docs/api/e-invoices.md, "Consolidated e-invoices"). Idempotent: a month already consolidated makes nothing.
 * The running service submits what it made. With `npm start`'s embedded database, use
 * `POST /dev/e-invoices/consolidate` instead.
 */
const monthArgument = (argv: ReadonlyArray<string>): string | undefined => {
  const index = argv.indexOf("--month")
  const inline = argv.find((argument) => argument.startsWith("--month="))
  return inline === undefined ? (index >= 0 ? argv[index + 1] : undefined) : inline.slice("--month=".length)
}

const program = Effect.gen(function*() {
  const config = yield* AppConfig
  const month = monthArgument(process.argv.slice(2))
  if (month === undefined) {
    yield* Console.error("usage: npm run einvoice:consolidate -- --month YYYY-MM")
    return 2
  }
  if (Option.isNone(config.databaseUrl)) {
    yield* Console.error(
      "einvoice:consolidate needs DATABASE_URL (the service's database); with npm start's embedded database, " +
        "POST /dev/e-invoices/consolidate does the same"
    )
    return 2
  }
  const outcome = yield* Effect.flatMap(Consolidation, (consolidation) => consolidation.consolidate(month)).pipe(
    Effect.provide(Consolidation.layer.pipe(Layer.provide(EInvoiceRepo.layer), Layer.provide(DatabaseLive))),
    Effect.either
  )
  if (outcome._tag === "Left") {
    yield* Console.error(outcome.left._tag === "InvalidRequest" ? outcome.left.message : String(outcome.left))
    return 1
  }
  if (outcome.right.created.length === 0) yield* Console.log(`${month}: nothing to consolidate (done already)`)
  for (const part of outcome.right.created) {
    yield* Console.log(`${part.codeNumber}: ${part.documents} documents in ${part.lines} lines`)
  }
  return 0
})

program.pipe(
  Effect.provide(AppConfig.layer),
  Effect.flatMap((code) => Effect.sync(() => void (process.exitCode = code))),
  NodeRuntime.runMain
)
