import { Duration, Effect, Redacted, TestClock, TestContext } from "effect"
import { describe, expect, it } from "vitest"
import {
  documentHash,
  makeClient,
  retryAfterMs,
  type WireRequest,
  type WireResponse
} from "../../src/EInvoicing/MyInvois.js"
import type { Party } from "../../src/Invoices/Api.js"
import { routeOf } from "../../src/Invoices/Documents.js"

/**
 * The MyInvois client's decisions on a scripted transport, without a network (docs/api/e-invoices.md, "How
 * submission works"): the token kept and renewed, what each answer means to the worker, the wire shapes sent.
 */

const CREDENTIALS = { clientId: "erp", clientSecret: Redacted.make("secret") }

/** A transport answering from `script` by path, recording every request. */
const scripted = (script: (request: WireRequest, index: number) => WireResponse) => {
  const requests: Array<WireRequest> = []
  const transport = (request: WireRequest) =>
    Effect.sync(() => {
      requests.push(request)
      return script(request, requests.length - 1)
    })
  return { requests, transport }
}

const token = (value: string, expiresIn = 3600): WireResponse => ({
  status: 200,
  headers: {},
  body: { access_token: value, expires_in: expiresIn, token_type: "Bearer", scope: "InvoicingAPI" }
})
const accepted: WireResponse = {
  status: 202,
  headers: {},
  body: {
    submissionUid: "SUB1",
    acceptedDocuments: [{ uuid: "UUID1", invoiceCodeNumber: "INV-2026-000001" }],
    rejectedDocuments: [{
      invoiceCodeNumber: "INV-2026-000002",
      error: {
        code: "BadArgument",
        message: "Invalid structure",
        target: "INV-2026-000002",
        details: [{
          code: "CF321",
          message: "Issue date is too old",
          target: "IssueDate",
          propertyPath: "Invoice.IssueDate"
        }]
      }
    }]
  }
}

const run = <A, E>(effect: Effect.Effect<A, E>) =>
  Effect.runPromise(Effect.either(effect).pipe(Effect.provide(TestContext.TestContext)))

const DOCUMENTS = [
  { codeNumber: "INV-2026-000001", text: "{\"a\":1}" },
  { codeNumber: "INV-2026-000002", text: "{\"b\":2}" }
]

describe("the MyInvois client", () => {
  it("logs in once with client credentials and scope InvoicingAPI, and sends documents in base64 with their hash", async () => {
    const { requests, transport } = scripted((request) => request.path === "/connect/token" ? token("T1") : accepted)
    const answer = await run(Effect.gen(function*() {
      const client = yield* makeClient(transport, CREDENTIALS, "myinvois")
      yield* client.submit(DOCUMENTS)
      return yield* client.submit(DOCUMENTS)
    }))
    expect(answer._tag).toBe("Right")
    if (answer._tag === "Right") {
      expect(answer.right).toEqual({
        submissionUid: "SUB1",
        accepted: [{ codeNumber: "INV-2026-000001", uuid: "UUID1" }],
        rejected: [{
          codeNumber: "INV-2026-000002",
          errors: [
            { code: "BadArgument", message: "Invalid structure", target: "INV-2026-000002" },
            { code: "CF321", message: "Issue date is too old", target: "Invoice.IssueDate" }
          ]
        }]
      })
    }
    expect(requests.filter((request) => request.path === "/connect/token")).toHaveLength(1)
    expect(requests[0]!.form).toEqual({
      client_id: "erp",
      client_secret: "secret",
      grant_type: "client_credentials",
      scope: "InvoicingAPI"
    })
    const body = requests[1]!.json as { documents: Array<Record<string, string>> }
    expect(requests[1]!.token).toBe("T1")
    expect(body.documents[0]).toEqual({
      format: "JSON",
      document: Buffer.from("{\"a\":1}").toString("base64"),
      documentHash: documentHash("{\"a\":1}"),
      codeNumber: "INV-2026-000001"
    })
    expect(documentHash("{\"a\":1}")).toMatch(/^[0-9a-f]{64}$/)
  })

  it("renews the token 5 minutes before it expires, and after a 401", async () => {
    let logins = 0
    let refuseOnce = true
    const { requests, transport } = scripted((request) => {
      if (request.path === "/connect/token") return token(`T${++logins}`)
      if (request.token === "T2" && refuseOnce) {
        refuseOnce = false
        return { status: 401, headers: {}, body: null }
      }
      return accepted
    })
    await Effect.runPromise(
      Effect.gen(function*() {
        const client = yield* makeClient(transport, CREDENTIALS, "myinvois")
        yield* client.submit(DOCUMENTS)
        yield* TestClock.adjust(Duration.minutes(54))
        yield* client.submit(DOCUMENTS)
        yield* TestClock.adjust(Duration.minutes(2))
        yield* client.submit(DOCUMENTS)
      }).pipe(Effect.provide(TestContext.TestContext))
    )
    const used = requests.filter((request) => request.path !== "/connect/token").map((request) => request.token)
    // T1 until 55 minutes; T2 refused once (revoked), T3 after it.
    expect(used).toEqual(["T1", "T1", "T2", "T3"])
    expect(logins).toBe(3)
  })

  it("maps MyInvois' answers to what the worker does with them", async () => {
    const cases: ReadonlyArray<readonly [WireResponse, Record<string, unknown>]> = [
      [{ status: 429, headers: { "retry-after": "30" }, body: null }, { kind: "throttled", retryAfterMs: 30_000 }],
      [
        {
          status: 422,
          headers: { "retry-after": "600" },
          body: { error: { code: "DuplicateSubmission", message: "dup" } }
        },
        { kind: "throttled", code: "DuplicateSubmission", retryAfterMs: 600_000 }
      ],
      [{ status: 503, headers: {}, body: null }, { kind: "unavailable" }],
      [
        { status: 400, headers: {}, body: { error: { code: "BadStructure", message: "Submission is not valid" } } },
        { kind: "refused", code: "BadStructure", message: "Submission is not valid" }
      ],
      [{ status: 202, headers: {}, body: { unexpected: true } }, { kind: "unavailable" }]
    ]
    for (const [response, expected] of cases) {
      const { transport } = scripted((request) => request.path === "/connect/token" ? token("T") : response)
      const answer = await run(
        Effect.flatMap(makeClient(transport, CREDENTIALS, "myinvois"), (client) => client.submit(DOCUMENTS))
      )
      expect(answer._tag, JSON.stringify(response)).toBe("Left")
      if (answer._tag === "Left") expect(answer.left).toMatchObject(expected)
    }
    // A login refused is MyInvois unavailable to us: the worker retries later (and the log says why).
    const { transport } = scripted(() => ({ status: 400, headers: {}, body: { error: "invalid_client" } }))
    const refused = await run(
      Effect.flatMap(makeClient(transport, CREDENTIALS, "myinvois"), (client) => client.submit(DOCUMENTS))
    )
    expect(refused._tag === "Left" && refused.left.code).toBe("invalid_client")
  })

  it("reads every page of a submission, and a document's validation errors", async () => {
    const summary = (n: number) => ({
      uuid: `U${n}`,
      submissionUid: "SUB1",
      longId: n % 2 === 0 ? `L${n}` : null,
      internalId: `INV-${n}`,
      status: n % 2 === 0 ? "Valid" : "Submitted",
      dateTimeValidated: n % 2 === 0 ? "2026-12-02T06:00:00Z" : null
    })
    const { requests, transport } = scripted((request) => {
      if (request.path === "/connect/token") return token("T")
      if (request.path.endsWith("/details")) {
        return {
          status: 200,
          headers: {},
          body: {
            ...summary(1),
            status: "Invalid",
            validationResults: {
              status: "Invalid",
              validationSteps: [
                { status: "Valid", name: "Step01-Structure" },
                {
                  status: "Invalid",
                  name: "Step03-TIN",
                  error: {
                    propertyName: "TIN",
                    propertyPath: "Invoice.AccountingCustomerParty",
                    errorCode: "CF404",
                    error: "Buyer TIN not found",
                    innerError: [{ errorCode: "CF405", error: "Inner", propertyPath: "x" }]
                  }
                }
              ]
            }
          }
        }
      }
      const page = Number(request.query?.["pageNo"])
      const all = Array.from({ length: 150 }, (_, index) => summary(index + 1))
      return {
        status: 200,
        headers: {},
        body: { submissionUid: "SUB1", documentCount: 150, documentSummary: all.slice((page - 1) * 100, page * 100) }
      }
    })
    const answer = await run(Effect.gen(function*() {
      const client = yield* makeClient(transport, CREDENTIALS, "myinvois")
      return { states: yield* client.submission("SUB1"), details: yield* client.details("U1") }
    }))
    expect(answer._tag).toBe("Right")
    if (answer._tag !== "Right") return
    expect(answer.right.states).toHaveLength(150)
    expect(answer.right.states[1]).toEqual({
      uuid: "U2",
      codeNumber: "INV-2",
      submissionUid: "SUB1",
      status: "Valid",
      longId: "L2",
      validatedAt: new Date("2026-12-02T06:00:00Z")
    })
    expect(answer.right.details.errors).toEqual([
      { code: "CF404", message: "Buyer TIN not found", target: "Invoice.AccountingCustomerParty" },
      { code: "CF405", message: "Inner", target: "x" }
    ])
    expect(requests.filter((request) => request.path === "/api/v1.0/documentsubmissions/SUB1")).toHaveLength(2)
  })

  it("Retry-After in seconds or as a date", () => {
    expect(retryAfterMs("12", 0)).toBe(12_000)
    expect(retryAfterMs(new Date(60_000).toUTCString(), 0)).toBe(60_000)
    expect(retryAfterMs(undefined, 0)).toBeNull()
    expect(retryAfterMs("soon", 0)).toBeNull()
  })
})

const buyer = (tin: string | null): Party => ({
  legal_name: "Buyer",
  tin,
  id_type: null,
  id_value: null,
  sst_number: null,
  msic: null,
  email: null,
  phone: null,
  address: null
})

describe("who gets what", () => {
  it.each(
    [
      ["a buyer with a TIN", buyer("C1234567890"), 1080, "single"],
      ["a buyer without one", buyer(null), 1080, "consolidated"],
      ["RM 10,000 exactly, consolidated", buyer(null), 1_000_000, "consolidated"],
      ["above RM 10,000: never consolidated", buyer(null), 1_000_001, "single"]
    ] as const
  )("%s", (_, party, totalSen, route) => {
    expect(routeOf(party, totalSen)).toBe(route)
  })
})
