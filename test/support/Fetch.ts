import Stripe from "stripe"
import { randomBase62 } from "../../src/Domain/Ids.js"
import { WEBHOOK_SECRET } from "./Stripe.js"

/**
 * Plain fetch against a service at a URL, for a service in a child process
 * (`ServiceProcess`); `Http.ts` does the same for the `TestServer`.
 */

// arbitrary JSON: each scenario asserts the fields it reads
export type Json = any

export interface JsonReply {
  readonly status: number
  readonly body: Json
  readonly text: string
}

export const fetchJson = async (
  baseUrl: string,
  method: string,
  path: string,
  options: { readonly json?: unknown; readonly token?: string | undefined; readonly timeoutMs?: number } = {}
): Promise<JsonReply> => {
  const reply = await fetch(`${baseUrl}${path}`, {
    method,
    headers: {
      ...(options.json === undefined ? {} : { "content-type": "application/json" }),
      ...(options.token === undefined ? {} : { authorization: `Bearer ${options.token}` })
    },
    ...(options.json === undefined ? {} : { body: JSON.stringify(options.json) }),
    signal: AbortSignal.timeout(options.timeoutMs ?? 60_000)
  })
  const text = await reply.text()
  return { status: reply.status, body: text === "" ? undefined : JSON.parse(text), text }
}

/** A signed Stripe `checkout.session.completed` for `checkout` (the service runs with `WEBHOOK_SECRET`). */
const payBySignedWebhook = async (baseUrl: string, checkout: Json, amountSen: number) => {
  const payload = JSON.stringify({
    id: `evt_${randomBase62(24)}`,
    object: "event",
    type: "checkout.session.completed",
    data: {
      object: {
        id: checkout.session_id,
        object: "checkout.session",
        payment_status: "paid",
        amount_total: amountSen,
        currency: "myr",
        client_reference_id: checkout.transaction_id,
        metadata: { transaction_id: checkout.transaction_id },
        payment_intent: `pi_${randomBase62(24)}`
      }
    }
  })
  const signature = Stripe.webhooks.generateTestHeaderString({ payload, secret: WEBHOOK_SECRET })
  return fetch(`${baseUrl}/billing/stripe/webhook`, {
    method: "POST",
    headers: { "content-type": "application/json", "stripe-signature": signature },
    body: payload
  })
}

/**
 * A developer with a live key and a wallet topped up with `amountSen`, paid
 * by a signed Stripe completion (`signed webhook`) or, for a service without
 * Stripe, through the simulated checkout.
 */
export const fundedDeveloper = async (
  baseUrl: string,
  email: string,
  amountSen: number,
  payment: "signed webhook" | "simulated checkout"
) => {
  const { token } = (await fetchJson(baseUrl, "POST", "/dev/session", { json: { email } })).body as { token: string }
  const checkout = await fetchJson(baseUrl, "POST", "/dashboard/billing/checkout", {
    json: { amount_sen: amountSen },
    token
  })
  if (checkout.status !== 200) throw new Error(`checkout: ${checkout.status} ${checkout.text}`)
  const paid = payment === "signed webhook"
    ? await payBySignedWebhook(baseUrl, checkout.body, amountSen)
    : await fetch(`${baseUrl}/dev/checkout/${checkout.body.session_id}/pay`, { method: "POST" })
  if (paid.status !== 200) throw new Error(`top-up: ${paid.status} ${await paid.text()}`)
  const key = await fetchJson(baseUrl, "POST", "/dashboard/api-keys", {
    json: { name: "funded", environment: "live" },
    token
  })
  if (key.status !== 201) throw new Error(`key: ${key.text}`)
  return { token, apiKey: key.body.full_key as string }
}
