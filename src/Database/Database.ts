import * as NodeContext from "@effect/platform-node/NodeContext"
import { Migrator } from "@effect/sql"
import { PgClient, PgMigrator } from "@effect/sql-pg"
import { Effect, Layer, Option, String as Str } from "effect"
import pg from "pg"
import { migrations } from "../../migrations/index.js"
import { AppConfig } from "../AppConfig.js"
// Needs no development dependency to load: it resolves the PostgreSQL binaries only when it starts them.
import { startEmbeddedPostgres } from "./EmbeddedPostgres.js"
import { makePool } from "./Pool.js"

const INT8_OID = 20

/** bigint columns hold micro-MYR; every amount we store is a safe integer, and we check it. */
const parseInt8 = (text: string): number => {
  const value = Number(text)
  if (!Number.isSafeInteger(value)) throw new RangeError(`bigint out of safe range: ${text}`)
  return value
}

const types: pg.CustomTypesConfig = {
  getTypeParser:
    ((oid: number, format?: "text" | "binary") =>
      oid === INT8_OID ? parseInt8 : pg.types.getTypeParser(oid, format)) as pg.CustomTypesConfig["getTypeParser"]
}

/**
 * PostgreSQL from `DATABASE_URL`, or embedded when unset (in `DATA_DIR/pg`; as root, under /var/lib/nenas);
 * the migrations in `migrations/` are applied before anything else uses it.
 */
export const DatabaseLive = Layer.unwrapScoped(
  Effect.gen(function*() {
    const config = yield* AppConfig
    const url = Option.isSome(config.databaseUrl)
      ? config.databaseUrl.value
      : (yield* startEmbeddedPostgres(config.dataDir)).url
    const client = PgClient.layerFromPool({
      acquire: makePool({ url, types, max: 20 }),
      applicationName: "nenas",
      types,
      transformResultNames: Str.snakeToCamel,
      transformQueryNames: Str.camelToSnake
    })
    const migrator = PgMigrator.layer({ loader: Migrator.fromRecord(migrations) }).pipe(
      Layer.provide(NodeContext.layer)
    )
    return Layer.provideMerge(migrator, client)
  })
)
