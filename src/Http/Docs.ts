import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as OpenApi from "@effect/platform/OpenApi"
import { Effect } from "effect"
import { createRequire } from "node:module"
import { NenasApi } from "../Api.js"

/**
 * In its sandbox (`DOCS_CSP`) the docs page has no storage: reading `localStorage` throws,
 * and the reference (Scalar) stops rendering. This runs first and gives it storage in
 * memory, only when the real one is refused.
 */
const MEMORY_STORAGE = `<script>(() => {
  const memory = () => {
    const items = new Map()
    return {
      get length() { return items.size },
      key: (index) => [...items.keys()][index] ?? null,
      getItem: (name) => items.has(String(name)) ? items.get(String(name)) : null,
      setItem: (name, value) => { items.set(String(name), String(value)) },
      removeItem: (name) => { items.delete(String(name)) },
      clear: () => items.clear()
    }
  }
  for (const name of ["localStorage", "sessionStorage"]) {
    try { void window[name] } catch { Object.defineProperty(window, name, { value: memory(), configurable: true }) }
  }
})()</script>`

/** JSON inside a `<script>` element: nothing in it may close the element or end a JavaScript line. */
const scriptJson = (value: unknown): string =>
  JSON.stringify(value).replace(/</g, "\\u003c").replace(/\u2028/g, "\\u2028").replace(/\u2029/g, "\\u2029")

const htmlText = (text: string): string => text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")

/**
 * Scalar's browser bundle, as `@effect/platform`'s `HttpApiScalar` inlines it (3.4 MB of script). Its
 * module is read on the first `/docs` request, not at start: `HttpApiScalar.layer` builds the page when
 * the server starts, and the module's string and the page held 13 MB of every instance's heap for a
 * page few instances ever serve. The module is the platform's own, beside `HttpApiScalar` in its
 * package (not in its exports map, so it is found from that module's path).
 */
const scalarBundle = Effect.promise(async () => {
  const require = createRequire(import.meta.url)
  const bundle = require(
    require.resolve("@effect/platform/HttpApiScalar").replace(/HttpApiScalar\.js$/, "internal/httpApiScalar.js")
  )
  return (bundle as { readonly javascript: string }).javascript
})

/**
 * The API reference at `/docs`: the OpenAPI document rendered by Scalar, its script inline (the page's
 * CSP allows nothing off this origin, no fonts from Scalar's CDN either). Built once, on first use.
 */
const page = Effect.map(scalarBundle, (javascript) => {
  const spec = OpenApi.fromApi(NenasApi)
  const html = `<!doctype html>
<html>
  <head>${MEMORY_STORAGE}
    <meta charset="utf-8" />
    <title>${htmlText(spec.info.title)}</title>
    <meta name="viewport" content="width=device-width, initial-scale=1" />
  </head>
  <body>
    <script id="api-reference" type="application/json">
      ${scriptJson(spec)}
    </script>
    <script>
      document.getElementById('api-reference').dataset.configuration = JSON.stringify(${
    scriptJson({ _integration: "html", withDefaultFonts: false })
  })
    </script>
    <script>${javascript}</script>
  </body>
</html>`
  return new TextEncoder().encode(html)
})

export const DocsLive = HttpApiBuilder.Router.use((router) =>
  Effect.flatMap(
    Effect.cached(page),
    (cachedPage) =>
      router.get(
        "/docs",
        Effect.map(
          cachedPage,
          (body) => HttpServerResponse.uint8Array(body, { contentType: "text/html; charset=utf-8" })
        )
      )
  )
)
