import { describe, expect, it } from "@effect/vitest"
import { cacheKeyOf, type CacheKeyParts, canonicalJson, IGNORED_FIELDS } from "../../src/Cache/CacheKey.js"

const base: Omit<CacheKeyParts, "body"> = {
  endpoint: "/v1/chat/completions",
  accountId: "acc_1",
  environment: "live",
  policy: [null, null]
}
const keyOf = (body: string, parts: Partial<Omit<CacheKeyParts, "body">> = {}) =>
  cacheKeyOf({ ...base, ...parts, body: JSON.parse(body) })

const BODY = `{"model":"svc/nenas-flash","messages":[{"role":"user","content":"Hi"}],"temperature":1,"max_tokens":64}`

describe("the response cache's key", () => {
  it.each([
    [
      "keys in another order",
      `{"max_tokens":64,"temperature":1,"messages":[{"content":"Hi","role":"user"}],"model":"svc/nenas-flash"}`
    ],
    [
      "other whitespace",
      `{ "model" : "svc/nenas-flash",\n "messages": [ {"role":"user", "content":"Hi"} ],\t"temperature": 1, "max_tokens": 64 }`
    ],
    [
      "1.0 against 1",
      `{"model":"svc/nenas-flash","messages":[{"role":"user","content":"Hi"}],"temperature":1.0,"max_tokens":64}`
    ],
    [
      "6.4e1 against 64",
      `{"model":"svc/nenas-flash","messages":[{"role":"user","content":"Hi"}],"temperature":1,"max_tokens":6.4e1}`
    ],
    [
      "stream and stream_options",
      `{"model":"svc/nenas-flash","messages":[{"role":"user","content":"Hi"}],"temperature":1,"max_tokens":64,"stream":true,"stream_options":{"include_usage":true}}`
    ],
    [
      "user, metadata, store and max_total_cost_myr",
      `{"model":"svc/nenas-flash","messages":[{"role":"user","content":"Hi"}],"temperature":1,"max_tokens":64,"user":"u1","metadata":{"a":"b"},"store":false,"max_total_cost_myr":0.5}`
    ]
  ])("hits with %s", (_, body) => {
    expect(keyOf(body)).toBe(keyOf(BODY))
  })

  it.each([
    ["another message", BODY.replace("\"Hi\"", "\"Hello\"")],
    ["another temperature", BODY.replace("\"temperature\":1", "\"temperature\":0.5")],
    [
      "a field that changes the answer, nested: a message's user field is kept",
      BODY.replace("\"role\":\"user\"", "\"role\":\"user\",\"name\":\"ana\"")
    ]
  ])("misses with %s", (_, body) => {
    expect(keyOf(body)).not.toBe(keyOf(BODY))
  })

  it("differs by endpoint, account, environment and guardrail policy", () => {
    const key = keyOf(BODY)
    expect(keyOf(BODY, { endpoint: "/v1/responses" })).not.toBe(key)
    expect(keyOf(BODY, { accountId: "acc_2" })).not.toBe(key)
    expect(keyOf(BODY, { environment: "test" })).not.toBe(key)
    expect(keyOf(BODY, { policy: ["{\"pii\":{\"action\":\"redact\"}}", null] })).not.toBe(key)
  })

  it("ignores only top-level fields, writes -0 as 0, and refuses a body nested too deep", () => {
    expect(IGNORED_FIELDS.has("user")).toBe(true)
    expect(canonicalJson({ a: { user: 1 } }, IGNORED_FIELDS)).toBe(`{"a":{"user":1}}`)
    expect(canonicalJson({ b: [1, -0, "x"], a: null })).toBe(`{"a":null,"b":[1,0,"x"]}`)
    let deep: unknown = 1
    for (let i = 0; i < 100; i++) deep = [deep]
    expect(canonicalJson(deep)).toBeUndefined()
    expect(cacheKeyOf({ ...base, body: deep })).toBeUndefined()
  })
})
