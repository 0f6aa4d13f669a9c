import * as FileSystem from "@effect/platform/FileSystem"
import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as Path from "@effect/platform/Path"
import { Effect, Option } from "effect"
import { existsSync } from "node:fs"
import { fileURLToPath } from "node:url"
import { AppConfig } from "../AppConfig.js"
import { identityMode } from "../Auth/IdentityProvider.js"
import { NotFound } from "../Domain/Errors.js"

/** The mount point of the web dashboard; `DASHBOARD_URL` defaults to `PUBLIC_BASE_URL` + this. */
export const DASHBOARD_PATH = "/app"

/** `web/dist` at the project's root: two folders up from `src/Http/` (tsx), three from the compiled `dist/src/Http/`. */
const distCandidates = ["../../web/dist", "../../../web/dist"].map((path) =>
  fileURLToPath(new URL(path, import.meta.url))
)
export const DASHBOARD_DIST = distCandidates.find((dir) => existsSync(dir)) ?? distCandidates[0] ?? "web/dist"

/** Vite names every file under `assets/` by its content hash: it never changes, so it is cached for good. */
const IMMUTABLE = "public, max-age=31536000, immutable"
/** The entry page names the current hashed assets, so the browser must revalidate it each time. */
const REVALIDATE = "no-cache"

/**
 * The file a path under `/app/` names, relative to the build, or none when the
 * path tries to leave it. Decoding before normalising catches `%2e%2e`.
 */
export const relativeFile = (pathname: string): Option.Option<string> => {
  const rest = pathname.slice(DASHBOARD_PATH.length).replace(/^\/+/, "")
  let decoded: string
  try {
    decoded = decodeURIComponent(rest)
  } catch {
    return Option.none()
  }
  if (decoded.includes("\0") || decoded.split(/[\\/]/).includes("..")) return Option.none()
  return Option.some(decoded)
}

const notBuilt = new NotFound({
  message: "The dashboard is not built: run `npm run build:web` (npm start does it when web/dist is missing)."
})

/**
 * Serves the built dashboard beside the API: hashed assets as immutable files,
 * other files as they are, and every other path under `/app/` as `index.html`
 * (the client routes it). A missing asset is a 404, not the page, so a stale
 * tab fails loudly instead of parsing HTML as JavaScript.
 */
export const DashboardLive = HttpApiBuilder.Router.use((router) =>
  Effect.gen(function*() {
    const fs = yield* FileSystem.FileSystem
    const path = yield* Path.Path
    const config = yield* AppConfig
    const root = DASHBOARD_DIST
    // What the page needs before sign-in: which sign-in to offer, and the zone that decides day buckets.
    const identity = identityMode(config)._tag
    const clientConfig = {
      identity,
      // The implicit-flow redirect the sign-in button starts (OIDC: an id_token's audience is the client id).
      authorize: identity === "external" && Option.isSome(config.authAuthorizeUrl) && Option.isSome(config.authAudience)
        ? {
          url: config.authAuthorizeUrl.value,
          client_id: config.authAudience.value,
          redirect_uri: `${config.dashboardUrl}/`
        }
        : null,
      checkout: Option.isSome(config.stripeSecretKey) ? "stripe" : "simulated",
      business_timezone: config.businessTimezone
    }

    const isFile = (file: string) =>
      fs.stat(file).pipe(Effect.map((info) => info.type === "File"), Effect.orElseSucceed(() => false))

    const serve = (file: string, cacheControl: string) =>
      HttpServerResponse.file(file).pipe(
        Effect.map(HttpServerResponse.setHeader("cache-control", cacheControl)),
        Effect.orElse(() => Effect.fail(notBuilt))
      )

    const handler = Effect.gen(function*() {
      const request = yield* HttpServerRequest.HttpServerRequest
      const pathname = new URL(request.url, "http://localhost").pathname
      if (pathname === DASHBOARD_PATH) return HttpServerResponse.redirect(`${DASHBOARD_PATH}/`, { status: 308 })
      const relative = Option.getOrElse(relativeFile(pathname), () => "")
      const file = path.join(root, relative)
      // A second guard after joining: whatever the path said, only files inside the build are read.
      const inside = file.startsWith(root + path.sep)
      if (inside && relative !== "" && !relative.endsWith(".map") && (yield* isFile(file))) {
        return yield* serve(file, relative.startsWith("assets/") ? IMMUTABLE : REVALIDATE)
      }
      // Source maps would hand out the dashboard's sources: a build that still has them does not serve them.
      if (relative.startsWith("assets/") || relative.endsWith(".map")) {
        return yield* Effect.fail(new NotFound({ message: `No dashboard asset ${pathname}.` }))
      }
      return yield* serve(path.join(root, "index.html"), REVALIDATE)
    })

    yield* router.get(
      `${DASHBOARD_PATH}/config.json`,
      HttpServerResponse.json(clientConfig, { headers: { "cache-control": REVALIDATE } })
    )
    for (const route of [DASHBOARD_PATH, `${DASHBOARD_PATH}/*`] as const) {
      yield* router.get(route, handler)
      // Node sends the headers of a HEAD answer without its body.
      yield* router.head(route, handler)
    }
  })
)
