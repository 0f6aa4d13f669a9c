import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Exit, Redacted, Scope } from "effect"
import type { TestProject } from "vitest/node"
import { embeddedClusterLocation, startEmbeddedPostgres } from "../../src/Database/EmbeddedPostgres.js"

declare module "vitest" {
  export interface ProvidedContext {
    /** A PostgreSQL server on which each test file creates its own database. */
    readonly adminDatabaseUrl: string
  }
}

/** One PostgreSQL for the whole run: `DATABASE_URL` when set, else an embedded one. */
export default async function setup(project: TestProject) {
  const configured = process.env["DATABASE_URL"]
  if (configured !== undefined && configured !== "") {
    project.provide("adminDatabaseUrl", configured)
    return
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
  }
}
