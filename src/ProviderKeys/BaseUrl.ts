import { Either } from "effect"
import type { LookupFunction } from "node:net"
import { isIpLiteral, refusedAddress } from "../Search/Address.js"
import type { AdmitRules, HostResolver } from "../Search/Fetch.js"

/**
 * A provider key's base URL and the address guard over it (docs/security.md, "Outbound requests"): https on a
 * public address, unless its host is in `PROVIDER_ALLOWED_HOSTS` (a team's own vLLM or Ollama, over http too).
 */

/** The guard's rules for a provider's base URL: any port, https outside the allowed hosts. */
export const providerRules = (allowedHosts: ReadonlySet<string>): AdmitRules => ({
  allowedHosts,
  webPortsOnly: false,
  httpsOnly: true
})

/** What the team is told of a refused base URL: never what its host resolves to (the log says that). */
export const NOT_ALLOWED = "a provider key reaches only https URLs on public addresses, without credentials"

/**
 * The base URL as it is kept: absolute http(s), no credentials, no query or fragment, without a trailing slash
 * (calls append `/chat/completions`); or why not, in a line the team reads.
 */
export const parseBaseUrl = (raw: string): Either.Either<URL, string> => {
  let url: URL
  try {
    url = new URL(raw)
  } catch {
    return Either.left("must be an absolute URL, such as https://api.openai.com/v1")
  }
  if (url.protocol !== "https:" && url.protocol !== "http:") return Either.left("must be an http or https URL")
  if (url.username !== "" || url.password !== "") {
    return Either.left("must not carry credentials: send the API key as api_key")
  }
  if (url.search !== "" || url.hash !== "" || raw.includes("?") || raw.includes("#")) {
    return Either.left("must not have a query or a fragment")
  }
  return Either.right(url)
}

/** The kept form of a parsed base URL: `https://host[:port]/path`, no trailing slash. */
export const baseUrlText = (url: URL): string => `${url.origin}${url.pathname.replace(/\/+$/, "")}`

const defaultPort = (url: URL) => url.protocol === "https:" ? "443" : "80"

/** Whether the URL's host is one of `PROVIDER_ALLOWED_HOSTS` (`host`, any port, or `host:port`). */
export const isAllowedHost = (url: URL, allowedHosts: ReadonlySet<string>): boolean => {
  const host = url.hostname.toLowerCase()
  return allowedHosts.has(host) || allowedHosts.has(`${host}:${url.port === "" ? defaultPort(url) : url.port}`)
}

const refusal = (message: string) => Object.assign(new Error(message), { code: "EADDRNOTALLOWED" })

/**
 * A lookup for the calls on a key whose base URL names a host: each connection resolves it again and goes only
 * to the addresses just checked, every one of them public, so a DNS answer that changed to a private address
 * is refused before any connection.
 */
export const guardedLookup = (resolver: HostResolver["Type"]): LookupFunction => (hostname, options, callback) => {
  resolver.lookup(hostname).then((found) => {
    const addresses = options.family === 4 || options.family === 6
      ? found.filter((entry) => entry.family === options.family)
      : found
    const first = addresses[0]
    if (first === undefined) {
      return callback(Object.assign(new Error(`${hostname} has no address`), { code: "ENOTFOUND" }), "", 4)
    }
    if (addresses.some(({ address }) => refusedAddress(address) !== undefined)) {
      return callback(refusal(`${hostname} resolves to an address the address guard refuses`), "", 4)
    }
    if (options.all === true) return callback(null, addresses.map(({ address, family }) => ({ address, family })))
    callback(null, first.address, first.family)
  }, (error: NodeJS.ErrnoException) => callback(error, "", 4))
}

/**
 * The lookup a key's calls connect with (undefined for an IP literal or an allowed host: no check to make at
 * connection), or why the guard refuses its base URL now (`PROVIDER_ALLOWED_HOSTS` changed since it was saved).
 */
export const callLookup = (
  resolver: HostResolver["Type"],
  allowedHosts: ReadonlySet<string>,
  url: URL
): Either.Either<LookupFunction | undefined, string> => {
  if (isAllowedHost(url, allowedHosts)) return Either.right(undefined)
  if (url.protocol !== "https:") return Either.left("only https URLs are reached (outside the allowed hosts)")
  if (isIpLiteral(url.hostname)) {
    const refused = refusedAddress(url.hostname)
    return refused === undefined ? Either.right(undefined) : Either.left(`${url.hostname} is a ${refused} address`)
  }
  return Either.right(guardedLookup(resolver))
}
