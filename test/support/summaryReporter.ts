import type { Reporter, SerializedError, TestModule } from "vitest/node"

/**
 * Ends every run with the plain `Tests: N passed, N failed, N skipped` line
 * that CI reads, as the very last line. A file that failed to load counts as one failure.
 */
export default class PlainSummaryReporter implements Reporter {
  onTestRunEnd(modules: ReadonlyArray<TestModule>, errors: ReadonlyArray<SerializedError>) {
    let passed = 0
    let failed = errors.length
    let skipped = 0
    for (const module of modules) {
      let moduleFailed = 0
      for (const test of module.children.allTests()) {
        const state = test.result().state
        if (state === "passed") passed++
        else if (state === "failed") moduleFailed++
        else skipped++
      }
      failed += moduleFailed === 0 && module.state() === "failed" ? 1 : moduleFailed
    }
    // After every other reporter's output: on exit (stdout writes are synchronous on Linux).
    process.once(
      "exit",
      () => process.stdout.write(`\nTests: ${passed} passed, ${failed} failed, ${skipped} skipped\n`)
    )
  }
}
