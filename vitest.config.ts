import { defineConfig } from "vitest/config"

/**
 * `npm test` runs every project below; `npm run test:unit` only the first two.
 * Tests are laid out by what they need (docs/testing.md):
 * - `unit`: pure decisions and handlers over test Layers, no PostgreSQL (seconds);
 * - `server`: the real server on a fresh PostgreSQL database per file;
 * - `processes`: several instances or processes on one database;
 * - `browser`: the dashboard in Debian's Chromium.
 * The reliability scenarios (`test/reliability/`) run with `npm run test:reliability`.
 */
/** The unit tests that move Effect's TestClock. */
const CLOCKED = ["test/unit/breakers.test.ts", "test/unit/doubles.test.ts", "test/unit/realTimeReceiver.test.ts"]

const withDatabase = {
  globalSetup: ["./test/support/globalSetup.ts"],
  testTimeout: 60_000,
  hookTimeout: 120_000
}

export default defineConfig({
  test: {
    reporters: ["default", "./test/support/summaryReporter.ts"],
    // Each file has its own database and server; two cores run two files at once.
    maxWorkers: 2,
    minWorkers: 1,
    projects: [
      {
        test: {
          name: "unit",
          include: ["test/unit/**/*.test.ts", "lint/**/*.test.ts"],
          exclude: CLOCKED,
          testTimeout: 30_000,
          // No database and no server: one worker keeps its modules from file to file (Effect and the platform load
          // once), which takes the run from about 40 s to about 25.
          pool: "forks",
          poolOptions: { forks: { isolate: false, singleFork: true } }
        }
      },
      // Tests on Effect's TestClock, each in a module graph of its own: after another file in the same graph,
      // `TestClock.setTime` found a clock that was not the test's.
      { test: { name: "unit-clock", include: CLOCKED, testTimeout: 30_000, pool: "threads" } },
      { test: { name: "server", include: ["test/server/**/*.test.ts"], ...withDatabase } },
      { test: { name: "processes", include: ["test/processes/**/*.test.ts"], ...withDatabase } },
      { test: { name: "browser", include: ["test/browser/**/*.test.ts"], ...withDatabase } }
    ]
  }
})
