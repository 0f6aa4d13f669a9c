import { defineConfig } from "vitest/config"

/**
 * `npm run test:reliability`: fuzzing, crashes, outages, storms and shutdowns.
 * `RELIABILITY_SMOKE=1` runs a smaller variant of each scenario (CI runs that one).
 */
export default defineConfig({
  test: {
    include: ["test/reliability/**/*.test.ts"],
    globalSetup: ["./test/support/globalSetup.ts"],
    reporters: ["default", "./test/support/summaryReporter.ts"],
    testTimeout: 600_000,
    hookTimeout: 120_000,
    maxWorkers: 1,
    minWorkers: 1
  }
})
