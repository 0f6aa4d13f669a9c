import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { PUBLIC_MODEL } from "../../../src/Models/OpenAi/Api.js"
import { caller, modelCall, TestServerWithUpstream, walletOf } from "../../support/Models.js"
import { query } from "../../support/TestServer.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * A remote image the upstream would fetch on the caller's behalf is held to the outbound address guard before
 * anything is held, whether images pass to the upstream as URLs or are fetched here and inlined.
 */

/** Addresses inside the network, written as callers write them; `localhost` is a name that resolves to loopback. */
const INSIDE = [
  "https://169.254.169.254/latest/meta-data/iam/security-credentials/",
  "https://127.0.0.1/cat.png",
  "https://[::ffff:127.0.0.1]/",
  "https://[::1]/cat.png",
  "https://10.0.0.5/cat.png",
  "https://0x7f000001/cat.png",
  "https://localhost/cat.png",
  "https://[fd00:ec2::254]/latest/meta-data/"
]

const CASES = [
  {
    path: "/v1/chat/completions",
    body: (url: string) => ({
      model: PUBLIC_MODEL,
      messages: [{
        role: "user",
        content: [{ type: "text", text: "Describe." }, { type: "image_url", image_url: { url } }]
      }]
    }),
    param: "messages[0].content[1].image_url.url"
  },
  {
    path: "/v1/responses",
    body: (url: string) => ({
      model: PUBLIC_MODEL,
      stream: true,
      input: [{
        role: "user",
        content: [{ type: "input_text", text: "Describe." }, { type: "input_image", image_url: url }]
      }]
    }),
    param: "input[0].content[1].image_url"
  },
  {
    path: "/v1/messages",
    body: (url: string) => ({
      model: PUBLIC_MODEL,
      max_tokens: 64,
      messages: [{
        role: "user",
        content: [{ type: "text", text: "Describe." }, { type: "image", source: { type: "url", url } }]
      }]
    }),
    param: "messages[0].content[1].source.url"
  }
] as const

const refusesInside = (email: string) =>
  Effect.gen(function*() {
    const upstream = yield* Upstream
    const { accountId, apiKey } = yield* caller(email, { sen: 1000 })
    const before = yield* walletOf(accountId)
    upstream.reset()
    for (const url of INSIDE) {
      for (const { body, param, path } of CASES) {
        const reply = yield* modelCall(apiKey, path, body(url))
        // Anthropic's error shape on /v1/messages: the same code and param inside.
        expect(reply.status, `${path} ${url}: ${reply.text}`).toBe(400)
        expect(reply.body.error.code, `${path} ${url}`).toBe("invalid_request")
        expect(reply.body.error.param, `${path} ${url}`).toBe(param)
        expect(reply.text, `${path} ${url}: what the guard found stays in the log`).not.toMatch(
          /resolves to|loopback|linkLocal|private/
        )
      }
    }
    expect(upstream.requests, "nothing reached the upstream").toEqual([])
    const holds = yield* query<{ n: string }>("SELECT count(*) AS n FROM reservations WHERE account_id = $1", [
      accountId
    ])
    expect(Number(holds[0]?.n), "nothing was held").toBe(0)
    const logged = yield* query<{ n: string }>(
      "SELECT count(*) AS n FROM ledger_entries WHERE account_id = $1 AND type = 'usage'",
      [accountId]
    )
    expect(Number(logged[0]?.n), "nothing was charged").toBe(0)
    expect(yield* walletOf(accountId)).toEqual(before)
  })

describe("remote image addresses", () => {
  layer(TestServerWithUpstream(), { excludeTestServices: true, timeout: 90_000 })(
    "images passed to the upstream (the default)",
    (it) => {
      it.effect("an image URL at a metadata, loopback, private or embedded-IPv4 address is refused 400 naming it, before any hold", () =>
        refusesInside("image-addresses-pass@example.com"))

      it.effect("a public image URL, and one whose name does not resolve here, still reach the upstream as they came", () =>
        Effect.gen(function*() {
          const upstream = yield* Upstream
          const { apiKey } = yield* caller("image-addresses-public@example.com", { sen: 1000 })
          upstream.reset()
          for (const url of ["https://93.184.215.14/cat.png", "https://images.example/cat.png"]) {
            const reply = yield* modelCall(apiKey, "/v1/chat/completions", CASES[0].body(url))
            expect(reply.status, reply.text).toBe(200)
          }
          expect(upstream.requests.length).toBe(2)
        }))
    }
  )

  layer(TestServerWithUpstream({ upstreamImageUrls: "inline" }), { excludeTestServices: true, timeout: 90_000 })(
    "images fetched here and inlined",
    (it) => {
      it.effect("the same addresses are refused before any hold", () =>
        refusesInside("image-addresses-inline@example.com"))
    }
  )

  layer(TestServerWithUpstream({ fetchAllowedHosts: new Set(["127.0.0.1"]) }), {
    excludeTestServices: true,
    timeout: 60_000
  })(
    "FETCH_ALLOWED_HOSTS",
    (it) => {
      it.effect("an allowed host passes though it is loopback", () =>
        Effect.gen(function*() {
          const upstream = yield* Upstream
          const { apiKey } = yield* caller("image-addresses-allowed@example.com", { sen: 1000 })
          upstream.reset()
          const reply = yield* modelCall(apiKey, "/v1/chat/completions", CASES[0].body("https://127.0.0.1/cat.png"))
          expect(reply.status, reply.text).toBe(200)
          expect(upstream.requests.length).toBe(1)
        }))
    }
  )
})
