import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { writeFile } from "node:fs/promises"
import { join } from "node:path"
import {
  claudeCannotStart,
  claudeResult,
  type ClaudeRun,
  exchangeLines,
  runClaude,
  streamedText,
  tempDir
} from "../../support/ClaudeCode.js"
import { call } from "../../support/Http.js"
import { caller, TestServerWithUpstream, violations, walletOf } from "../../support/Models.js"
import { query } from "../../support/TestServer.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * Claude Code 2.1.197 itself (docs/api/anthropic.md, "Anthropic Messages API") as the client of the real service:
 * `claude -p … --output-format json` with `ANTHROPIC_BASE_URL` at the server, on a test key (the
 * simulated model), on a live key whose upstream answers a tool call Claude Code runs in a scratch
 * directory (Read; WebSearch, whose own Messages call carries the web_search server tool), and on a live
 * key with an empty wallet. Every request it makes is recorded on the way (a
 * loopback proxy): with money, each is accepted (never a 400 for what Claude Code sends).
 */

const MODEL = "svc/nenas-flash"
const RUN_TIMEOUT = 180_000
const cannotStart = claudeCannotStart()

interface LogEntry {
  readonly requestId: string
  readonly endpoint: string
  readonly status: string
  readonly environment: string
  readonly costMicroMyr: number
  readonly routingCategory: string | null
  readonly searchCount: number
  readonly inputTokens: number
  readonly outputTokens: number
}

const dashboardLogs = (token: string) =>
  Effect.map(call("GET", "/dashboard/logs", { token }), (reply) => {
    expect(reply.status, reply.text).toBe(200)
    return (reply.body as { logs: ReadonlyArray<LogEntry> }).logs
  })

/** The Messages calls Claude Code made; every request it made to the API was answered 200. */
const messagesCalls = (run: ClaudeRun) => {
  const account = `exit ${run.code} ${run.signal ?? ""}\nrequests:\n${
    exchangeLines(run)
  }\nstdout: ${run.stdout}\nstderr: ${run.stderr.slice(-4000)}`
  expect(run.code, account).toBe(0)
  for (const exchange of run.exchanges.filter((e) => e.url.startsWith("/v1/"))) {
    expect(exchange.status, `${exchange.method} ${exchange.url} answered ${exchange.answer.slice(0, 1000)}`).toBe(200)
  }
  // Besides the API, Claude Code only warms its connection up with `HEAD /` (its answer, 404, is ignored).
  const others = run.exchanges.filter((e) => !e.url.startsWith("/v1/")).map((e) => `${e.method} ${e.url}`)
  expect(others.filter((line) => line !== "HEAD /"), account).toEqual([])
  const calls = run.exchanges.filter((e) => e.method === "POST" && e.url.split("?")[0] === "/v1/messages")
  expect(calls.length, account).toBeGreaterThan(0)
  return calls
}

/**
 * What Claude Code sends (docs/api/anthropic.md, "Anthropic Messages API"): all of it accepted (the calls
 * above answered 200).
 */
const expectClaudeCodeShape = (exchange: ClaudeRun["exchanges"][number]) => {
  expect(exchange.url).toBe("/v1/messages?beta=true")
  expect(exchange.headers["anthropic-version"]).toBe("2023-06-01")
  expect(exchange.headers["anthropic-beta"]).toContain("claude-code-20250219")
  expect(exchange.body).toMatchObject({
    model: MODEL,
    max_tokens: 32_000,
    stream: true,
    thinking: { type: "adaptive" },
    context_management: expect.anything(),
    output_config: { effort: expect.any(String) },
    metadata: { user_id: expect.any(String) }
  })
  expect(Array.isArray(exchange.body.system)).toBe(true)
  expect(exchange.body.tools.length).toBeGreaterThan(0)
}

layer(TestServerWithUpstream(), { excludeTestServices: true })(
  `Claude Code against the service${cannotStart === undefined ? "" : ` (skipped: ${cannotStart})`}`,
  (it) => {
    it.scoped.skipIf(cannotStart !== undefined)(
      "claude -p on a test key (x-api-key): the simulated model's text, the call logged free as /v1/messages",
      () =>
        Effect.gen(function*() {
          const upstream = yield* Upstream
          upstream.reset()
          const who = yield* caller("claude-code-test@example.com", { environment: "test" })
          const work = yield* tempDir("claude-work-")
          const run = yield* runClaude(["-p", "Say hello", "--output-format", "json"], {
            apiKey: who.apiKey,
            keyVariable: "ANTHROPIC_API_KEY",
            cwd: work
          })
          const calls = messagesCalls(run)
          expect(calls).toHaveLength(1)
          const [only] = calls
          if (only === undefined) return
          expect(only.headers["x-api-key"]).toBe(who.apiKey)
          expectClaudeCodeShape(only)
          // Claude Code's own reminders go as a `system` turn inside `messages`.
          expect(only.body.messages.some((m: { role: string }) => m.role === "system")).toBe(true)

          const result = claudeResult(run)
          expect(result).toMatchObject({
            type: "result",
            subtype: "success",
            is_error: false,
            num_turns: 1,
            stop_reason: "end_turn"
          })
          expect(result.result).toMatch(/^Simulated answer \([0-9a-f]+\) from nenas-simulated/)
          expect(result.result).toBe(streamedText(only.answer))
          expect(upstream.requests, "a test key never reaches the upstream").toEqual([])

          const requestId = only.answerHeaders["x-request-id"]
          expect(requestId).toMatch(/^req_/)
          const logs = yield* dashboardLogs(who.token)
          expect(logs).toHaveLength(1)
          expect(logs[0]).toMatchObject({
            requestId,
            endpoint: "/v1/messages",
            environment: "test",
            status: "succeeded",
            costMicroMyr: 0
          })
          expect(logs[0]?.inputTokens).toBeGreaterThan(0)
          expect(logs[0]?.outputTokens).toBeGreaterThan(0)
        }),
      RUN_TIMEOUT
    )

    it.scoped.skipIf(cannotStart !== undefined)(
      "claude -p on a live key (Bearer): the upstream asks for Read, Claude Code runs it, the tool result goes back, each call billed once",
      () =>
        Effect.gen(function*() {
          const FINAL = "The file says: hello from nenas."
          const upstream = yield* Upstream
          upstream.reset()
          const work = yield* tempDir("claude-work-")
          const file = join(work, "notes.txt")
          yield* Effect.promise(() => writeFile(file, "hello from nenas\n"))
          const hasRead = (body: unknown) =>
            ((body as { tools?: ReadonlyArray<{ function?: { name?: string } }> }).tools ?? []).some((t) =>
              t.function?.name === "Read"
            )
          upstream.setBehaviour({
            kind: "perRequest",
            // The main loop (it offers Read) gets a tool call, then the final text once the tool result comes back;
            // any other call Claude Code makes gets plain text.
            choose: (body) =>
              hasRead(body)
                ? {
                  kind: "ok",
                  toolCalls: [{ name: "Read", arguments: JSON.stringify({ file_path: file }) }],
                  text: FINAL
                }
                : { kind: "ok", text: "ok" }
          })
          const who = yield* caller("claude-code-live@example.com", { sen: 1000 })
          const before = yield* walletOf(who.accountId)
          const run = yield* runClaude(
            ["-p", "What does notes.txt say?", "--output-format", "json", "--allowedTools", "Read"],
            { apiKey: who.apiKey, keyVariable: "ANTHROPIC_AUTH_TOKEN", cwd: work }
          )
          const calls = messagesCalls(run)
          for (const exchange of calls) {
            expect(exchange.headers["authorization"]).toBe(`Bearer ${who.apiKey}`)
            expect(exchange.headers["x-api-key"]).toBeUndefined()
          }
          expectClaudeCodeShape(calls[0]!)

          const result = claudeResult(run)
          expect(result).toMatchObject({
            type: "result",
            subtype: "success",
            is_error: false,
            result: FINAL,
            permission_denials: []
          })
          expect(result.num_turns).toBe(2)

          // The round trip upstream: a Read call, then the conversation with its result.
          const main = upstream.requests.filter((r) => hasRead(r.body))
          expect(main).toHaveLength(2)
          const second = main[1]?.body as {
            messages: ReadonlyArray<
              {
                role: string
                content: unknown
                tool_calls?: ReadonlyArray<{ id: string; function: { name: string; arguments: string } }>
                tool_call_id?: string
              }
            >
          }
          const assistant = second.messages.find((m) => m.tool_calls !== undefined)
          expect(assistant?.tool_calls?.[0]?.function).toEqual({
            name: "Read",
            arguments: JSON.stringify({ file_path: file })
          })
          const toolTurn = second.messages[second.messages.length - 1]
          expect(toolTurn?.role).toBe("tool")
          expect(toolTurn?.tool_call_id).toBe(assistant?.tool_calls?.[0]?.id)
          expect(JSON.stringify(toolTurn?.content)).toContain("hello from nenas")
          // Claude Code sent it back as a `tool_result` block.
          const lastTurn = calls[calls.length - 1]?.body.messages.at(-1) as { content: ReadonlyArray<{ type: string }> }
          expect(lastTurn.content.some((b) => b.type === "tool_result")).toBe(true)

          // Each /v1/messages call logged and billed once; the holds all released.
          const rows = yield* query<{ request_id: string; endpoint: string; status: string; cost: string }>(
            "SELECT request_id, endpoint, status, cost_micro_myr::text AS cost FROM request_logs WHERE account_id = $1 ORDER BY created_at",
            [who.accountId]
          )
          const requestIds = calls.map((e) => e.answerHeaders["x-request-id"])
          expect(rows.map((r) => r.request_id).sort()).toEqual([...requestIds].sort())
          expect(rows.length).toBe(upstream.requests.length)
          for (const row of rows) {
            expect(row).toMatchObject({ endpoint: "/v1/messages", status: "billed" })
            expect(Number(row.cost)).toBeGreaterThan(0)
          }
          const usage = yield* query<{ request_id: string; amount: string }>(
            "SELECT request_id, amount_micro_myr::text AS amount FROM ledger_entries WHERE account_id = $1 AND type = 'usage'",
            [who.accountId]
          )
          expect(usage.map((u) => u.request_id).sort()).toEqual(rows.map((r) => r.request_id).sort())
          for (const entry of usage) {
            expect(Number(entry.amount)).toBe(-Number(rows.find((r) => r.request_id === entry.request_id)?.cost))
          }
          const spent = rows.reduce((sum, r) => sum + Number(r.cost), 0)
          expect(yield* walletOf(who.accountId)).toEqual({ available: before.available - spent, reserved: 0, spent })
          expect(yield* violations(who.accountId)).toEqual([])

          const logs = yield* dashboardLogs(who.token)
          expect(logs.map((l) => [l.endpoint, l.status, l.environment])).toEqual(
            rows.map(() => ["/v1/messages", "billed", "live"])
          )
          expect(logs.reduce((sum, l) => sum + l.costMicroMyr, 0)).toBe(spent)
        }),
      RUN_TIMEOUT
    )

    it.scoped.skipIf(cannotStart !== undefined)(
      "claude -p on a live key with an empty wallet: Claude Code shows the 402 billing_error's message and exits 1; nothing held or charged",
      () =>
        Effect.gen(function*() {
          const upstream = yield* Upstream
          upstream.reset()
          const who = yield* caller("claude-code-empty@example.com")
          const work = yield* tempDir("claude-work-")
          const run = yield* runClaude(["-p", "Say hello", "--output-format", "json"], {
            apiKey: who.apiKey,
            keyVariable: "ANTHROPIC_API_KEY",
            cwd: work
          })
          const account = `requests:\n${exchangeLines(run)}\nstdout: ${run.stdout}\nstderr: ${run.stderr.slice(-4000)}`
          expect(run.code, account).toBe(1)
          // One call, not retried: 402 is not retryable.
          const calls = run.exchanges.filter((e) => e.url.startsWith("/v1/"))
          expect(calls.map((e) => `${e.method} ${e.url} → ${e.status}`), account).toEqual([
            "POST /v1/messages?beta=true → 402"
          ])
          const error = JSON.parse(calls[0]?.answer ?? "{}")
          expect(error).toMatchObject({
            type: "error",
            error: { type: "billing_error", code: "insufficient_balance", retryable: false }
          })
          const result = claudeResult(run)
          expect(result).toMatchObject({ type: "result", is_error: true, api_error_status: 402 })
          expect(result.result).toBe(`API Error: 402 ${error.error.message}`)
          expect(upstream.requests).toEqual([])
          expect(yield* walletOf(who.accountId)).toEqual({ available: 0, reserved: 0, spent: 0 })
          const logs = yield* dashboardLogs(who.token)
          expect(logs).toHaveLength(1)
          expect(logs[0]).toMatchObject({
            requestId: calls[0]?.answerHeaders["x-request-id"],
            endpoint: "/v1/messages",
            status: "failed",
            errorCode: "insufficient_balance",
            costMicroMyr: 0
          })
        }),
      RUN_TIMEOUT
    )

    it.scoped.skipIf(cannotStart !== undefined)(
      "claude -p with WebSearch: its nested call with the web_search server tool runs nenas's web search; every call answered and billed once",
      () =>
        Effect.gen(function*() {
          const FINAL = "Here is what the search found."
          const upstream = yield* Upstream
          upstream.reset()
          const offers = (body: unknown, name: string) =>
            ((body as { tools?: ReadonlyArray<{ function?: { name?: string } }> }).tools ?? []).some((t) =>
              t.function?.name === name
            )
          upstream.setBehaviour({
            kind: "perRequest",
            // The main loop asks for WebSearch; Claude Code's WebSearch tool is a Messages call of its own (the
            // planning and answering calls of nenas's web search reach the upstream without custom tools).
            choose: (body) =>
              offers(body, "WebSearch")
                ? {
                  kind: "ok",
                  toolCalls: [{ name: "WebSearch", arguments: JSON.stringify({ query: "Kuala Lumpur floods" }) }],
                  text: FINAL
                }
                : { kind: "ok", text: "Roads in Kuala Lumpur were closed by floods [1]." }
          })
          const who = yield* caller("claude-code-search@example.com", { sen: 1000 })
          const work = yield* tempDir("claude-work-")
          const run = yield* runClaude(
            ["-p", "Search the web for Kuala Lumpur floods", "--output-format", "json", "--allowedTools", "WebSearch"],
            { apiKey: who.apiKey, keyVariable: "ANTHROPIC_API_KEY", cwd: work }
          )
          const calls = messagesCalls(run)
          const result = claudeResult(run)
          expect(result).toMatchObject({
            type: "result",
            subtype: "success",
            is_error: false,
            result: FINAL,
            permission_denials: []
          })
          const searching = calls.filter((e) =>
            (e.body.tools as ReadonlyArray<{ type?: string }>).some((t) => t.type?.startsWith("web_search_") === true)
          )
          expect(searching, exchangeLines(run)).toHaveLength(1)
          expect(searching[0]?.body).toMatchObject({ tool_choice: { type: "auto" }, max_tokens: 32_000, stream: true })
          // The search's answer comes back to the main loop as WebSearch's tool_result. (Claude Code lists sources
          // from `web_search_tool_result` blocks; nenas answers text with `citations`, so the result has no links.)
          const toolResult = calls[calls.length - 1]?.body.messages.at(-1)?.content?.[0]
          expect(toolResult).toMatchObject({ type: "tool_result" })
          expect(JSON.stringify(toolResult?.content)).toContain("Roads in Kuala Lumpur were closed by floods")

          const logs = yield* dashboardLogs(who.token)
          expect(logs).toHaveLength(calls.length)
          const searchLog = logs.find((l) => l.requestId === searching[0]?.answerHeaders["x-request-id"])
          expect(searchLog).toMatchObject({ endpoint: "/v1/messages", status: "billed", routingCategory: "search" })
          expect(searchLog?.searchCount).toBeGreaterThan(0)
          for (const log of logs) {
            expect(log).toMatchObject({ endpoint: "/v1/messages", status: "billed" })
            expect(log.costMicroMyr).toBeGreaterThan(0)
          }
          const spent = logs.reduce((sum, l) => sum + l.costMicroMyr, 0)
          expect(yield* walletOf(who.accountId)).toMatchObject({ reserved: 0, spent })
          expect(yield* violations(who.accountId)).toEqual([])
        }),
      RUN_TIMEOUT
    )
  }
)
