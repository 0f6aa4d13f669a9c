import { Effect } from "effect"
import { spawn, spawnSync } from "node:child_process"
import { mkdir, mkdtemp, rm } from "node:fs/promises"
import { createServer, type IncomingHttpHeaders, request as httpRequest } from "node:http"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { parseSse } from "./Sse.js"
import { TestServer } from "./TestServer.js"

/**
 * Claude Code (the `@anthropic-ai/claude-code` dev dependency) run as a user runs it, against the test
 * server: a child process with a fresh HOME, `ANTHROPIC_BASE_URL` pointing at a loopback proxy that
 * records each request it makes and the server's answer, and the environment that keeps it off the
 * network (the machine's network is closed except loopback).
 */

/** The wrapper execs the native binary of `@anthropic-ai/claude-code-linux-x64` (no postinstall needed). */
export const CLAUDE_CLI = join(process.cwd(), "node_modules/@anthropic-ai/claude-code/cli-wrapper.cjs")
export const CLAUDE_TIMEOUT_MS = 120_000

/** Why Claude Code cannot start here (`--version` fails), or undefined when it can. */
export const claudeCannotStart = (): string | undefined => {
  const run = spawnSync(process.execPath, [CLAUDE_CLI, "--version"], { encoding: "utf8", timeout: 30_000 })
  if (run.error !== undefined) return `claude --version: ${run.error.message}`
  if (run.status !== 0) {
    return `claude --version exited ${run.status}: ${(run.stderr || run.stdout).trim().slice(0, 500)}`
  }
  return undefined
}

/** One request Claude Code made, and the service's answer to it. */
export interface Exchange {
  readonly method: string
  /** Path and query, as sent (`/v1/messages?beta=true`). */
  readonly url: string
  readonly headers: IncomingHttpHeaders
  /** Parsed JSON; undefined when the body is empty or not JSON. */
  readonly body: any // arbitrary JSON: each test asserts the shape it expects
  readonly status: number
  readonly answerHeaders: IncomingHttpHeaders
  readonly answer: string
}

const parsed = (text: string): unknown => {
  try {
    return text === "" ? undefined : JSON.parse(text)
  } catch {
    return undefined
  }
}

/** A loopback proxy to `target` that records every exchange, streams passed through as they come. */
const recordingProxy = (target: string) =>
  Effect.acquireRelease(
    Effect.promise(() =>
      new Promise<{ readonly url: string; readonly exchanges: Array<Exchange>; readonly close: () => Promise<void> }>(
        (resolve) => {
          const exchanges: Array<Exchange> = []
          const to = new URL(target)
          const server = createServer((req, res) => {
            const chunks: Array<Buffer> = []
            req.on("data", (chunk: Buffer) => chunks.push(chunk))
            req.on("end", () => {
              const body = Buffer.concat(chunks)
              const forward = httpRequest(
                {
                  host: to.hostname,
                  port: to.port,
                  method: req.method,
                  path: req.url,
                  headers: { ...req.headers, host: to.host }
                },
                (answer) => {
                  res.writeHead(answer.statusCode ?? 502, answer.headers)
                  const parts: Array<Buffer> = []
                  answer.on("data", (chunk: Buffer) => {
                    parts.push(chunk)
                    res.write(chunk)
                  })
                  answer.on("end", () => {
                    exchanges.push({
                      method: req.method ?? "",
                      url: req.url ?? "",
                      headers: req.headers,
                      body: parsed(body.toString("utf8")),
                      status: answer.statusCode ?? 0,
                      answerHeaders: answer.headers,
                      answer: Buffer.concat(parts).toString("utf8")
                    })
                    res.end()
                  })
                }
              )
              forward.on("error", () => res.destroy())
              forward.end(body)
            })
          })
          server.listen(0, "127.0.0.1", () => {
            const { port } = server.address() as AddressInfo
            resolve({
              url: `http://127.0.0.1:${port}`,
              exchanges,
              close: () =>
                new Promise<void>((done) => {
                  server.closeAllConnections()
                  server.close(() => done())
                })
            })
          })
        }
      )
    ),
    (proxy) => Effect.promise(proxy.close)
  )

/** A fresh directory, removed with the scope. */
export const tempDir = (prefix: string) =>
  Effect.acquireRelease(
    Effect.promise(() => mkdtemp(join(tmpdir(), prefix))),
    (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true }))
  )

export interface ClaudeRun {
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
  readonly stdout: string
  readonly stderr: string
  /** Every request Claude Code made, in the order the answers ended. */
  readonly exchanges: ReadonlyArray<Exchange>
}

export interface ClaudeOptions {
  /** The nenas key, sent as `x-api-key` (`ANTHROPIC_API_KEY`) or as `Authorization: Bearer` (`ANTHROPIC_AUTH_TOKEN`). */
  readonly apiKey: string
  readonly keyVariable: "ANTHROPIC_API_KEY" | "ANTHROPIC_AUTH_TOKEN"
  /** The working directory Claude Code runs in (its tools act there). */
  readonly cwd: string
}

/** `claude <args>` against the test server, with its own HOME; killed after `CLAUDE_TIMEOUT_MS`. */
export const runClaude = (args: ReadonlyArray<string>, options: ClaudeOptions) =>
  Effect.scoped(Effect.gen(function*() {
    const { baseUrl } = yield* TestServer
    const proxy = yield* recordingProxy(baseUrl)
    const home = yield* tempDir("claude-home-")
    const scratch = join(home, "tmp")
    yield* Effect.promise(() => mkdir(scratch))
    const env: Record<string, string> = {
      PATH: process.env["PATH"] ?? "/usr/bin:/bin",
      HOME: home,
      XDG_CONFIG_HOME: join(home, ".config"),
      TMPDIR: scratch,
      ANTHROPIC_BASE_URL: proxy.url,
      [options.keyVariable]: options.apiKey,
      ANTHROPIC_MODEL: "svc/nenas-flash",
      ANTHROPIC_SMALL_FAST_MODEL: "svc/nenas-flash",
      ANTHROPIC_DEFAULT_HAIKU_MODEL: "svc/nenas-flash",
      ANTHROPIC_DEFAULT_SONNET_MODEL: "svc/nenas-flash",
      ANTHROPIC_DEFAULT_OPUS_MODEL: "svc/nenas-flash",
      CLAUDE_CODE_MAX_RETRIES: "1",
      DISABLE_AUTOUPDATER: "1",
      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
      DISABLE_TELEMETRY: "1",
      DISABLE_ERROR_REPORTING: "1",
      DISABLE_BUG_COMMAND: "1",
      CLAUDE_CODE_DISABLE_TERMINAL_TITLE: "1"
    }
    // NENAS_CLAUDE_DEBUG_FILE=<path>: Claude Code's own debug log (its API requests and errors) goes there.
    const debugFile = process.env["NENAS_CLAUDE_DEBUG_FILE"]
    const debugArgs = debugFile === undefined ? [] : ["--debug-file", `${debugFile}.${Date.now()}`]
    const run = yield* Effect.async<Omit<ClaudeRun, "exchanges">>((resume) => {
      const child = spawn(process.execPath, [CLAUDE_CLI, ...args, ...debugArgs], {
        cwd: options.cwd,
        env,
        stdio: ["ignore", "pipe", "pipe"],
        timeout: CLAUDE_TIMEOUT_MS,
        killSignal: "SIGKILL"
      })
      let stdout = ""
      let stderr = ""
      child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString("utf8")))
      child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString("utf8")))
      child.on("error", (error) => (stderr += `\nspawn error: ${error.message}`))
      child.on("close", (code, signal) => resume(Effect.succeed({ code, signal, stdout, stderr })))
      return Effect.sync(() => child.kill("SIGKILL"))
    })
    return { ...run, exchanges: [...proxy.exchanges] } satisfies ClaudeRun
  }))

/** A one-line account of each exchange, for failure messages: `POST /v1/messages?beta=true → 200`. */
export const exchangeLines = (run: ClaudeRun) =>
  run.exchanges.map((e) => `${e.method} ${e.url} → ${e.status}`).join("\n")

/** The text a streamed Messages answer carried: its `text_delta`s joined. */
export const streamedText = (answer: string) =>
  parseSse(answer)
    .map((event) => JSON.parse(event.data) as { type: string; delta?: { type: string; text?: string } })
    .filter((event) => event.type === "content_block_delta" && event.delta?.type === "text_delta")
    .map((event) => event.delta?.text ?? "")
    .join("")

/** Claude Code's `--output-format json` result. */
export interface ClaudeResult {
  readonly type: string
  readonly subtype: string
  readonly is_error: boolean
  /** The HTTP status of the API error that ended the run; null when none did. */
  readonly api_error_status: number | null
  readonly result: string
  readonly num_turns: number
  readonly stop_reason: string
  readonly permission_denials: ReadonlyArray<unknown>
  readonly usage: { readonly input_tokens: number; readonly output_tokens: number }
}

export const claudeResult = (run: ClaudeRun): ClaudeResult => {
  const line = run.stdout.trim().split("\n").pop() ?? ""
  return JSON.parse(line) as ClaudeResult
}
