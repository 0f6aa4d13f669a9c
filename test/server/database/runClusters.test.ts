import { tmpdir } from "node:os"
import { basename, dirname } from "node:path"
import { describe, expect, it } from "vitest"
import { isWithin, leftByRun } from "../../support/RunClusters.js"

/**
 * `npm test` beside a running service. The teardown's leftover check
 * counts only the clusters of this run's own DATA_DIRs (inside its temporary
 * directory), never an `npm start`'s in another terminal.
 */

const RUN = "/tmp/nenas-run-AbC123"
const cluster = (dataDir: string | undefined, served = false) => ({
  ownDir: "/var/lib/nenas/0123456789abcdef",
  dataDir,
  served
})

describe("which embedded clusters a test run left", () => {
  it.each([
    ["a stopped test DATA_DIR inside the run's directory", true, cluster(`${RUN}/nenas-test-x1`)],
    ["one nested deeper inside it", true, cluster(`${RUN}/nenas-start-y/data`)],
    ["the run directory itself", true, cluster(RUN)],
    ["npm start's default ./.data beside the tests (relative)", false, cluster("./.data")],
    ["npm start with DATA_DIR in a clone under /tmp", false, cluster("/tmp/nenas/.data")],
    [
      "npm start with DATA_DIR=/tmp/nenas-test-dev (a test-like name, not this run's)",
      false,
      cluster("/tmp/nenas-test-dev")
    ],
    ["another run's DATA_DIR", false, cluster("/tmp/nenas-run-Other9/nenas-test-z")],
    ["a sibling whose name starts like the run's", false, cluster(`${RUN}x/nenas-test-x1`)],
    ["a path that climbs out of the run's directory", false, cluster(`${RUN}/../elsewhere`)],
    ["a cluster whose start is under way (no record yet)", false, cluster(undefined)],
    ["the run's cluster a server still runs on", false, cluster(`${RUN}/nenas-test-x2`, true)]
  ])("%s → counted: %s", (_name, counted, seen) => {
    expect(leftByRun(RUN, [seen])).toEqual(counted ? [seen] : [])
  })

  it("keeps the run's leftovers and drops everyone else's from one listing", () => {
    const mine = cluster(`${RUN}/nenas-test-a`)
    const service = cluster("/srv/nenas/.data")
    expect(leftByRun(RUN, [service, mine, cluster("/tmp/x")])).toEqual([mine])
    expect(isWithin(RUN, RUN)).toBe(true)
  })

  it("the test files' temporary directory is this run's own, so every DATA_DIR they make is counted", () => {
    expect(basename(tmpdir())).toMatch(/^nenas-run-/)
    expect(isWithin(dirname(tmpdir()), tmpdir())).toBe(true)
  })
})
