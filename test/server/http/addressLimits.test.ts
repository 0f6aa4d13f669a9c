import { describe, expect, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import { addressBucket } from "../../../src/Addresses/IpLimits.js"
import { call } from "../../support/Http.js"
import { TestServerLive } from "../../support/TestServer.js"

describe("the bucket a per-address limit counts a client in", () => {
  const cases: ReadonlyArray<readonly [string, string]> = [
    ["203.0.113.7", "203.0.113.7"],
    // IPv4-mapped IPv6 is the IPv4 client it carries.
    ["::ffff:203.0.113.7", "203.0.113.7"],
    ["::ffff:cb00:7107", "203.0.113.7"],
    // IPv6: its /64, however it is written.
    ["2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"],
    ["2001:0db8:0001:0002:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"],
    ["2001:db8:1:2::", "2001:db8:1:2::/64"],
    ["2001:db8:1:3::1", "2001:db8:1:3::/64"],
    ["::1", "0:0:0:0::/64"],
    ["unknown", "unknown"]
  ]
  for (const [address, bucket] of cases) it(`${address} → ${bucket}`, () => expect(addressBucket(address)).toBe(bucket))
})

/** Clients behind a trusted proxy (this test), named by X-Forwarded-For. */
const FAILURES_PER_MINUTE = 3

layer(TestServerLive({ ipAuthFailuresPerMinute: FAILURES_PER_MINUTE, trustedProxies: ["127.0.0.1"] }), {
  excludeTestServices: true,
  timeout: 60_000
})("failed authentications counted per client", (it) => {
  const guess = (client: string) =>
    Effect.map(
      call("GET", "/v1/models", { token: "nns_live_guess", headers: { "x-forwarded-for": client } }),
      (reply) => reply.status
    )

  it.effect("IPv6 clients of one /64 share one budget; another /64 and each IPv4 address have their own", () =>
    Effect.gen(function*() {
      const first: Array<number> = []
      // Each guess from a new address of one /64: the address changes, the budget does not.
      for (let host = 1; host <= FAILURES_PER_MINUTE + 2; host++) {
        first.push(yield* guess(`2001:db8:aa:1::${host.toString(16)}`))
      }
      expect(first).toEqual([401, 401, 401, 429, 429])
      expect(yield* guess("2001:db8:aa:1:ffff:ffff:ffff:fffe")).toBe(429)
      // The neighbouring /64 is another subscriber.
      expect(yield* guess("2001:db8:aa:2::1")).toBe(401)
      // IPv4 clients are counted per address, mapped into IPv6 or not.
      const mapped: Array<number> = []
      for (let attempt = 0; attempt < FAILURES_PER_MINUTE; attempt++) mapped.push(yield* guess("::ffff:198.51.100.7"))
      expect(mapped).toEqual([401, 401, 401])
      expect(yield* guess("198.51.100.7")).toBe(429)
      expect(yield* guess("198.51.100.8")).toBe(401)
    }))
})
