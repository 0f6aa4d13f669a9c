/** The bench's developer account, through the service's public API: a session, a live key, a funded wallet, billing checks. */
import { log, sleep } from "./processes.js"

/** The most one checkout credits (the largest of the top-up options). */
const TOPUP_SEN = 50_000

interface Reply {
  readonly status: number
  readonly body: unknown
  readonly text: string
}

const request = async (
  method: string,
  url: string,
  options: { token?: string; json?: unknown } = {}
): Promise<Reply> => {
  const headers: Record<string, string> = {}
  if (options.token !== undefined) headers["authorization"] = `Bearer ${options.token}`
  if (options.json !== undefined) headers["content-type"] = "application/json"
  const response = await fetch(url, {
    method,
    headers,
    ...(options.json === undefined ? {} : { body: JSON.stringify(options.json) })
  })
  const text = await response.text()
  let body: unknown = undefined
  try {
    body = JSON.parse(text)
  } catch {
    // HTML pages (the simulated checkout) and empty bodies
  }
  return { status: response.status, body, text }
}

export const field = (value: unknown, ...path: Array<string | number>): unknown => {
  let current = value
  for (const key of path) {
    if (typeof current !== "object" || current === null) return undefined
    current = (current as Record<string | number, unknown>)[key]
  }
  return current
}

const expectStatus = (reply: Reply, statuses: ReadonlyArray<number>, what: string) => {
  if (!statuses.includes(reply.status)) {
    throw new Error(`${what}: expected ${statuses.join(" or ")}, got ${reply.status}: ${reply.text.slice(0, 500)}`)
  }
}

export interface Account {
  readonly base: string
  /** The dashboard session. */
  readonly token: string
  /** A live key with no monthly spend limit. */
  readonly apiKey: string
}

/** A development session and a live API key on a service started without an identity provider. */
export const createAccount = async (base: string, email = "bench@example.com"): Promise<Account> => {
  const session = await request("POST", `${base}/dev/session`, { json: { email } })
  expectStatus(session, [200], "dev session")
  const token = String(field(session.body, "token"))
  const key = await request("POST", `${base}/dashboard/api-keys`, { token, json: { name: "bench" } })
  expectStatus(key, [200, 201], "create API key")
  return { base, token, apiKey: String(field(key.body, "full_key")) }
}

/** A live key of the account whose guardrail override redacts every kind of personal data (docs/api/guardrails.md). */
export const createGuardedKey = async (account: Account): Promise<string> => {
  const key = await request("POST", `${account.base}/dashboard/api-keys`, {
    token: account.token,
    json: { name: "bench-guarded" }
  })
  expectStatus(key, [200, 201], "create guarded API key")
  const id = String(field(key.body, "key", "id"))
  const patched = await request("PATCH", `${account.base}/dashboard/api-keys/${id}`, {
    token: account.token,
    json: { guardrails: { pii: { action: "redact" } } }
  })
  expectStatus(patched, [200], "set the guarded key's policy")
  return String(field(key.body, "full_key"))
}

/** The account's own provider key on `baseUrl` (the fake upstream, an allowed host), tried first for its calls. */
export const createProviderKey = async (account: Account, baseUrl: string): Promise<void> => {
  const key = await request("POST", `${account.base}/dashboard/provider-keys`, {
    token: account.token,
    json: {
      name: "bench own key",
      base_url: baseUrl,
      api_key: "sk-bench-own-provider-key",
      models: { general: "own-general", reasoning: "own-reasoning" },
      mode: "first"
    }
  })
  expectStatus(key, [201], "create provider key")
}

/** A test key of the account: its calls answer from the simulated model, with no hold, no upstream and no charge. */
export const createTestKey = async (account: Account): Promise<string> => {
  const key = await request("POST", `${account.base}/dashboard/api-keys`, {
    token: account.token,
    json: { name: "bench-test", environment: "test" }
  })
  expectStatus(key, [200, 201], "create test API key")
  return String(field(key.body, "full_key"))
}

const balance = async (account: Account) => {
  const reply = await request("GET", `${account.base}/dashboard/billing/balance`, { token: account.token })
  expectStatus(reply, [200], "balance")
  return reply.body
}

const topUp = async (account: Account) => {
  const checkout = await request("POST", `${account.base}/dashboard/billing/checkout`, {
    token: account.token,
    json: { amount_sen: TOPUP_SEN }
  })
  expectStatus(checkout, [200], "checkout")
  const paid = await request("POST", `${String(field(checkout.body, "url"))}/pay`)
  expectStatus(paid, [200], "simulated checkout pay")
}

/** Tops the wallet up (simulated checkout) until it holds `needed` micro-MYR. */
export const ensureFunds = async (account: Account, needed: number) => {
  let available = Number(field(await balance(account), "wallet", "availableMicroMyr"))
  let topUps = 0
  while (available < needed) {
    await topUp(account)
    topUps += 1
    const now = Number(field(await balance(account), "wallet", "availableMicroMyr"))
    if (now <= available) throw new Error(`a top-up did not reach the wallet (available stays ${now} micro-MYR)`)
    available = now
  }
  if (topUps > 0) log(`topped up RM ${(topUps * TOPUP_SEN) / 100}; available RM ${(available / 1_000_000).toFixed(2)}`)
}

/** One whole chat call; throws unless it answers 200. */
/** One chat call; `cache` is its `Nenas-Cache` header, if any. */
export const chatCall = async (account: Account, body: string, cache?: string) => {
  const reply = await fetch(`${account.base}/v1/chat/completions`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      authorization: `Bearer ${account.apiKey}`,
      ...(cache === undefined ? {} : { "nenas-cache": cache })
    },
    body
  })
  const text = await reply.text()
  if (reply.status !== 200) throw new Error(`a model call failed: ${reply.status} ${text.slice(0, 500)}`)
  return text
}

const logCount = async (account: Account, status: string) => {
  const page = await request("GET", `${account.base}/dashboard/logs?limit=1&status=${status}`, { token: account.token })
  expectStatus(page, [200], `logs?status=${status}`)
  return Number(field(page.body, "total"))
}

/**
 * That the runs were billed: calls cut when a run stopped settle, a last whole
 * call is billed with a cost, nothing stays reserved. Lines to print, each
 * PASS or MISS.
 */
export const billingCheck = async (account: Account, body: string): Promise<Array<string>> => {
  const verdict = (ok: boolean) => ok ? "PASS" : "MISS"
  const settleStart = Date.now()
  let pending = await logCount(account, "pending")
  while (pending > 0 && Date.now() - settleStart < 15_000) {
    await sleep(250)
    pending = await logCount(account, "pending")
  }
  await chatCall(account, body)
  const wallet = field(await balance(account), "wallet")
  const spend = Number(field(wallet, "lifetimeSpendMicroMyr"))
  const reserved = Number(field(wallet, "reservedMicroMyr"))
  const latest = await request("GET", `${account.base}/dashboard/logs?limit=1`, { token: account.token })
  expectStatus(latest, [200], "logs")
  const latestStatus = String(field(latest.body, "logs", 0, "status"))
  const latestCost = Number(field(latest.body, "logs", 0, "costMicroMyr"))
  const counts: Record<string, number> = {}
  for (const status of ["billed", "succeeded", "pending", "failed"]) counts[status] = await logCount(account, status)
  const billed = counts["billed"] ?? 0
  return [
    `${verdict(spend > 0)}  lifetime spend RM ${(spend / 1_000_000).toFixed(6)} (${
      billed > 0 ? (spend / billed).toFixed(1) : "-"
    } micro-MYR per billed call)`,
    `${
      verdict(latestStatus === "billed" && latestCost > 0)
    }  a last whole call's request log: ${latestStatus}, ${latestCost} micro-MYR`,
    `${
      verdict(reserved === 0 && pending === 0)
    }  nothing reserved (${reserved} micro-MYR) or pending (${pending} logs) ${
      ((Date.now() - settleStart) / 1000).toFixed(1)
    } s after the runs cut their calls in flight`,
    `      request_logs: ${Number(field(latest.body, "total"))} rows (${
      Object.entries(counts).map(([s, n]) => `${s} ${n}`).join(", ")
    })`
  ]
}
