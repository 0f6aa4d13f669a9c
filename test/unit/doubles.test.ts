import { describe, expect, it } from "@effect/vitest"
import { Cause, Chunk, Effect, Exit, Fiber, Option, Schema, Stream, TestClock } from "effect"
import { completedEvent, PaymentProcessor } from "../../src/Billing/PaymentProcessor.js"
import { StripeEvent } from "../../src/Billing/Payments.js"
import { ProviderTimeout, ProviderUnavailable } from "../../src/Domain/Errors.js"
import type { ProviderRequest } from "../../src/Providers/Provider.js"
import { Provider, Script } from "../../src/Providers/Provider.js"
import { Search } from "../../src/Search/Search.js"

/** The test Layers themselves answer as the real services would: no PostgreSQL, no network. */

const request = (content: string, model = "m"): ProviderRequest => ({
  model,
  messages: [{ role: "user", content }],
  maxOutputTokens: 50,
  reasoningEffort: undefined,
  reasoningModel: false
})

const collected = <A, E>(stream: Stream.Stream<A, E>) => Effect.map(Stream.runCollect(stream), Chunk.toReadonlyArray)

describe("Provider.scripted", () => {
  it.effect("answers its steps in order over complete and stream, records each request, and dies clearly past the script", () => {
    const scripted = Provider.scripted([
      Script.answer("one", { usage: Script.usage(3, 1) }),
      Script.answer("two"),
      Script.refuse(new ProviderTimeout({ message: "late" }))
    ])
    return Effect.gen(function*() {
      const provider = yield* Provider
      const first = yield* provider.complete(request("a"))
      expect(first).toMatchObject({ text: "one", finishReason: "stop", usage: Option.some(Script.usage(3, 1)) })
      const parts = yield* Effect.flatMap(provider.stream(request("b")), collected)
      expect(parts).toEqual([{ _tag: "Delta", text: "two" }, { _tag: "Finish", finishReason: "stop" }])
      expect((yield* Effect.flip(provider.stream(request("c"))))._tag).toBe("ProviderTimeout")
      const past = yield* Effect.exit(provider.complete(request("d")))
      expect(Exit.isFailure(past) && Cause.pretty(past.cause)).toContain("the script has 3 step(s), and call 4 came")
      expect(scripted.requests.map((r) => r.messages[0]?.content)).toEqual(["a", "b", "c", "d"])
    }).pipe(Effect.provide(Provider.Test(scripted)))
  })

  it.effect("a function script answers from the request; a streamed step joins into one completion", () => {
    const scripted = Provider.scripted((asked, index) =>
      asked.model === "broken"
        ? Script.refuse(new ProviderUnavailable({ message: "down" }))
        : Script.streamed([`call ${index}: `, "ok"], { usage: Script.usage(5, 2) })
    )
    return Effect.gen(function*() {
      expect(yield* scripted.complete(request("x"))).toMatchObject({
        text: "call 0: ok",
        usage: Option.some(Script.usage(5, 2))
      })
      expect((yield* Effect.flip(scripted.complete(request("y", "broken"))))._tag).toBe("ProviderUnavailable")
    })
  })

  it.effect("parts come `delay` apart on the fiber's clock, and a failure ends the stream after them", () =>
    Effect.gen(function*() {
      const provider = Provider.scripted([
        Script.streamed(["a", "b", "c"], { delay: "1 second", failure: new ProviderTimeout({ message: "cut" }) })
      ])
      const seen: Array<string> = []
      const stream = yield* provider.stream(request("x"))
      const fiber = yield* stream.pipe(
        Stream.runForEach((part) => Effect.sync(() => part._tag === "Delta" && seen.push(part.text))),
        Effect.flip,
        Effect.fork
      )
      yield* TestClock.adjust("10 millis")
      expect(seen).toEqual(["a"])
      yield* TestClock.adjust("1 second")
      expect(seen).toEqual(["a", "b"])
      yield* TestClock.adjust("1 second")
      expect((yield* Fiber.join(fiber))._tag).toBe("ProviderTimeout")
      expect(seen).toEqual(["a", "b", "c"])
    }))

  it.effect("tool calls survive the trip between whole and streamed answers", () =>
    Effect.gen(function*() {
      const call = {
        id: "call_1",
        type: "function" as const,
        function: { name: "weather", arguments: "{\"city\":\"KL\"}" }
      }
      const provider = Provider.scripted([Script.answer("", { toolCalls: [call] })])
      const parts = yield* Effect.flatMap(provider.stream(request("x")), collected)
      expect(parts).toEqual([
        { _tag: "ToolCallDelta", index: 0, id: "call_1", name: "weather", arguments: "{\"city\":\"KL\"}" },
        { _tag: "Finish", finishReason: "tool_calls" }
      ])
    }))
})

describe("Search.canned", () => {
  it.effect("canned results (at most maxResults), failing queries, canned pages; each query and page recorded", () => {
    const canned = Search.canned({
      results: (
        query
      ) => [
        Search.cannedResult("https://a.test/1", `${query} 1`),
        Search.cannedResult("https://a.test/2", `${query} 2`)
      ],
      pages: { "https://a.test/1": "Page one." },
      failing: ["down"]
    })
    return Effect.gen(function*() {
      const search = yield* Search
      expect((yield* search.search("kl", 1)).map((r) => r.title)).toEqual(["kl 1"])
      expect((yield* Effect.flip(search.search("down", 5)))._tag).toBe("SearchError")
      expect(yield* search.readPage("https://a.test/1")).toBe("Page one.")
      expect((yield* Effect.flip(search.readPage("https://a.test/2")))._tag).toBe("PageFailed")
      expect(canned.queries).toEqual([{ query: "kl", maxResults: 1 }, { query: "down", maxResults: 5 }])
      expect(canned.pagesRead).toEqual(["https://a.test/1", "https://a.test/2"])
    }).pipe(Effect.provide(Search.Test(canned)))
  })
})

describe("PaymentProcessor.inMemory", () => {
  it.effect("one session per transaction, as Stripe's idempotency key makes it; unreachable fails as billing_error", () =>
    Effect.gen(function*() {
      const checkout = PaymentProcessor.inMemory()
      const input = {
        transactionId: "pt_1",
        accountId: "acc_1",
        amountSen: 1_000,
        taxSen: 0,
        taxRateBps: 0,
        email: null,
        saveCardFor: null
      }
      const first = yield* checkout.createCheckout(input)
      expect(yield* checkout.createCheckout(input)).toEqual(first)
      expect(first.sessionId).toMatch(/^cs_test_/)
      expect(checkout.state.sessions.size).toBe(1)
      checkout.state.unreachable = true
      expect((yield* Effect.flip(checkout.createCheckout({ ...input, transactionId: "pt_2" })))._tag).toBe(
        "BillingError"
      )
      expect(checkout.state.calls.length).toBe(3)
      const session = checkout.state.sessions.get(first.sessionId)
      if (session === undefined) throw new Error("no session")
      const event = yield* Schema.decodeUnknown(StripeEvent)(completedEvent(session, "pi_1"))
      expect(event.data.object).toMatchObject({
        client_reference_id: "pt_1",
        amount_total: 1_000,
        payment_status: "paid"
      })
    }))
})
