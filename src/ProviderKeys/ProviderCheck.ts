import { Duration, Effect } from "effect"
import * as http from "node:http"
import * as https from "node:https"
import type { LookupFunction } from "node:net"
import { admitUrl, type HostResolver } from "../Search/Fetch.js"
import { baseUrlText, providerRules } from "./BaseUrl.js"

/**
 * The check of a provider key on save (docs/api/provider-keys.md, "Adding a key"): one cheap request, `GET
 * {base_url}/models` with the key, through the address guard, within a deadline; no redirect is followed.
 */

export type CheckOutcome =
  /** A 2xx: the provider took the key. */
  | { readonly _tag: "Accepted" }
  /** 401 or 403: the provider refused the key. */
  | { readonly _tag: "Refused"; readonly status: number }
  /** Another answer that is not a 5xx (a 404: not the API's root, say). */
  | { readonly _tag: "Answered"; readonly status: number }
  /** No answer, a 5xx, or the deadline; `reason` never names an address. */
  | { readonly _tag: "Unreachable"; readonly reason: string }
  /** The address guard refused the URL before any connection; `reason` is for the log only. */
  | { readonly _tag: "NotAllowed"; readonly reason: string }

export const CHECK_TIMEOUT = Duration.seconds(10)

const USER_AGENT = "nenas-provider-check/1.0"

/** The status of one GET: the body is not read, only the answer's first line matters. */
const statusOf = (url: URL, lookup: LookupFunction | undefined, apiKey: string, signal: AbortSignal) =>
  new Promise<number>((resolve, reject) => {
    const client = url.protocol === "https:" ? https : http
    const request = client.get(url, {
      agent: false,
      signal,
      headers: { authorization: `Bearer ${apiKey}`, accept: "application/json", "user-agent": USER_AGENT },
      ...(lookup === undefined ? {} : { lookup })
    }, (response) => {
      resolve(response.statusCode ?? 0)
      response.destroy()
    })
    request.once("error", reject)
  })

/** Why a GET got no answer, in words the team may read: the network's error code, never its message (it names addresses). */
const reasonOf = (error: unknown): string => {
  const inner = typeof error === "object" && error !== null && "error" in error ? error.error : error
  if (typeof inner === "object" && inner !== null && "code" in inner && typeof inner.code === "string") {
    return `the connection failed (${inner.code})`
  }
  return "the connection failed"
}

export const checkProvider = (
  resolver: HostResolver["Type"],
  allowedHosts: ReadonlySet<string>,
  baseUrl: URL,
  apiKey: string,
  timeout: Duration.Duration = CHECK_TIMEOUT
): Effect.Effect<CheckOutcome> => {
  const url = new URL(`${baseUrlText(baseUrl)}/models`)
  return admitUrl(resolver, providerRules(allowedHosts), url).pipe(
    Effect.flatMap((lookup) =>
      Effect.tryPromise({ try: (signal) => statusOf(url, lookup, apiKey, signal), catch: reasonOf }).pipe(
        Effect.timeoutFail({
          duration: timeout,
          onTimeout: () => `no answer within ${Duration.format(timeout)}`
        }),
        Effect.map((status): CheckOutcome =>
          status >= 200 && status < 300
            ? { _tag: "Accepted" }
            : status === 401 || status === 403
            ? { _tag: "Refused", status }
            : status >= 500
            ? { _tag: "Unreachable", reason: `it answered HTTP ${status}` }
            : { _tag: "Answered", status }
        ),
        Effect.catchAll((reason) => Effect.succeed<CheckOutcome>({ _tag: "Unreachable", reason }))
      )
    ),
    Effect.catchTags({
      PageRefused: (refused) => Effect.succeed<CheckOutcome>({ _tag: "NotAllowed", reason: refused.reason }),
      PageFailed: () => Effect.succeed<CheckOutcome>({ _tag: "Unreachable", reason: "its host name did not resolve" })
    })
  )
}
