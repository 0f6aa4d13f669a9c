import { type ChildProcess, execFile, spawn } from "node:child_process"
import { readFile, rm, stat } from "node:fs/promises"
import { createServer } from "node:net"
import { platform } from "node:os"
import { join } from "node:path"
import { promisify } from "node:util"

/**
 * Running PostgreSQL's programs for the embedded database: free ports, the
 * server started and stopped, orphans of an earlier start reclaimed, and the
 * programs' failures explained in one line.
 */

/** A start-up failure whose message already names the cause and what to do. */
export class StartFailure extends Error {}

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

export const runFile = promisify(execFile)
export const exists = (path: string) => stat(path).then(() => true, () => false)
export const oneLine = (text: string) => text.replace(/\s+/g, " ").trim()

/** The user PostgreSQL runs as: `postgres` when we are root, else ourselves (no ids). */
export interface RunAs {
  readonly uid?: number
  readonly gid?: number
}

export interface Binaries {
  /** The installation's root, holding bin/, lib/ and share/ (PostgreSQL finds them relative to its binaries). */
  readonly home: string
  readonly postgres: string
  readonly initdb: string
  /** Where the binaries were installed by npm, for messages. */
  readonly installed: string
}

export const binariesIn = (home: string, installed: string): Binaries => {
  const exe = platform() === "win32" ? ".exe" : ""
  return { home, postgres: join(home, "bin", `postgres${exe}`), initdb: join(home, "bin", `initdb${exe}`), installed }
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
  const ask = (field: string) =>
    runFile("ps", ["-o", `${field}=`, "-p", String(pid)]).then(({ stdout }) => stdout.trim(), () => "")
  const [args, parent] = await Promise.all([ask("args"), ask("ppid").then(Number)])
  return { args, parent }
}

/**
 * The service a server's parent runs for, while it runs: the supervisor's
 * owner as long as the supervisor is still its child (a supervisor whose
 * service died is handed to init), or a node parent (what earlier versions
 * started PostgreSQL from); none for an orphan.
 */
const ownerOf = async (parentPid: number): Promise<number | undefined> => {
  if (parentPid <= 1) return undefined
  const parent = await processInfo(parentPid)
  if (parent.args.startsWith(SUPERVISOR_TITLE)) {
    const owner = Number(/owner=(\d+)/.exec(parent.args)?.[1])
    return parent.parent === owner ? owner : undefined
  }
  return /node/.test(parent.args) ? parentPid : undefined
}

/**
 * A service that was killed (SIGKILL, a crash) leaves its PostgreSQL running
 * until its supervisor has stopped it (within 2 s; for earlier versions,
 * forever) and holding the cluster. Such an orphan is stopped so that this
 * start can take over; a cluster whose owner is still running is left alone.
 * A lock file naming a live process that is not this cluster's server (its pid
 * reused after a reboot or in a new container) is stale, and removed.
 */
export const reclaimOrphan = async (clusterDir: string): Promise<void> => {
  const lockFile = join(clusterDir, "postmaster.pid")
  const lock = await readFile(lockFile, "utf8").catch(() => undefined)
  const pid = Number(lock?.split("\n")[0])
  if (!Number.isInteger(pid) || pid <= 0 || !isAlive(pid)) return // a dead pid: PostgreSQL recovers on its own
  const server = await processInfo(pid)
  if (!/postgres/.test(server.args) || !server.args.includes(clusterDir)) {
    await rm(lockFile, { force: true })
    return
  }
  const owner = await ownerOf(server.parent)
  if (owner !== undefined && owner !== process.pid) {
    throw new StartFailure(
      `the embedded database in ${clusterDir} belongs to another running process (pid ${owner}): ` +
        "stop it, or give this one another DATA_DIR"
    )
  }
  process.kill(pid, "SIGINT") // PostgreSQL's fast shutdown
  for (let waited = 0; isAlive(pid); waited += 100) {
    if (waited > 30_000) {
      throw new StartFailure(
        `an orphaned embedded database (pid ${pid}) holds ${clusterDir} and did not stop: stop it and start again`
      )
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
    return `the database in ${clusterDir} was made by another PostgreSQL version: ${
      oneLine(log.split("\n").find((line) => /DETAIL/.test(line)) ?? "")
    }`
  }
  if (/Permission denied/.test(log)) {
    return `PostgreSQL cannot use ${clusterDir} (${what}: ${
      oneLine(log.split("\n").find((line) => /Permission denied/.test(line)) ?? "")
    }): ` +
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
export const runToEnd = (
  binaries: Binaries,
  binary: string,
  args: Array<string>,
  runAs: RunAs,
  cwd: string,
  clusterDir: string
) =>
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

/** A running PostgreSQL; `stop` is its fast shutdown, resolved when it has exited. */
export interface EmbeddedServer {
  /** The supervisor's pid (PostgreSQL's is in the cluster's `postmaster.pid`). */
  readonly pid: () => number | undefined
  readonly stop: () => Promise<void>
  /** Starts the stopped server again on the same port (the reliability suite restarts the database). */
  readonly start: () => Promise<void>
}

export const serverOf = (first: ChildProcess, restart: () => Promise<ChildProcess>): EmbeddedServer => {
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

/** Names the supervisor in `ps` (with its owner's pid), so that a later start can tell whose server it is. */
export const SUPERVISOR_TITLE = "nenas-postgres-supervisor"
/** What the supervisor prints when PostgreSQL's binary cannot be started at all, followed by the error's code. */
const SPAWN_FAILED = `${SUPERVISOR_TITLE}: cannot run postgres:`

/**
 * The supervisor, a small node program between the service and PostgreSQL.
 * It holds the read end of a pipe whose only writer is the service: when the
 * service is gone, however it died (SIGKILL included), the pipe ends and the
 * supervisor stops PostgreSQL, fast shutdown first, then immediate, then
 * SIGKILL, so that nothing of it outlives the service by 2 s. Signals from
 * the service (its own `stop`) are passed on as they are. It exits as
 * PostgreSQL does. Given with `-e`: no file to find, whatever user runs it
 * and whether the service runs from source or compiled.
 */
const SUPERVISOR = `
const { spawn } = require("node:child_process")
const { command, args, uid, gid, title } = JSON.parse(process.argv[1])
process.title = title
process.stderr.on("error", () => {})
const server = spawn(command, args, { uid, gid, stdio: ["ignore", "ignore", "inherit"] })
const forwarded = ["SIGINT", "SIGTERM", "SIGQUIT"]
for (const signal of forwarded) process.on(signal, () => server.kill(signal))
server.on("error", (error) => {
  process.stderr.write(${JSON.stringify(SPAWN_FAILED)} + " " + (error.code || error.message) + "\\n")
  process.exit(127)
})
server.on("exit", (code, signal) => {
  if (signal === null) process.exit(code === null ? 1 : code)
  for (const name of forwarded) process.removeAllListeners(name)
  process.kill(process.pid, signal)
})
let orphaned = false
const serviceGone = () => {
  if (orphaned) return
  orphaned = true
  server.kill("SIGINT")
  setTimeout(() => server.kill("SIGQUIT"), 600).unref()
  setTimeout(() => server.kill("SIGKILL"), 1400).unref()
}
process.stdin.on("end", serviceGone)
process.stdin.on("error", serviceGone)
process.stdin.resume()
`

/** The supervisor's environment: PostgreSQL's, without a loader (tsx) the service may have been started with. */
const supervisorEnv = () => {
  const env: NodeJS.ProcessEnv = childEnv()
  delete env["NODE_OPTIONS"]
  return env
}

/**
 * Starts the server under its supervisor, resolved once it accepts
 * connections; its log keeps being drained (and dropped) after.
 */
export const startServer = (binaries: Binaries, clusterDir: string, port: number, runAs: RunAs, cwd: string) =>
  new Promise<ChildProcess>((resolveStart, reject) => {
    const args = [
      "-D",
      clusterDir,
      "-p",
      String(port),
      "-c",
      "listen_addresses=127.0.0.1",
      "-c",
      "unix_socket_directories="
    ]
    const plan = {
      command: binaries.postgres,
      args,
      ...runAs,
      title: `${SUPERVISOR_TITLE} owner=${process.pid} ${clusterDir}`
    }
    const child = spawn(process.execPath, ["-e", SUPERVISOR, JSON.stringify(plan)], {
      cwd,
      env: supervisorEnv(),
      // Its stdin is the pipe it watches; PostgreSQL's log comes on its stderr.
      stdio: ["pipe", "ignore", "pipe"],
      // A process group of its own: Ctrl-C (SIGINT to the terminal's foreground group) and `kill -TERM -PGID`
      // would stop PostgreSQL at once, under the calls still draining. It is stopped only by us, after the drain,
      // or by the supervisor when we are gone.
      detached: true
    })
    // Nothing is ever written: the pipe only ends, when this process does.
    child.stdin?.on("error", () => {})
    let log = ""
    let ready = false
    child.stderr?.on("data", (chunk) => {
      if (ready) return
      log = (log + chunk).slice(-16_000)
      if (log.includes("database system is ready to accept connections")) {
        ready = true
        resolveStart(child)
      }
    })
    child.once("error", (error) => reject(new StartFailure(explainSpawn(process.execPath, binaries, error, {}))))
    child.once("close", (code, signal) => {
      if (ready) return
      const notRun = new RegExp(`${SPAWN_FAILED} (\\S+)`).exec(log)
      if (notRun !== null) {
        const error: NodeJS.ErrnoException = new Error(notRun[1])
        error.code = notRun[1]
        reject(new StartFailure(explainSpawn(binaries.postgres, binaries, error, runAs)))
      } else if (/could not bind|Address already in use/.test(log)) {
        reject(new PortTaken(explainLog(log, clusterDir, "postgres")))
      } else if (code === null) {
        reject(new StartFailure(`PostgreSQL was stopped by ${signal} while starting: start again`))
      } else reject(new StartFailure(explainLog(log, clusterDir, "postgres")))
    })
  })

/** The kernel's free port can be taken by someone else before PostgreSQL binds it: then another is tried. */
export const startOnFreePort = async (binaries: Binaries, clusterDir: string, runAs: RunAs, cwd: string) => {
  for (let attempt = 1;; attempt++) {
    const port = await freePort()
    try {
      return { child: await startServer(binaries, clusterDir, port, runAs, cwd), port }
    } catch (error) {
      if (!(error instanceof PortTaken)) throw error
      if (attempt === 5) {
        throw new StartFailure(
          `no loopback port stayed free for the embedded database (${error.message}): free some ports and start again`
        )
      }
    }
  }
}
