/**
 * An upstream's words as a caller may read them: what it said can name the network behind it (URLs, addresses,
 * host names, paths) or a credential, so those are replaced and the rest kept short; the log keeps the whole text.
 */

const SHORT = 300

/** Any URL, its own or one inside the network. */
const URLS = /\b[a-z][a-z0-9+.-]*:\/\/[^\s"'<>)\]]*/gi
/** `key=value` and `key: value` credentials, whatever the key is called. */
const NAMED_SECRETS =
  /\b((?:api[_-]?key|access[_-]?token|refresh[_-]?token|token|secret|password|passwd|pwd|authorization)\s*[=:]\s*)("[^"]*"|'[^']*'|[^\s&,;)\]]+)/gi
/** Query-string credentials with generic names (`?key=…`), only in their `=` form: "the key: x" is a caller's words. */
const QUERY_SECRETS = /\b((?:key|sig|signature|auth|code|apikey)=)[^\s&,;)\]]+/gi
const BEARER = /\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]+/gi
/** Key shapes that travel alone: OpenAI's `sk-…`, ours, Stripe's, GitHub's, AWS's. */
const KEYS =
  /\b(?:sk|pk|rk)[-_][A-Za-z0-9_-]{3,}|\bnns_(?:live|test)_[A-Za-z0-9]+|\b(?:sk|rk|pk|whsec)_(?:live|test)_[A-Za-z0-9]+|\bgh[pousr]_[A-Za-z0-9]{8,}|\bAKIA[A-Z0-9]{12,}/g
const EMAILS = /\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b/g
/** IPv6 written in any form (`fe80::1`, `[::ffff:127.0.0.1]`, eight groups): a `::` or seven colons. */
const IPV6 = /\[?(?:[0-9a-f]{0,4}:){2,7}(?:[0-9a-f]{1,4}|(?:\d{1,3}\.){3}\d{1,3})?(?:%\w+)?\]?/gi
const IPV4 = /\b\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?\b/g
/**
 * Host names: dotted names ending in a label that names a network (a common top-level domain or an internal
 * suffix), so a parameter path such as `tools.function.parameters` is kept.
 */
const HOSTS =
  /\b(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+(?:com|net|org|io|ai|dev|app|cloud|co|uk|us|eu|de|my|sg|jp|cn|info|biz|xyz|gov|edu|mil|int|example|internal|intranet|local|localdomain|lan|home|corp|svc|cluster|test|invalid|localhost|amazonaws|azure|gcp|onion)\b(?::\d{1,5})?/gi
const LOCALHOST = /\blocalhost(?::\d{1,5})?\b/gi
/** Unix paths of two segments or more (`/var/lib/x`), and Windows ones. */
const PATHS = /(?<![\w.\]])\/(?:[\w.@~-]+\/)+[\w.@~-]*|(?<![\w.\]])\/[\w.@~-]+(?=[\s,;:)"']|$)|\b[a-z]:\\[^\s"']+/gi

const ipv6 = (found: string): string => {
  const bare = found.replace(/^\[|\]$/g, "")
  const colons = bare.split(":").length - 1
  return (bare.includes("::") || colons >= 7) && /[0-9a-f]/i.test(bare) ? "[address]" : found
}

/** `text` without what names the network behind the upstream or a credential, cut to a short message. */
export const cleanUpstreamText = (text: string): string => {
  const cleaned = text
    .replace(URLS, "[url]")
    .replace(BEARER, "$1 [redacted]")
    .replace(NAMED_SECRETS, "$1[redacted]")
    .replace(QUERY_SECRETS, "$1[redacted]")
    .replace(KEYS, "[redacted]")
    .replace(EMAILS, "[email]")
    .replace(IPV6, ipv6)
    .replace(IPV4, "[address]")
    .replace(HOSTS, "[host]")
    .replace(LOCALHOST, "[host]")
    .replace(PATHS, "[path]")
    .replace(/\s+/g, " ")
    .trim()
  return cleaned.length > SHORT ? `${cleaned.slice(0, SHORT - 1)}…` : cleaned
}
