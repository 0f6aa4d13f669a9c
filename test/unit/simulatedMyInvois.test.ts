import { Effect, Option, Redacted } from "effect"
import { describe, expect, it } from "vitest"
import { makeClient, simulatedTransport } from "../../src/EInvoicing/MyInvois.js"
import { hashOf } from "../../src/EInvoicing/Rules.js"
import { type Answer, SimulatedMyInvois } from "../../src/EInvoicing/SimulatedMyInvois.js"
import { makeMyInvoisStandIn, sampleDocument, submissionEntry, withSignature } from "../support/MyInvoisStandIn.js"

/**
 * The simulated MyInvois (docs/api/e-invoices.md, "How submission works") on its own clock: submission, the
 * lifecycle Submitted → Valid | Invalid, duplicates, cancellation inside and outside 72 hours, search, and the
 * stand-in that serves it over HTTP to the real client.
 */

const ISSUER = "C25845632020"
const START = new Date("2026-03-02T08:00:00Z")
const HOUR = 3600 * 1000

const setUp = (options: { readonly validateAfterMs?: number } = {}) => {
  let now = START
  const sim = new SimulatedMyInvois({ issuerTin: ISSUER, now: () => now, ...options })
  return {
    sim,
    advance: (ms: number) => {
      now = new Date(now.getTime() + ms)
    },
    now: () => now
  }
}

type Body = Record<string, any>
const body = (answer: Answer) => answer.body as Body

const invoiceAt = (
  issuedAt: Date,
  number = "INV2026000001",
  extra: Partial<Parameters<typeof sampleDocument>[0]> = {}
) => sampleDocument({ number, issuedAt, ...extra })

const submitOne = (sim: SimulatedMyInvois, document: Record<string, unknown>) => {
  const answer = sim.submit({ documents: [submissionEntry(document)] })
  expect(answer.status).toBe(202)
  return body(answer)
}

/** Submits and validates: the document's uuid once Valid. */
const validDocument = (world: ReturnType<typeof setUp>, document: Record<string, unknown>) => {
  const answer = submitOne(world.sim, document)
  expect(answer.rejectedDocuments).toEqual([])
  world.advance(2_000)
  const uuid = answer.acceptedDocuments[0].uuid as string
  expect(body(world.sim.details(uuid)).status).toBe("Valid")
  return uuid
}

describe("login", () => {
  it("client credentials give a bearer token for an hour; other grants and blank credentials are refused", () => {
    const world = setUp()
    const granted = world.sim.login({
      client_id: "erp",
      client_secret: "secret",
      grant_type: "client_credentials",
      scope: "InvoicingAPI"
    })
    expect(granted.status).toBe(200)
    expect(body(granted)).toMatchObject({ token_type: "Bearer", expires_in: 3600, scope: "InvoicingAPI" })
    const token = body(granted).access_token as string
    expect(token.split(".")).toHaveLength(3)
    expect(world.sim.authenticates(token)).toBe(true)
    world.advance(HOUR)
    expect(world.sim.authenticates(token), "expired after 3600 s").toBe(false)
    expect(body(world.sim.login({ client_id: "erp", client_secret: "secret", grant_type: "password" })).error).toBe(
      "unsupported_grant_type"
    )
    expect(body(world.sim.login({ client_id: "", client_secret: "secret", grant_type: "client_credentials" })).error)
      .toBe("invalid_request")
  })

  it("with credentials configured, only those", () => {
    const sim = new SimulatedMyInvois({ issuerTin: ISSUER, credentials: { clientId: "erp", clientSecret: "right" } })
    const refused = sim.login({ client_id: "erp", client_secret: "wrong", grant_type: "client_credentials" })
    expect(refused).toMatchObject({ status: 400, body: { error: "invalid_client" } })
    expect(sim.login({ client_id: "erp", client_secret: "right", grant_type: "client_credentials" }).status).toBe(200)
  })
})

describe("a document's lifecycle", () => {
  it("Submitted until validateAfterMs has passed, then Valid with a long id", () => {
    const world = setUp()
    const answer = submitOne(world.sim, invoiceAt(START))
    expect(answer.submissionUid).toMatch(/^[0-9A-Z]{26}$/)
    expect(answer.acceptedDocuments).toEqual([{
      uuid: expect.stringMatching(/^[0-9A-Z]{26}$/),
      invoiceCodeNumber: "INV2026000001"
    }])
    const uid = answer.submissionUid as string
    const uuid = answer.acceptedDocuments[0].uuid as string
    const early = body(world.sim.submission(uid))
    expect(early).toMatchObject({ submissionUid: uid, documentCount: 1, overallStatus: "in progress" })
    expect(early.documentSummary[0]).toMatchObject({
      uuid,
      status: "Submitted",
      longId: null,
      internalId: "INV2026000001"
    })
    world.advance(1_999)
    expect(body(world.sim.details(uuid)).status).toBe("Submitted")
    world.advance(1)
    const late = body(world.sim.submission(uid))
    expect(late.overallStatus).toBe("valid")
    expect(late.documentSummary[0]).toMatchObject({
      status: "Valid",
      longId: expect.stringMatching(/^[0-9A-Z]{40}$/),
      issuerTin: ISSUER,
      typeName: "invoice",
      typeVersionName: "1.0",
      totalPayableAmount: 10.8,
      dateTimeValidated: "2026-03-02T08:00:02Z"
    })
    const details = body(world.sim.details(uuid))
    expect(details.validationResults.status).toBe("Valid")
    expect(details.validationResults.validationSteps.map((step: Body) => step.status)).toEqual(Array(8).fill("Valid"))
    expect(world.sim.documents()).toMatchObject([{
      uuid,
      codeNumber: "INV2026000001",
      submissionUid: uid,
      status: "Valid"
    }])
  })

  it("a signed v1.1 document is valid; one whose content changed after signing is invalid at the Signature step", () => {
    const world = setUp()
    const signed = withSignature(invoiceAt(START, "INV2026000001", { version: "1.1" }))
    const tampered = structuredClone(signed) as Body
    tampered["Invoice"][0]["ID"][0]["_"] = "INV2026000002"
    const answer = body(world.sim.submit({ documents: [submissionEntry(signed), submissionEntry(tampered)] }))
    world.advance(2_000)
    const [good, bad] = answer.acceptedDocuments.map((document: Body) => body(world.sim.details(document.uuid)))
    expect(good.status).toBe("Valid")
    expect(bad.status).toBe("Invalid")
    const step = bad.validationResults.validationSteps.find((each: Body) => each.status === "Invalid")
    expect(step).toMatchObject({ name: "Step04-Signature Validator", error: { errorCode: "Error04" } })
    expect(step.error.innerError[0].errorCode).toBe("DS322")
    expect(body(world.sim.submission(answer.submissionUid)).overallStatus).toBe("partially valid")
  })

  it("a document breaking a rule of validation is accepted, then Invalid with the step and the error", () => {
    const world = setUp()
    const document = invoiceAt(START) as Body
    document["Invoice"][0]["LegalMonetaryTotal"][0]["PayableAmount"][0]["_"] = 10.79
    const answer = submitOne(world.sim, document)
    world.advance(2_000)
    const details = body(world.sim.details(answer.acceptedDocuments[0].uuid))
    expect(details.status).toBe("Invalid")
    expect(details.longId).toBeNull()
    const invalid = details.validationResults.validationSteps.filter((step: Body) => step.status === "Invalid")
    expect(invalid).toHaveLength(1)
    expect(invalid[0]).toMatchObject({ name: "Step02-Core Fields Validator", error: { errorCode: "Error02" } })
    expect(invalid[0].error.innerError).toMatchObject([{ errorCode: "TotalsMismatch", propertyName: "PayableAmount" }])
    expect(body(world.sim.submission(answer.submissionUid)).overallStatus).toBe("invalid")
  })

  it("a TIN LHDN does not know (C99999999990) makes the document invalid, naming the TIN", () => {
    const world = setUp()
    const answer = submitOne(world.sim, invoiceAt(START, "INV2026000001", { buyerTin: "C99999999990" }))
    world.advance(2_000)
    const details = body(world.sim.details(answer.acceptedDocuments[0].uuid))
    expect(details.status).toBe("Invalid")
    const step = details.validationResults.validationSteps.find((each: Body) => each.status === "Invalid")
    expect(step.name).toBe("Step05-Taxpayer Validator")
    expect(JSON.stringify(step.error.innerError)).toContain("C99999999990")
  })

  it("a note whose original is not a valid document is invalid at the Referenced Documents step", () => {
    const world = setUp()
    const note = invoiceAt(START, "RN2026000001", {
      typeCode: "04",
      references: [{ number: "INV1", uuid: "ABCDEFGHIJKLMNOPQRSTUVWXYZ" }]
    })
    const answer = submitOne(world.sim, note)
    world.advance(2_000)
    const details = body(world.sim.details(answer.acceptedDocuments[0].uuid))
    expect(details.validationResults.validationSteps.find((each: Body) => each.status === "Invalid").name)
      .toBe("Step06-Referenced Documents Validator")
  })
})

describe("what submission refuses", () => {
  const document = invoiceAt(START)
  const entry = submissionEntry(document)
  const cases: ReadonlyArray<readonly [string, Record<string, string>, string]> = [
    ["a hash that is not the document's", { ...entry, documentHash: hashOf("something else") }, "BadArgument"],
    [
      "a document over 300 KB",
      submissionEntry(document, JSON.stringify(document) + " ".repeat(300 * 1024)),
      "MaximumSizeExceeded"
    ],
    [
      "an issue time 73 hours before",
      submissionEntry(invoiceAt(new Date(START.getTime() - 73 * HOUR))),
      "IssuedTooLongAgo"
    ],
    ["an issue time in the future", submissionEntry(invoiceAt(new Date(START.getTime() + HOUR))), "IssuedInFuture"],
    [
      "another taxpayer's document",
      submissionEntry(invoiceAt(START, "INV2026000001", { supplierTin: "C1234567890" })),
      "IssuerTinMismatch"
    ],
    ["a code number that is not the document's ID", { ...entry, codeNumber: "INV2026000099" }, "BadArgument"],
    ["a document that is not JSON", submissionEntry(document, "<Invoice/>"), "NotUblJson"],
    ["an XML document", { ...entry, format: "XML" }, "BadArgument"]
  ]
  for (const [name, submitted, code] of cases) {
    it(`${name}: rejected in the answer, with its reason`, () => {
      const world = setUp()
      const answer = world.sim.submit({ documents: [submitted] })
      expect(answer.status).toBe(202)
      expect(body(answer)).toMatchObject({ submissionUid: null, acceptedDocuments: [] })
      const [rejected] = body(answer).rejectedDocuments
      expect(rejected).toMatchObject({
        invoiceCodeNumber: submitted["codeNumber"],
        error: { code: "3", message: "Validation Error" }
      })
      expect(rejected.error.details[0].code).toBe(code)
      expect(world.sim.documents()).toEqual([])
    })
  }

  it("a submission that is not {documents: [...]}, or whose entries lack fields, is a bad structure", () => {
    const world = setUp()
    for (const bad of [null, {}, { documents: [] }, { documents: [{ format: "JSON" }] }, { document: [entry] }]) {
      const answer = world.sim.submit(bad)
      expect(answer.status, JSON.stringify(bad)).toBe(400)
      expect(body(answer).error).toMatchObject({ code: "BadStructure", errorCode: "BadStructure" })
    }
  })

  it("more than 100 documents, or more than 5 MB, exceed the submission's size", () => {
    const world = setUp()
    const many = Array.from({ length: 101 }, (_, index) => submissionEntry(invoiceAt(START, `INV${index}`)))
    expect(body(world.sim.submit({ documents: many })).error.code).toBe("MaximumSizeExceeded")
    const big = Array.from(
      { length: 20 },
      () => submissionEntry(document, JSON.stringify(document) + " ".repeat(290 * 1024))
    )
    expect(body(world.sim.submit({ documents: big })).error.code).toBe("MaximumSizeExceeded")
    expect(world.sim.submit({ documents: many.slice(0, 100) }).status).toBe(202)
  })
})

describe("duplicates", () => {
  it("the same submission within 10 minutes is refused 422 with Retry-After; later its document is a duplicate", () => {
    const world = setUp()
    const request = { documents: [submissionEntry(invoiceAt(START))] }
    const first = body(world.sim.submit(request))
    world.advance(4 * 60 * 1000)
    const again = world.sim.submit(request)
    expect(again.status).toBe(422)
    expect(again.headers).toEqual({ "Retry-After": "360" })
    expect(body(again).error.code).toBe("DuplicateSubmission")
    world.advance(6 * 60 * 1000)
    const later = body(world.sim.submit(request))
    expect(later.acceptedDocuments).toHaveLength(1)
    world.advance(2_000)
    expect(body(world.sim.details(first.acceptedDocuments[0].uuid)).status).toBe("Valid")
    const duplicate = body(world.sim.details(later.acceptedDocuments[0].uuid))
    expect(duplicate.status).toBe("Invalid")
    const step = duplicate.validationResults.validationSteps.find((each: Body) => each.status === "Invalid")
    expect(step).toMatchObject({ name: "Step03-Duplicated Submission Validator", error: { errorCode: "Error03" } })
    expect(step.error.innerError[0].errorCode).toBe("DS302")
    expect(step.error.innerError[0].error).toContain(first.acceptedDocuments[0].uuid)
  })

  it("the same number issued at another time, or after the first was invalid, is no duplicate", () => {
    const world = setUp()
    const broken = invoiceAt(START) as Body
    broken["Invoice"][0]["LegalMonetaryTotal"][0]["PayableAmount"][0]["_"] = 1
    submitOne(world.sim, broken)
    world.advance(2_000)
    validDocument(world, invoiceAt(START))
    const other = submitOne(world.sim, invoiceAt(new Date(START.getTime() + 1_000)))
    world.advance(2_000)
    expect(body(world.sim.details(other.acceptedDocuments[0].uuid)).status).toBe("Valid")
  })
})

describe("cancellation", () => {
  const reason = { status: "cancelled", reason: "Wrong buyer details" }

  it("within 72 hours of validation a valid document is cancelled", () => {
    const world = setUp()
    const uuid = validDocument(world, invoiceAt(START))
    world.advance(71 * HOUR)
    expect(world.sim.cancel(uuid, reason)).toEqual({ status: 200, body: { uuid, status: "Cancelled" } })
    const details = body(world.sim.details(uuid))
    expect(details).toMatchObject({ status: "Cancelled", documentStatusReason: "Wrong buyer details" })
    expect(details.cancelDateTime).not.toBeNull()
    expect(body(world.sim.cancel(uuid, reason)).error.code, "once").toBe("IncorrectState")
  })

  it("after 72 hours it is refused: OperationPeriodOver", () => {
    const world = setUp()
    const uuid = validDocument(world, invoiceAt(START))
    world.advance(72 * HOUR + 1)
    const refused = world.sim.cancel(uuid, reason)
    expect(refused.status).toBe(400)
    expect(body(refused).error.code).toBe("OperationPeriodOver")
  })

  it("a document a valid note references is refused until the note is cancelled", () => {
    const world = setUp()
    const original = validDocument(world, invoiceAt(START))
    const note = validDocument(
      world,
      invoiceAt(world.now(), "CN2026000001", {
        typeCode: "02",
        references: [{ number: "INV2026000001", uuid: original }]
      })
    )
    const refused = world.sim.cancel(original, reason)
    expect(body(refused).error.code).toBe("ActiveReferencingDocuments")
    expect(body(refused).error.message).toContain(note)
    expect(world.sim.cancel(note, reason).status).toBe(200)
    expect(world.sim.cancel(original, reason).status).toBe(200)
  })

  it("a document not yet valid, an unknown one, or a request without status and reason are refused", () => {
    const world = setUp()
    const uuid = submitOne(world.sim, invoiceAt(START)).acceptedDocuments[0].uuid as string
    expect(body(world.sim.cancel(uuid, reason)).error.code).toBe("IncorrectState")
    expect(world.sim.cancel("NOSUCHDOCUMENT0000000000AA", reason).status).toBe(404)
    world.advance(2_000)
    expect(body(world.sim.cancel(uuid, { status: "rejected", reason: "x" })).error).toMatchObject({
      code: "BadArgument",
      target: "status"
    })
    expect(body(world.sim.cancel(uuid, { status: "cancelled", reason: "x".repeat(301) })).error.target).toBe("reason")
  })
})

describe("search", () => {
  const window = {
    submissionDateFrom: new Date(START.getTime() - HOUR).toISOString(),
    submissionDateTo: new Date(START.getTime() + HOUR).toISOString()
  }

  it("finds a document by its internal ID through searchQuery, within a window of submission dates", () => {
    const world = setUp()
    const uuid = validDocument(world, invoiceAt(START))
    submitOne(world.sim, invoiceAt(START, "INV2026000002"))
    const found = body(world.sim.search({ ...window, searchQuery: "INV2026000001" }))
    expect(found.metadata).toEqual({ totalPages: 1, totalCount: 1 })
    expect(found.result[0]).toMatchObject({
      uuid,
      internalId: "INV2026000001",
      status: "Valid",
      supplierTIN: ISSUER,
      buyerTIN: "C1234567890",
      total: 10.8
    })
    expect(body(world.sim.search({ ...window, status: "Submitted" })).result.map((each: Body) => each.internalId))
      .toEqual(["INV2026000002"])
    expect(body(world.sim.search({ ...window, invoiceDirection: "Received" })).result).toEqual([])
    const later = {
      submissionDateFrom: new Date(START.getTime() + HOUR).toISOString(),
      submissionDateTo: new Date(START.getTime() + 2 * HOUR).toISOString()
    }
    expect(body(world.sim.search(later)).metadata.totalCount).toBe(0)
  })

  it("needs a date window of at most 31 days, and a searchQuery without special characters", () => {
    const world = setUp()
    expect(body(world.sim.search({})).error.code).toBe("BadArgument")
    expect(body(world.sim.search({ submissionDateFrom: window.submissionDateFrom })).error.code).toBe("BadArgument")
    const long = { issueDateFrom: "2026-01-01T00:00:00Z", issueDateTo: "2026-02-02T00:00:00Z" }
    expect(body(world.sim.search(long)).error.target).toBe("issueDateTo")
    expect(body(world.sim.search({ ...window, searchQuery: "INV-2026-000001" })).error.target).toBe("searchQuery")
    expect(world.sim.search({ ...window, pageSize: "101" }).status).toBe(400)
  })
})

describe("a submission's pages", () => {
  it("documentSummary is paged by pageNo and pageSize (at most 100)", () => {
    const world = setUp()
    const answer = body(world.sim.submit({
      documents: ["INV1", "INV2", "INV3"].map((number) => submissionEntry(invoiceAt(START, number)))
    }))
    const page = (pageNo: number) =>
      body(world.sim.submission(answer.submissionUid, pageNo, 2)).documentSummary.map((each: Body) => each.internalId)
    expect([page(1), page(2)]).toEqual([["INV1", "INV2"], ["INV3"]])
    expect(world.sim.submission(answer.submissionUid, 1, 101).status).toBe(400)
    expect(world.sim.submission("NOSUCHSUBMISSION0000000000").status).toBe(404)
  })
})

describe("the MyInvois client over the simulated MyInvois", () => {
  it("submits, reads the submission and the details, finds by number and cancels, in the shapes it decodes", async () => {
    const world = setUp({ validateAfterMs: 0 })
    const document = invoiceAt(START)
    const text = JSON.stringify(document)
    const result = await Effect.runPromise(Effect.gen(function*() {
      const client = yield* makeClient(
        simulatedTransport(world.sim),
        { clientId: "erp", clientSecret: Redacted.make("secret") },
        "simulated"
      )
      const submitted = yield* client.submit([{ codeNumber: "INV2026000001", text }])
      if (submitted.submissionUid === null) return yield* Effect.dieMessage("nothing was accepted")
      const states = yield* client.submission(submitted.submissionUid)
      const details = yield* client.details(submitted.accepted[0]!.uuid)
      const found = yield* client.findByNumber("INV2026000001", START)
      yield* client.cancel(submitted.accepted[0]!.uuid, "Wrong buyer details")
      return { submitted, states, details, found }
    }))
    expect(result.submitted.rejected).toEqual([])
    expect(result.states).toMatchObject([{ codeNumber: "INV2026000001", status: "Valid", longId: expect.any(String) }])
    expect(result.details).toMatchObject({ status: "Valid", errors: [] })
    expect(Option.getOrNull(result.found)).toMatchObject({ codeNumber: "INV2026000001", status: "Valid" })
    expect(world.sim.documents()[0]!.status).toBe("Cancelled")
  })
})

describe("the stand-in over HTTP", () => {
  const withStandIn = <A>(
    run: (standIn: Effect.Effect.Success<ReturnType<typeof makeMyInvoisStandIn>>) => Promise<A>
  ) =>
    Effect.runPromise(
      Effect.scoped(Effect.flatMap(makeMyInvoisStandIn(), (standIn) => Effect.promise(() => run(standIn))))
    )

  const login = async (url: string) => {
    const response = await fetch(`${url}/connect/token`, {
      method: "POST",
      headers: { "content-type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams({ client_id: "erp", client_secret: "secret", grant_type: "client_credentials" })
    })
    return (await response.json() as Body).access_token as string
  }

  it("serves the SDK's paths behind its bearer tokens, and breaks as a test asks", async () => {
    await withStandIn(async (standIn) => {
      const submit = (token: string | undefined) =>
        fetch(`${standIn.url}/api/v1.0/documentsubmissions`, {
          method: "POST",
          headers: {
            "content-type": "application/json",
            ...(token === undefined ? {} : { authorization: `Bearer ${token}` })
          },
          body: JSON.stringify({ documents: [submissionEntry(invoiceAt(standIn.now()))] })
        })
      expect((await submit(undefined)).status, "no token").toBe(401)
      expect((await submit("not-issued-here")).status).toBe(401)
      const token = await login(standIn.url)
      expect(standIn.logins).toBe(1)
      const accepted = await submit(token)
      expect(accepted.status).toBe(202)
      const uid = (await accepted.json() as Body).submissionUid as string
      expect(standIn.submissions).toMatchObject([{ submissionUid: uid, codeNumbers: ["INV2026000001"] }])
      const read = await fetch(`${standIn.url}/api/v1.0/documentsubmissions/${uid}?pageNo=1&pageSize=10`, {
        headers: { authorization: `Bearer ${token}` }
      })
      expect((await read.json() as Body).documentSummary[0].internalId).toBe("INV2026000001")

      standIn.throttle(1, 30)
      const throttled = await fetch(`${standIn.url}/api/v1.0/documentsubmissions/${uid}`, {
        headers: { authorization: `Bearer ${token}` }
      })
      expect([throttled.status, throttled.headers.get("retry-after")]).toEqual([429, "30"])
      standIn.outage(true)
      expect((await submit(token)).status).toBe(503)
      standIn.outage(true, { reset: true })
      await expect(submit(token)).rejects.toThrow()
      standIn.outage(false)
      standIn.advance(3600 * 1000)
      expect((await submit(token)).status, "the token expired").toBe(401)
      expect(standIn.submissions, "only submissions MyInvois took").toHaveLength(1)
      expect(standIn.requests.map((request) => request.status)).toEqual([401, 401, 200, 202, 200, 429, 503, 0, 401])
    })
  })
})
