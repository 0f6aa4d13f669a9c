import { HttpApiError, HttpServerError, HttpServerRequest } from "@effect/platform"
import { describe, expect, it } from "@effect/vitest"
import { Cause, Effect, FiberId, Layer, Option, Schema } from "effect"
import fc from "fast-check"
import { AppConfig } from "../../src/AppConfig.js"
import { disputeFacts } from "../../src/Billing/Payments.js"
import { type ApiError, errorClasses, InvalidRequest, RateLimitExceeded } from "../../src/Domain/Errors.js"
import { errorResponse, toApiError } from "../../src/Http/Pipeline.js"
import { hashOf, judgeExisting, type RecordRow } from "../../src/Models/Admission/Idempotency.js"
import type { RouteInput } from "../../src/Routing/Router.js"
import { decideRoute, Router } from "../../src/Routing/Router.js"
import { GRANT_FLOOR_CALLS, grantGrowth, newGrant, newPace, wantsGrant } from "../../src/Wallet/Grants/Grants.js"
import { ERROR_TABLE } from "../support/ErrorTable.js"

/** Decisions that need no database, no server and no upstream: pure functions and test Layers. */

const input = (
  prompt: string,
  effort: RouteInput["effort"] = "medium",
  webSearch: RouteInput["webSearch"] = "off"
): RouteInput => ({
  messages: [{ role: "user", content: prompt }],
  effort,
  webSearch
})

describe("routing", () => {
  const prompts: ReadonlyArray<RouteInput> = [
    input("What is the capital of Malaysia?"),
    input("Prove that there are infinitely many primes."),
    input("Hello there", "high"),
    input("What is the latest news in Kuala Lumpur?", "medium", "auto"),
    input("Prove the latest theorem.", "medium", "on")
  ]

  it.effect("the real Router Layer decides exactly as the pure decideRoute, with the configured models", () =>
    Effect.gen(function*() {
      const router = yield* Router
      for (const each of prompts) {
        expect(router.route(each)).toEqual(decideRoute({ general: "g", reasoning: "r" }, each))
      }
    }).pipe(Effect.provide(Router.layer.pipe(
      Layer.provide(AppConfig.layerWith({ upstreamModelGeneral: "g", upstreamModelReasoning: "r" }))
    ))))

  it.effect("a fixed Router answers its route whatever the prompt, and records what it was asked", () => {
    const fixed = Router.fixed(Router.fixedRoute("reasoning", "pinned-model"))
    return Effect.gen(function*() {
      const router = yield* Router
      for (const each of prompts) {
        expect(router.route(each)).toMatchObject({
          category: "reasoning",
          upstreamModel: "pinned-model",
          reasoningModel: true
        })
      }
      expect(fixed.inputs).toEqual(prompts)
    }).pipe(Effect.provide(Router.Test(fixed)))
  })

  it.effect("a fixed Router may decide from the input: here, search only when asked", () =>
    Effect.gen(function*() {
      const router = yield* Router
      expect(router.route(input("hi", "medium", "on")).search).toBe(true)
      expect(router.route(input("What is the latest news?", "medium", "auto")).search).toBe(false)
    }).pipe(Effect.provide(Router.Test(Router.fixed((asked) =>
      asked.webSearch === "on" ? Router.fixedRoute("search", "m") : Router.fixedRoute("general", "m")
    )))))
})

describe("grant sizing", () => {
  const base = { spendPerSecond: 0, estimate: 100, remaining: 0, heldMicroMyr: 0, availableMicroMyr: 1_000_000 }
  const table: ReadonlyArray<readonly [string, Partial<typeof base>, number]> = [
    ["at least 16 calls like the last one", {}, 1_600],
    ["about two seconds of recent spend", { spendPerSecond: 10_000 }, 20_000],
    ["what the grant has not lent counts towards the target", {
      remaining: 500,
      heldMicroMyr: 500,
      availableMicroMyr: 10_000
    }, 1_100],
    ["never above a third of what it and the wallet hold together", { availableMicroMyr: 3_000 }, 1_000],
    ["nothing when a third would cover fewer than four calls", { availableMicroMyr: 1_000 }, 0],
    ["nothing when the grant already holds its third", { heldMicroMyr: 1_000, availableMicroMyr: 2_000 }, 0],
    ["nothing when what is left covers the target", { remaining: 2_000, heldMicroMyr: 2_000 }, 0],
    ["an empty wallet grants nothing", { availableMicroMyr: 0 }, 0]
  ]
  for (const [name, overrides, expected] of table) {
    it(`${name}: ${expected}`, () => expect(grantGrowth({ ...base, ...overrides })).toBe(expected))
  }

  it("for any wallet: never more than available, never past a third, never under four calls' worth", () =>
    fc.assert(
      fc.property(
        fc.nat(1_000_000),
        fc.integer({ min: 1, max: 50_000 }),
        fc.nat(5_000_000),
        fc.nat(5_000_000),
        fc.nat(10_000_000),
        (spendPerSecond, estimate, remaining, extra, availableMicroMyr) => {
          const heldMicroMyr = remaining + extra
          const growth = grantGrowth({ spendPerSecond, estimate, remaining, heldMicroMyr, availableMicroMyr })
          expect(Number.isInteger(growth)).toBe(true)
          if (growth === 0) return
          expect(growth).toBeLessThanOrEqual(availableMicroMyr)
          expect(heldMicroMyr + growth).toBeLessThanOrEqual((availableMicroMyr + heldMicroMyr) / 3)
          expect(growth).toBeGreaterThanOrEqual(estimate * GRANT_FLOOR_CALLS)
        }
      ),
      { numRuns: 2_000 }
    ))

  it("a grant is wanted from eight calls a second, not in a cooldown, and only when what is left runs low", () => {
    const now = 10_000
    const pace = { ...newPace(now), callsPerSecond: 8, spendPerSecond: 800, lastEstimate: 100 }
    expect(wantsGrant(pace, undefined, now)).toBe(true)
    expect(wantsGrant({ ...pace, callsPerSecond: 7 }, undefined, now)).toBe(false)
    expect(wantsGrant({ ...pace, noGrantUntil: now + 1 }, undefined, now)).toBe(false)
    const grant = { ...newGrant("gr_1", "acc_1", now), remaining: 799 }
    expect(wantsGrant(pace, grant, now)).toBe(true)
    expect(wantsGrant(pace, { ...grant, remaining: 800 }, now)).toBe(false)
    expect(wantsGrant(pace, { ...grant, closing: true }, now)).toBe(false)
    expect(wantsGrant(pace, { ...grant, growing: true }, now)).toBe(false)
  })
})

describe("error mapping", () => {
  it("has exactly one class per code of the error table", () => {
    expect(errorClasses.map((c) => c._tag)).toEqual(ERROR_TABLE.map(([tag]) => tag))
  })

  it.effect.each(ERROR_TABLE)(
    "%s: the spec's body and status, failed or died with",
    ([tag, code, status, type, retryable]) =>
      Effect.sync(() => {
        const cls = errorClasses.find((c) => c._tag === tag)
        if (cls === undefined) throw new Error(`no class ${tag}`)
        const error = new cls({ message: `mapped ${tag}` })
        for (const cause of [Cause.fail(error), Cause.die(error)]) {
          expect(Option.getOrUndefined(toApiError(cause))).toBe(error)
        }
        const response = errorResponse(error, "req_fixed", "https://dash.test")
        expect(response.status).toBe(status)
        const body = JSON.parse(
          new TextDecoder().decode(response.body._tag === "Uint8Array" ? response.body.body : new Uint8Array())
        )
        expect(body).toMatchObject({
          type: "error",
          error: { code, type, retryable, message: `mapped ${tag}`, param: null, request_id: "req_fixed" }
        })
        expect(body.error.guidance.length).toBeGreaterThan(0)
        if (body.error.action_url !== null) expect(body.error.action_url).toMatch(/^https:\/\/dash\.test\//)
        expect(response.headers["retry-after"]).toBeUndefined()
      })
  )

  it("retry_after_seconds is sent in the body and as Retry-After", () => {
    const response = errorResponse(new RateLimitExceeded({ message: "slow", retry_after_seconds: 7 }), "req_x", "")
    expect(response.status).toBe(429)
    expect(response.headers["retry-after"]).toBe("7")
  })

  const request = HttpServerRequest.fromWeb(new Request("http://localhost/nowhere", { method: "POST" }))
  const mapped = (cause: Cause.Cause<unknown>): ApiError | undefined => Option.getOrUndefined(toApiError(cause))

  it("a schema failure is invalid_request naming the field", () => {
    const failed = Schema.decodeUnknownEither(Schema.Struct({ model: Schema.String }))({ model: 1 })
    if (failed._tag === "Right") throw new Error("decoded")
    const error = mapped(Cause.fail(failed.left))
    expect(error).toBeInstanceOf(InvalidRequest)
    expect(error).toMatchObject({
      param: "model",
      message: expect.stringMatching(/^Invalid 'model': Expected string, actual 1/)
    })
    const decodeError = mapped(Cause.fail(
      new HttpApiError.HttpApiDecodeError({
        issues: [{ _tag: "Type", path: ["messages", 0, "role"], message: "Expected \"user\", actual \"x\"" }],
        message: "bad"
      })
    ))
    expect(decodeError).toMatchObject({ _tag: "InvalidRequest", param: "messages[0].role" })
  })

  it("an unknown route is not_found; a body that is not JSON is invalid_request; one over 8 MiB is context_length_exceeded", () => {
    expect(mapped(Cause.fail(new HttpServerError.RouteNotFound({ request })))).toMatchObject({
      _tag: "NotFound",
      message: "No route for POST /nowhere."
    })
    expect(
      mapped(Cause.fail(new HttpServerError.RequestError({ request, reason: "Decode", cause: new SyntaxError("bad") })))
    )
      .toMatchObject({ _tag: "InvalidRequest", message: "The request body is not valid JSON." })
    expect(
      mapped(
        Cause.fail(
          new HttpServerError.RequestError({ request, reason: "Decode", cause: new Error("maxBytes exceeded") })
        )
      )
    )
      .toMatchObject({ _tag: "ContextLengthExceeded" })
  })

  it("anything else is no API error (the middleware answers internal_error and logs it); an interruption neither", () => {
    expect(mapped(Cause.die(new Error("db password is hunter2")))).toBeUndefined()
    expect(mapped(Cause.fail("a string"))).toBeUndefined()
    expect(mapped(Cause.interrupt(FiberId.none))).toBeUndefined()
    expect(mapped(Cause.fail(new HttpServerError.RequestError({ request, reason: "Transport" })))).toBeUndefined()
  })
})

describe("webhook event semantics: what a dispute event says about Stripe's money", () => {
  const table: ReadonlyArray<readonly [string, string, ReturnType<typeof disputeFacts>]> = [
    ["charge.dispute.created", "needs_response", { status: "open", fundsWithdrawn: true, fundsReinstated: false }],
    ["charge.dispute.created", "warning_needs_response", {
      status: "open",
      fundsWithdrawn: false,
      fundsReinstated: false
    }],
    ["charge.dispute.funds_withdrawn", "needs_response", {
      status: "open",
      fundsWithdrawn: true,
      fundsReinstated: false
    }],
    ["charge.dispute.funds_withdrawn", "warning_under_review", {
      status: "open",
      fundsWithdrawn: true,
      fundsReinstated: false
    }],
    ["charge.dispute.funds_reinstated", "under_review", {
      status: "open",
      fundsWithdrawn: true,
      fundsReinstated: true
    }],
    ["charge.dispute.funds_reinstated", "warning_closed", {
      status: "open",
      fundsWithdrawn: true,
      fundsReinstated: true
    }],
    ["charge.dispute.closed", "won", { status: "won", fundsWithdrawn: true, fundsReinstated: true }],
    ["charge.dispute.closed", "lost", { status: "lost", fundsWithdrawn: true, fundsReinstated: false }],
    ["charge.dispute.closed", "warning_closed", { status: "closed", fundsWithdrawn: false, fundsReinstated: false }],
    ["charge.dispute.closed", "charge_refunded", { status: "closed", fundsWithdrawn: true, fundsReinstated: false }]
  ]
  for (const [type, status, facts] of table) {
    it(`${type} (${status}): ${JSON.stringify(facts)}`, () => expect(disputeFacts(type, status)).toEqual(facts))
  }

  it("reinstated funds were always withdrawn first, whatever the order events arrive in", () => {
    for (const [type, status] of table) {
      const facts = disputeFacts(type, status)
      if (facts.fundsReinstated) expect(facts.fundsWithdrawn).toBe(true)
    }
  })
})

describe("idempotency rules: a key already claimed", () => {
  const body = { model: "svc/nenas-flash", messages: [{ role: "user", content: "hi" }] }
  const claim = { key: "k-1", endpoint: "/v1/chat/completions" }
  const hash = hashOf(claim.endpoint, body)
  const record = (fields: Partial<RecordRow>): RecordRow => ({
    endpoint: claim.endpoint,
    requestHash: hash,
    requestId: "req_first",
    status: "completed",
    responseStatus: 200,
    responseBody: "{\"id\":\"chatcmpl-1\"}",
    ...fields
  })
  const cases: ReadonlyArray<{
    readonly name: string
    readonly existing: RecordRow
    readonly expected: { readonly replay: { status: number; body: string } } | {
      readonly conflict: RegExp
      readonly retryable: boolean
    }
  }> = [
    {
      name: "the same request, finished: its stored answer again",
      existing: record({}),
      expected: { replay: { status: 200, body: "{\"id\":\"chatcmpl-1\"}" } }
    },
    {
      name: "the same request, finished with an error: the stored error again",
      existing: record({ responseStatus: 402, responseBody: "{\"error\":{}}" }),
      expected: { replay: { status: 402, body: "{\"error\":{}}" } }
    },
    {
      name: "the same request, still running: a conflict to retry",
      existing: record({ status: "running", responseStatus: null, responseBody: null }),
      expected: { conflict: /still running \(req_first\)/, retryable: true }
    },
    {
      name: "another body under the key: a conflict not to retry",
      existing: record({ requestHash: hashOf(claim.endpoint, { ...body, temperature: 1 }) }),
      expected: { conflict: /different request/, retryable: false }
    },
    {
      name: "another endpoint under the key: a conflict not to retry",
      existing: record({ endpoint: "/v1/responses" }),
      expected: { conflict: /different request \(\/v1\/responses\)/, retryable: false }
    }
  ]
  for (const { name, existing, expected } of cases) {
    it.effect(name, () =>
      Effect.gen(function*() {
        const outcome = yield* Effect.either(judgeExisting(claim, hash, existing))
        if ("replay" in expected) {
          if (outcome._tag !== "Right") return expect.fail(`expected a replay, got ${outcome.left.message}`)
          // A replay carries the first request's id, which it answers with as X-Request-Id.
          expect(outcome.right).toEqual({ _tag: "Replay", ...expected.replay, requestId: "req_first" })
          return
        }
        if (outcome._tag !== "Left") return expect.fail(`expected a conflict, got ${JSON.stringify(outcome)}`)
        expect(outcome.left._tag).toBe("IdempotencyConflict")
        expect(outcome.left.message).toMatch(expected.conflict)
        expect(outcome.left.retryable === true).toBe(expected.retryable)
        expect(outcome.left.param).toBe("Idempotency-Key")
      }))
  }
})
