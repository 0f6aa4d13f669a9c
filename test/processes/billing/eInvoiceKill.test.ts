import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtemp, rm } from "node:fs/promises"
import { createServer, type IncomingMessage, request as httpRequest, type ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { freePort } from "../../../src/Database/EmbeddedPostgres.js"
import { COMPANY_PROFILE } from "../../support/BillingProfile.js"
import { MyInvoisStandIn, MyInvoisStandInLive } from "../../support/MyInvoisStandIn.js"
import { type ServiceProcess, startService, stopService } from "../../support/ServiceProcess.js"
import { freshDatabase } from "../../support/TestServer.js"

/**
 * A service process SIGKILLed while MyInvois holds its submission (docs/api/e-invoices.md, "How submission
 * works"): MyInvois took the document, the process died before it wrote the answer down. Restarted with
 * the same identity, the service finds the document by its number instead of sending it again: one
 * submission, one valid e-invoice. A proxy between the service and the MyInvois stand-in passes the first
 * submission on and then holds its answer back, so the kill lands exactly there.
 */

/** Passes requests to `target`, except that the first submission's answer never comes back. */
const holdingProxy = (target: string) =>
  Effect.acquireRelease(
    Effect.promise(() =>
      new Promise<{ url: string; held: Promise<void>; paths: Array<string>; close: () => void }>((resolve) => {
        const paths: Array<string> = []
        let hold = true
        let heldNow: () => void = () => {}
        const held = new Promise<void>((done) => (heldNow = done))
        const server = createServer((incoming: IncomingMessage, outgoing: ServerResponse) => {
          paths.push(`${incoming.method} ${incoming.url}`)
          const upstream = new URL(target)
          const forwarded = httpRequest({
            host: upstream.hostname,
            port: upstream.port,
            method: incoming.method,
            path: incoming.url,
            headers: incoming.headers
          }, (answer) => {
            const holdThis = hold && incoming.method === "POST" && incoming.url === "/api/v1.0/documentsubmissions"
            if (holdThis) {
              hold = false
              answer.resume()
              heldNow()
              return
            }
            outgoing.writeHead(answer.statusCode ?? 502, answer.headers)
            answer.pipe(outgoing)
          })
          forwarded.on("error", () => outgoing.destroy())
          incoming.pipe(forwarded)
        })
        server.listen(0, "127.0.0.1", () => {
          const { port } = server.address() as AddressInfo
          resolve({
            url: `http://127.0.0.1:${port}`,
            held,
            paths,
            close: () => {
              server.closeAllConnections()
              server.close()
            }
          })
        })
      })
    ),
    (proxy) => Effect.sync(proxy.close)
  )

const api = async (service: ServiceProcess, method: string, path: string, token?: string, json?: unknown) => {
  const response = await fetch(`${service.baseUrl}${path}`, {
    method,
    headers: {
      ...(token === undefined ? {} : { authorization: `Bearer ${token}` }),
      ...(json === undefined ? {} : { "content-type": "application/json" })
    },
    ...(json === undefined ? {} : { body: JSON.stringify(json) }),
    signal: AbortSignal.timeout(30_000)
  })
  const text = await response.text()
  const isJson = (response.headers.get("content-type") ?? "").includes("json")
  return { status: response.status, text, body: isJson ? JSON.parse(text) : undefined }
}

const started = (port: number, env: Record<string, string>) =>
  Effect.acquireRelease(
    Effect.promise(() => startService({ from: "source", port, env })),
    (service) => Effect.promise(() => stopService(service, "SIGKILL"))
  )

layer(MyInvoisStandInLive, { timeout: 240_000 })("a kill during submission", (it) => {
  it.scoped("leaves nothing lost and nothing submitted twice: the restart looks the document up by number", () =>
    Effect.gen(function*() {
      const standIn = yield* MyInvoisStandIn
      const proxy = yield* holdingProxy(standIn.url)
      const database = yield* freshDatabase
      const dataDir = yield* Effect.acquireRelease(
        Effect.promise(() => mkdtemp(join(tmpdir(), "nenas-einvoice-kill-"))),
        (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true }))
      )
      const port = yield* Effect.promise(freePort)
      const env = {
        DATABASE_URL: database.url,
        DATA_DIR: dataDir,
        PUBLIC_BASE_URL: `http://127.0.0.1:${port}`,
        INSTANCE_ID: "einvoice-kill-test",
        MYINVOIS_BASE_URL: proxy.url,
        MYINVOIS_CLIENT_ID: "nenas-erp",
        MYINVOIS_CLIENT_SECRET: "erp-secret",
        IP_CHECKOUTS_PER_MINUTE: "1000",
        IP_DEV_SESSIONS_PER_MINUTE: "1000"
      }
      const first = yield* started(port, env)
      const session = yield* Effect.promise(() =>
        api(first, "POST", "/dev/session", undefined, { email: "kill@example.my" })
      )
      const token = session.body.token as string
      expect(
        (yield* Effect.promise(() => api(first, "PUT", "/dashboard/billing/profile", token, COMPANY_PROFILE))).status
      )
        .toBe(200)
      const checkout = yield* Effect.promise(() =>
        api(first, "POST", "/dashboard/billing/checkout", token, { amount_sen: 1000 })
      )
      expect((yield* Effect.promise(() => api(first, "POST", `/dev/checkout/${checkout.body.session_id}/pay`))).status)
        .toBe(200)
      // MyInvois has taken the document; its answer is held: the process dies now.
      yield* Effect.promise(() => proxy.held)
      yield* Effect.promise(() => stopService(first, "SIGKILL"))
      expect(standIn.sim.documents()).toHaveLength(1)
      const number = standIn.sim.documents()[0]!.codeNumber

      const second = yield* started(port, env)
      const deadline = Date.now() + 60_000
      let status = ""
      while (Date.now() < deadline) {
        const list = yield* Effect.promise(() => api(second, "GET", "/dashboard/billing/invoices", token))
        status = list.body.data[0]?.e_invoice.status
        if (status === "valid") break
        yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 200)))
      }
      expect(status).toBe("valid")
      expect(standIn.submissions.filter((submission) => submission.codeNumbers.includes(number))).toHaveLength(1)
      expect(standIn.sim.documents()).toHaveLength(1)
      expect(proxy.paths.some((path) => path.startsWith("GET /api/v1.0/documents/search")), "looked up by number")
        .toBe(true)
    }))
})
