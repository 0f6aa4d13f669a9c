import { defineConfig } from "vitest/config"

/**
 * `npm test` runs every project below; `npm run test:unit` only the first.
 * Tests are laid out by what they need (docs/testing.md):
 * - `unit`: pure decisions and handlers over test Layers, no PostgreSQL (seconds);
 * - `server`: the real server on a fresh PostgreSQL database per file;
 * - `processes`: several instances or processes on one database;
 * - `browser`: the dashboard in Debian's Chromium.
 * The reliability scenarios (`test/reliability/`) run with `npm run test:reliability`.
 */
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
          testTimeout: 30_000,
          // No database and no server: one worker keeps its modules from file to file (Effect and the platform load
          // once), which takes the run from about 40 s to about 20.
          pool: "forks",
          poolOptions: { forks: { isolate: false, singleFork: true } }
        }
      },
      { test: { name: "server", include: ["test/server/**/*.test.ts"], ...withDatabase } },
      { test: { name: "processes", include: ["test/processes/**/*.test.ts"], ...withDatabase } },
      { test: { name: "browser", include: ["test/browser/**/*.test.ts"], ...withDatabase } }
    ]
  }
})
