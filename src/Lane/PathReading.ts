/**
 * One path, one reading (docs/security.md, "Security"): the router (find-my-way) would decode percent-escapes, merge duplicate
 * slashes, cut the path at `;`, strip an absolute-form target's scheme and host, and (configured so in `Http/Server.ts`
 * no longer) fold letter case, while the checks in front of it (development routes, the request guard, CORS,
 * `no-store`) read the path as sent. A target that any of these would read differently is refused at the front, so
 * that whatever passes reads alike everywhere; HEAD is served as GET (`Front.ts`), Node leaving the body out.
 */

/**
 * Two slashes; a backslash (the WHATWG parser reads it as one); `;` and `#` (the router ends the path there);
 * a dot segment; a percent-escaped letter, digit, `-`, `.`, `_` or `~` (RFC 3986's unreserved characters,
 * which the router decodes into a literal segment).
 */
const NOT_ONE_READING = /\/\/|\\|;|#|(?:^|\/)\.\.?(?:\/|$)|%(?:3[0-9]|[46][1-9a-fA-F]|[57][0-9aA]|2[dDeE]|5[fF]|7[eE])/

/** Every route's first segment is lower-case (`/v1`, `/dashboard`, `/dev`, `/app`, …); deeper ones are the router's, case-sensitive. */
const UPPER_FIRST_SEGMENT = /^\/[^/]*[A-Z]/

/** Why the request target is not in the form the router and every check read alike, or undefined when it is. */
export const nonCanonical = (url: string): string | undefined => {
  if (url.charCodeAt(0) !== 47) return "only an origin-form target (a path starting with /) is accepted"
  const query = url.indexOf("?")
  const path = query === -1 ? url : url.slice(0, query)
  if (NOT_ONE_READING.test(path)) {
    return "the path must not hold duplicate slashes, backslashes, ';', dot segments or percent-escaped letters and digits"
  }
  if (UPPER_FIRST_SEGMENT.test(path)) return "paths are lower-case, as the routes are written"
  return undefined
}

/** The path every check reads: before the query, without the one trailing slash the router also ignores. */
export const pathOf = (url: string): string => {
  const query = url.indexOf("?")
  const path = query === -1 ? url : url.slice(0, query)
  return path.length > 1 && path.endsWith("/") ? path.slice(0, -1) : path
}
