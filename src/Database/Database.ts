import { readdir } from "node:fs/promises"
import { join } from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"
import { NodeContext } from "@effect/platform-node"
import { Migrator } from "@effect/sql"
import { PgClient, PgMigrator } from "@effect/sql-pg"
import { Effect, Layer, Option, String as Str } from "effect"
import pg from "pg"
import { AppConfig } from "../AppConfig.js"
import { startEmbeddedPostgres } from "./EmbeddedPostgres.js"

const INT8_OID = 20

/** bigint columns hold micro-MYR; every amount we store is a safe integer, and we check it. */
const parseInt8 = (text: string): number => {
  const value = Number(text)
  if (!Number.isSafeInteger(value)) throw new RangeError(`bigint out of safe range: ${text}`)
  return value
}

const types: pg.CustomTypesConfig = {
  getTypeParser: ((oid: number, format?: "text" | "binary") =>
    oid === INT8_OID ? parseInt8 : pg.types.getTypeParser(oid, format)) as pg.CustomTypesConfig["getTypeParser"]
}

export const migrationsDirectory = fileURLToPath(new URL("../../migrations", import.meta.url))

/**
 * Numbered files `migrations/NNNN_name.ts`, each exporting an Effect. Imported
 * from here rather than by the migrator so that tsx and vitest both load them.
 */
const loadMigrations: Migrator.Loader = Effect.tryPromise({
  try: async () => {
    const files = (await readdir(migrationsDirectory)).filter((file) => /^\d+_\w+\.ts$/.test(file)).sort()
    return Promise.all(files.map(async (file): Promise<Migrator.ResolvedMigration> => {
      const [, id = "", name = ""] = /^(\d+)_(\w+)\.ts$/.exec(file) ?? []
      const module = await import(pathToFileURL(join(migrationsDirectory, file)).href)
      return [Number(id), name, Effect.succeed(module.default)]
    }))
  },
  catch: (cause) => new Migrator.MigrationError({ reason: "import-error", message: `migrations not loaded: ${String(cause)}` })
})

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
    const client = PgClient.layer({
      url,
      types,
      maxConnections: 20,
      applicationName: "nenas",
      transformResultNames: Str.snakeToCamel,
      transformQueryNames: Str.camelToSnake
    })
    const migrations = PgMigrator.layer({ loader: loadMigrations }).pipe(Layer.provide(NodeContext.layer))
    return Layer.provideMerge(migrations, client)
  })
)
