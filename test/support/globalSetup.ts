import { Effect, Exit, Redacted, Scope } from "effect"
import { chmod, mkdtemp, readdir, readFile, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type { TestProject } from "vitest/node"
import {
  embeddedClusterLocation,
  removeAbandonedClusters,
  ROOT_STATE_DIR,
  startEmbeddedPostgres
} from "../../src/Database/EmbeddedPostgres.js"
import { ensureDashboardBuilt } from "./Browser.js"
import { type ClusterSeen, leftByRun } from "./RunClusters.js"

declare module "vitest" {
  export interface ProvidedContext {
    /** A PostgreSQL server on which each test file creates its own database. */
    readonly adminDatabaseUrl: string
  }
}

const isRoot = () => process.getuid?.() === 0

/** The cluster folders under /var/lib/nenas (root's embedded databases, one per DATA_DIR). */
const clusterFolders = async (): Promise<ReadonlyArray<string>> =>
  (await readdir(ROOT_STATE_DIR).catch(() => [])).filter((name) => /^[0-9a-f]{16}$/.test(name))

/** The DATA_DIR a cluster records, and whether a server runs on it now. */
const describeCluster = async (name: string): Promise<ClusterSeen> => {
  const ownDir = join(ROOT_STATE_DIR, name)
  const marker = await readFile(join(ownDir, "nenas.json"), "utf8").then(
    (text) => JSON.parse(text) as { readonly dataDir?: string },
    () => ({ dataDir: undefined })
  )
  const pid = Number((await readFile(join(ownDir, "pg", "postmaster.pid"), "utf8").catch(() => "")).split("\n")[0])
  const served = Number.isInteger(pid) && pid > 0 &&
    (await readFile(`/proc/${pid}/stat`, "utf8").then(() => true, () => false))
  return { ownDir, dataDir: marker.dataDir, served }
}

/**
 * As root, every temporary DATA_DIR the tests start the service on gets a
 * cluster under /var/lib/nenas. The run removes those whose DATA_DIR is gone
 * (as any start does) and fails if a cluster of a DATA_DIR inside this run's
 * own temporary directory is still there: a test that left its DATA_DIR
 * behind. Any other cluster (an `npm start` beside the tests, another run) is
 * not the run's.
 */
const checkNoLeftClusters = async (runDir: string): Promise<void> => {
  if (!isRoot()) return
  await removeAbandonedClusters()
  const left = leftByRun(runDir, await Promise.all((await clusterFolders()).map(describeCluster)))
  if (left.length > 0) {
    throw new Error(
      `the tests left ${left.length} embedded cluster(s) under ${ROOT_STATE_DIR}: ` +
        left.map(({ dataDir, ownDir }) => `${ownDir} (DATA_DIR ${dataDir ?? ""})`).join(", ")
    )
  }
}

/**
 * The run's own temporary directory: `TMPDIR` for the test files (their workers start after this,
 * with this environment), so every DATA_DIR they make is inside it. As open as /tmp, for the
 * tests that run the service as another user.
 */
const makeRunDir = async () => {
  const outer = process.env["TMPDIR"]
  const runDir = await mkdtemp(join(tmpdir(), "nenas-run-"))
  await chmod(runDir, 0o1777)
  process.env["TMPDIR"] = runDir
  return {
    runDir,
    /** The check, then (when it passed) the directory gone and TMPDIR as it was. */
    finish: async () => {
      await checkNoLeftClusters(runDir)
      if (outer === undefined) delete process.env["TMPDIR"]
      else process.env["TMPDIR"] = outer
      await rm(runDir, { recursive: true, force: true })
    }
  }
}

/** One PostgreSQL for the whole run: `DATABASE_URL` when set, else an embedded one. */
export default async function setup(project: TestProject) {
  // Once, before any file: two browser test files finding the build stale at once would each empty web/dist.
  await ensureDashboardBuilt()
  const run = await makeRunDir()
  const configured = process.env["DATABASE_URL"]
  if (configured !== undefined && configured !== "") {
    project.provide("adminDatabaseUrl", configured)
    return run.finish
  }
  const dir = await mkdtemp(join(tmpdir(), "nenas-test-pg-"))
  const scope = Effect.runSync(Scope.make())
  const { url } = await Effect.runPromise(Scope.extend(startEmbeddedPostgres(dir), scope))
  // As root the cluster lives outside `dir`, under /var/lib/nenas.
  const { ownDir } = await embeddedClusterLocation(dir)
  project.provide("adminDatabaseUrl", Redacted.value(url))
  return async () => {
    await Effect.runPromise(Scope.close(scope, Exit.void))
    await rm(ownDir, { recursive: true, force: true })
    await rm(dir, { recursive: true, force: true })
    await run.finish()
  }
}
