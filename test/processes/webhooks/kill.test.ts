import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Webhook } from "standardwebhooks"
import { freePort } from "../../../src/Database/EmbeddedPostgres.js"
import { type ServiceProcess, startService, stopService } from "../../support/ServiceProcess.js"
import { freshDatabase, withClient } from "../../support/TestServer.js"
import { WebhookReceiver, WebhookReceiverLive } from "../../support/WebhookReceiver.js"

/**
 * The outbox survives its process: the money movement commits its
 * event with it; the process is SIGKILLed while the delivery is on the wire;
 * another instance on the same database delivers it once its claim lapses.
 */

const post = async (service: ServiceProcess, path: string, token?: string, json?: unknown) => {
  const response = await fetch(`${service.baseUrl}${path}`, {
    method: "POST",
    headers: {
      ...(token === undefined ? {} : { authorization: `Bearer ${token}` }),
      ...(json === undefined ? {} : { "content-type": "application/json" })
    },
    ...(json === undefined ? {} : { body: JSON.stringify(json) })
  })
  const text = await response.text()
  if (response.status >= 300) throw new Error(`${path}: ${response.status} ${text}`)
  return text.startsWith("{") ? JSON.parse(text) : text
}

const poll = async <A>(
  what: string,
  probe: () => Promise<A>,
  done: (a: A) => boolean,
  limitMs = 30_000
): Promise<A> => {
  const until = Date.now() + limitMs
  while (true) {
    const answer = await probe()
    if (done(answer)) return answer
    if (Date.now() > until) throw new Error(`${what}: not seen; last ${JSON.stringify(answer).slice(0, 300)}`)
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
}

layer(WebhookReceiverLive, { excludeTestServices: true, timeout: 180_000 })("webhooks and SIGKILL", (it) => {
  it.scoped(
    "a SIGKILL between the money movement and the delivery still delivers, through another instance",
    () =>
      Effect.gen(function*() {
        const receiver = yield* WebhookReceiver
        const database = yield* freshDatabase
        const dataDir = yield* Effect.acquireRelease(
          Effect.promise(() => mkdtemp(join(tmpdir(), "nenas-hookkill-"))),
          (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true }))
        )
        const env = (id: string) => ({
          DATABASE_URL: database.url,
          DATA_DIR: dataDir,
          INSTANCE_ID: id,
          WEBHOOK_ALLOWED_HOSTS: `127.0.0.1:${receiver.port}`,
          WEBHOOK_TIMEOUT_MS: "1500",
          LOG_FORMAT: "json"
        })
        const start = (id: string) =>
          Effect.acquireRelease(
            Effect.promise(async () => startService({ from: "source", port: await freePort(), env: env(id) })),
            (service) => Effect.promise(() => stopService(service, "SIGKILL"))
          )
        const a = yield* start("hookkill-a")
        const result = yield* Effect.promise(async () => {
          const { token } = await post(a, "/dev/session", undefined, { email: "killed@example.com" })
          const { secret } = await post(a, "/dashboard/webhooks", token, {
            url: receiver.url("/kill"),
            events: ["topup.succeeded"]
          })
          receiver.script("/kill", ["hang", "200"])
          const checkout = await post(a, "/dashboard/billing/checkout", token, { amount_sen: 2500 })
          await post(a, `/dev/checkout/${checkout.session_id}/pay`)
          // The delivery is on the wire (the receiver holds it): kill the process now.
          await poll("first attempt", async () =>
            receiver.received().filter((r) => r.path === "/kill").length, (n) =>
            n === 1)
          await stopService(a, "SIGKILL")
          return { secret: secret as string, transactionId: checkout.transaction_id as string }
        })
        const facts = () =>
          withClient(database.url, async (client) => ({
            topups: (await client.query("SELECT count(*)::int AS n FROM ledger_entries WHERE type = 'topup'")).rows[0]
              .n as number,
            deliveries: (await client.query("SELECT status, attempts FROM webhook_deliveries")).rows as Array<
              { status: string; attempts: number }
            >,
            attempts: (await client.query("SELECT ok, status_code, instance_id FROM webhook_attempts")).rows as Array<
              { ok: boolean; status_code: number | null; instance_id: string }
            >
          }))
        const killed = yield* Effect.promise(facts)
        // The money moved and its event is committed; the killed attempt left no answer behind.
        expect(killed.topups).toBe(1)
        expect(killed.deliveries).toEqual([{ status: "pending", attempts: 1 }])
        expect(killed.attempts).toEqual([])
        yield* start("hookkill-b")
        const after = yield* Effect.promise(() =>
          poll("delivered by b", facts, (f) =>
            f.deliveries[0]?.status === "delivered")
        )
        expect(after.deliveries).toEqual([{ status: "delivered", attempts: 2 }])
        expect(after.attempts).toEqual([{ ok: true, status_code: 200, instance_id: "hookkill-b" }])
        const got = receiver.received().filter((r) => r.path === "/kill")
        expect(got.length).toBe(2)
        expect(got[1]!.headers["webhook-id"]).toBe(got[0]!.headers["webhook-id"])
        const payload = new Webhook(result.secret).verify(got[1]!.body, got[1]!.headers as Record<string, string>) as {
          type: string
          data: Record<string, unknown>
        }
        expect(payload).toMatchObject({
          type: "topup.succeeded",
          data: { transaction_id: result.transactionId, amount_myr: 25 }
        })
      }),
    170_000
  ) // two service processes start in turn: slow on a loaded two-core machine
})
