import { mkdtemp, readdir, readFile, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Exit, Redacted, Scope } from "effect"
import type { TestProject } from "vitest/node"
import {
  embeddedClusterLocation,
  removeAbandonedClusters,
  ROOT_STATE_DIR,
  startEmbeddedPostgres
} from "../../src/Database/EmbeddedPostgres.js"

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
const describeCluster = async (name: string) => {
  const ownDir = join(ROOT_STATE_DIR, name)
  const marker = await readFile(join(ownDir, "nenas.json"), "utf8").then(
    (text) => JSON.parse(text) as { readonly dataDir?: string },
    () => ({ dataDir: undefined })
  )
  const pid = Number((await readFile(join(ownDir, "pg", "postmaster.pid"), "utf8").catch(() => "")).split("\n")[0])
  const served = Number.isInteger(pid) && pid > 0 && (await readFile(`/proc/${pid}/stat`, "utf8").then(() => true, () => false))
  return { ownDir, dataDir: marker.dataDir, served }
}

/**
 * As root, every temporary DATA_DIR the tests start the service on gets a
 * cluster under /var/lib/nenas. The run removes those whose DATA_DIR is gone
 * (as any start does) and fails if a cluster of a temporary DATA_DIR made
 * during the run is still there: a test that left its DATA_DIR behind. One a
 * server still runs on, or without a record yet (a start under way), belongs
 * to another run going on at the same time.
 */
const checkNoNewClusters = async (before: ReadonlySet<string>): Promise<void> => {
  if (!isRoot()) return
  await removeAbandonedClusters()
  const left = []
  for (const name of await clusterFolders()) {
    if (before.has(name)) continue
    const cluster = await describeCluster(name)
    if (!cluster.served && cluster.dataDir?.startsWith(tmpdir()) === true) left.push(cluster)
  }
  if (left.length > 0) {
    throw new Error(
      `the tests left ${left.length} embedded cluster(s) under ${ROOT_STATE_DIR}: ` +
        left.map(({ dataDir, ownDir }) => `${ownDir} (DATA_DIR ${dataDir ?? ""})`).join(", ")
    )
  }
}

/** One PostgreSQL for the whole run: `DATABASE_URL` when set, else an embedded one. */
export default async function setup(project: TestProject) {
  const before = new Set(await clusterFolders())
  const configured = process.env["DATABASE_URL"]
  if (configured !== undefined && configured !== "") {
    project.provide("adminDatabaseUrl", configured)
    return () => checkNoNewClusters(before)
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
    await checkNoNewClusters(before)
  }
}
