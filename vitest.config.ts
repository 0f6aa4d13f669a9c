import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // The reliability scenarios run with `npm run test:reliability`.
    exclude: ["test/reliability/**", "**/node_modules/**"],
    globalSetup: ["./test/support/globalSetup.ts"],
    reporters: ["default", "./test/support/summaryReporter.ts"],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // Each file has its own database and server; two cores run two files at once.
    maxWorkers: 2,
    minWorkers: 1
  }
})
