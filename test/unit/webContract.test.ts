import { describe, expect, it } from "@effect/vitest"
import { readFileSync } from "node:fs"
import { CONTRACT_FILE, contractSource } from "../../web/contract.js"

/**
 * The dashboard's client is typed by web/src/contract.ts, printed from the contract
 * (NenasApi's OpenAPI document); `tsc -p web` then refuses a page that does not
 * follow it (web/src/contract.typetest.ts shows what it refuses). Here: the file is
 * the contract as it is now, so a contract change reaches the dashboard's type-check.
 */
describe("the web client's contract", () => {
  it("is what the service's contract says (else run `npm run contract:web`)", () => {
    expect(readFileSync(CONTRACT_FILE, "utf8")).toBe(contractSource())
  })

  it("keys the dashboard's routes by method and path, as /openapi.json does", () => {
    const source = contractSource()
    for (
      const route of [
        "GET /dashboard/api-keys",
        "PATCH /dashboard/api-keys/{id}",
        "GET /dashboard/logs/{request_id}/conversation",
        "POST /dashboard/webhooks/{id}/deliveries/{delivery_id}/resend",
        "GET /dashboard/billing/balance",
        "POST /dev/session"
      ]
    ) expect(source).toContain(`readonly ${JSON.stringify(route)}: {`)
    // Only the dashboard's routes and the development sign-in: not the model API.
    expect(source).not.toMatch(/"[A-Z]+ \/v1\//)
  })
})
