import { chmod, chown, mkdir, mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { embeddedClusterLocation, freePort, ROOT_STATE_DIR } from "../../../src/Database/EmbeddedPostgres.js"
import {
  isRoot,
  linesOf,
  nobody,
  type RunAs,
  type ServiceProcess,
  startService,
  stopService
} from "../../support/ServiceProcess.js"

// arbitrary JSON: each check below names the fields it expects
const json = async (response: Response): Promise<{ status: number; body: any }> => ({
  status: response.status,
  body: await response.json()
})

/**
 * The two places the embedded cluster lives: `DATA_DIR/pg` for an ordinary
 * user, and for root a folder of its own under /var/lib/nenas that the
 * `postgres` user owns (PostgreSQL will not run as root).
 */
const unprivileged = isRoot() ? nobody() : undefined
const layouts = [
  {
    name: "as an unprivileged user, in DATA_DIR/pg",
    // When the tests run as root, the service runs as `nobody`.
    runAs: unprivileged,
    skip: isRoot() && unprivileged === undefined ? "there is no `nobody` user to run the service as" : undefined,
    clusterOf: async (dataDir: string) => join(dataDir, "pg")
  },
  {
    name: "as root, in a folder of its own under /var/lib/nenas",
    runAs: undefined,
    skip: isRoot() ? undefined : "only root can start the service as root",
    clusterOf: async (dataDir: string) => (await embeddedClusterLocation(dataDir)).clusterDir
  }
] as const

describe.each(layouts)("npm start with nothing configured, $name", ({ runAs, skip, clusterOf }) => {
  const children: Array<ServiceProcess> = []
  let dataDir = ""
  let ownDir = ""
  afterAll(async () => {
    for (const { child } of children) if (child.exitCode === null) child.kill("SIGKILL")
    if (dataDir !== "") await rm(dirname(dataDir), { recursive: true, force: true })
    if (ownDir.startsWith(ROOT_STATE_DIR)) await rm(ownDir, { recursive: true, force: true })
  })

  const makeDataDir = async (user: RunAs | undefined) => {
    await mkdir(dataDir, { recursive: true })
    if (user !== undefined) await chown(dataDir, user.uid, user.gid)
  }

  it.skipIf(skip !== undefined)(
    `serves, keeps its data across restarts, stops its database on shutdown, recovers from a kill and a stale lock, ` +
      `refuses another version's cluster in one line, and starts afresh without its DATA_DIR${
        skip === undefined ? "" : ` (skipped: ${skip})`
      }`,
    async () => {
      const parent = await mkdtemp(join(tmpdir(), "nenas-start-"))
      await chmod(parent, 0o755) // passable for the unprivileged user
      dataDir = join(parent, "data")
      await makeDataDir(runAs)
      const port = await freePort()
      const base = `http://127.0.0.1:${port}`
      const start = async (until: "healthy" | "spawned" = "healthy") => {
        const started = await startService({ port, env: { DATA_DIR: dataDir }, runAs, until })
        children.push(started)
        return started
      }

      const first = await start()
      const clusterDir = await clusterOf(dataDir)
      if (runAs === undefined && isRoot()) {
        // Nothing of PostgreSQL's in DATA_DIR, whose mode is left as it was.
        ownDir = (await embeddedClusterLocation(dataDir)).ownDir
        expect(clusterDir.startsWith(`${ROOT_STATE_DIR}/`)).toBe(true)
        await expect(stat(join(dataDir, "pg"))).rejects.toThrow()
        const own = await stat(ownDir)
        expect(own.mode & 0o777).toBe(0o700)
        expect(own.uid).not.toBe(0)
      }
      expect((await json(await fetch(`${base}/readyz`))).body).toEqual({ status: "ok", upstreams: { open: [] } })
      const pidFile = join(clusterDir, "postmaster.pid")
      const pgPort = Number((await readFile(pidFile, "utf8")).split("\n")[3])
      expect(pgPort).toBeGreaterThan(0)
      expect(pgPort).not.toBe(5432)

      const signIn = async () => {
        const session = await json(
          await fetch(`${base}/dev/session`, {
            method: "POST",
            headers: { "content-type": "application/json" },
            body: JSON.stringify({ email: "start@example.com" })
          })
        )
        expect(session.status).toBe(200)
        return { authorization: `Bearer ${session.body.token}` }
      }
      const auth = await signIn()
      const created = await json(
        await fetch(`${base}/dashboard/api-keys`, {
          method: "POST",
          headers: { ...auth, "content-type": "application/json" },
          body: JSON.stringify({ name: "survives restarts" })
        })
      )
      expect(created.status).toBe(201)
      const models = await json(
        await fetch(`${base}/v1/models`, { headers: { authorization: `Bearer ${created.body.full_key}` } })
      )
      expect(models.body.data[0].id).toBe("svc/nenas-flash")
      const keyIds = async () => {
        const listed = await json(await fetch(`${base}/dashboard/api-keys`, { headers: await signIn() }))
        expect(listed.status).toBe(200)
        return listed.body.keys.map((k: { id: string }) => k.id)
      }

      expect(await stopService(first)).toBe(0)
      // The embedded server removes its pid file when it has shut down.
      await expect(stat(pidFile)).rejects.toThrow()

      // A lock file naming a live process that is not this cluster's server (a pid reused after a reboot) is stale.
      await writeFile(pidFile, `${process.pid}\n${clusterDir}\n0\n${pgPort}\n`)
      const second = await start()
      const listed = await json(await fetch(`${base}/dashboard/api-keys`, { headers: auth }))
      expect(listed.body.keys.map((k: { id: string }) => k.id)).toEqual([created.body.key.id])
      // Last use from before the restart was written at shutdown.
      expect(listed.body.keys[0].last_used_at).not.toBeNull()

      // Killed outright, the service leaves its PostgreSQL orphaned; the next start reclaims it.
      await stopService(second, "SIGKILL")
      const third = await start()
      expect(await keyIds()).toEqual([created.body.key.id])
      expect(await stopService(third)).toBe(0)
      await expect(stat(pidFile)).rejects.toThrow()

      // A cluster of another major version is refused, in one line that says what to do.
      const versionFile = join(clusterDir, "PG_VERSION")
      const version = await readFile(versionFile, "utf8")
      await writeFile(versionFile, "16\n")
      const older = await start("spawned")
      expect((await older.closed).code).toBe(1)
      expect(linesOf(older.output())).toEqual([
        expect.stringMatching(
          /^nenas: .* was made by PostgreSQL 16 and this install has PostgreSQL \d+: upgrade it with pg_upgrade/
        )
      ])
      await writeFile(versionFile, version)

      // Without its DATA_DIR, the service starts with an empty database, in the same place.
      await rm(dataDir, { recursive: true, force: true })
      await makeDataDir(runAs)
      const fresh = await start()
      expect(await clusterOf(dataDir)).toBe(clusterDir)
      expect(await keyIds()).toEqual([])
      expect(await stopService(fresh)).toBe(0)
      await expect(stat(pidFile)).rejects.toThrow()
    },
    600_000 // six starts; generous for a loaded machine
  )
})
