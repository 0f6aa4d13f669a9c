import { Context, Duration, Effect, Layer } from "effect"
import { AppConfig } from "../AppConfig.js"
import {
  admitUrl,
  type FetchLimits,
  HostResolver,
  makeGuardedFetch,
  type PageError,
  PageRefused,
  type Wanted
} from "./Fetch.js"

export const IMAGE_MAX_BYTES = 20 * 1024 * 1024
export const IMAGE_TIMEOUT = Duration.seconds(15)
export const IMAGE_MAX_REDIRECTS = 3
/** How long the screen waits for a name to resolve before leaving it to the upstream's own resolver. */
const SCREEN_LOOKUP_TIMEOUT = Duration.seconds(3)

/** The image media types a `data:` URL may carry, as the request parser accepts them. */
const IMAGE_TYPE = /^image\/[a-z0-9.+-]+$/

const IMAGES: Wanted = {
  accept: "image/*",
  userAgent: "nenas-image-fetch/1.0",
  admits: (mediaType) => IMAGE_TYPE.test(mediaType),
  what: "an image"
}

/** An image read through the fetch guard: its media type and bytes, whole. */
export interface FetchedImage {
  readonly mediaType: string
  readonly bytes: Buffer
}

/**
 * Fetches remote images through the same guard as web pages (public
 * addresses, ports 80 and 443 unless in `FETCH_ALLOWED_HOSTS`, every redirect
 * checked): only `image/*` answers, refused over `maxBytes` rather than cut.
 */
export const makeImageFetcher = (resolver: HostResolver["Type"], limits: FetchLimits) => {
  // One byte past the cap tells an image of exactly the cap from a longer one.
  const guarded = makeGuardedFetch(resolver, { ...limits, maxBytes: limits.maxBytes + 1 }, IMAGES)
  const fetch = (url: string): Effect.Effect<FetchedImage, PageError> =>
    Effect.flatMap(guarded.fetch(url), (image) =>
      image.truncated
        ? Effect.fail(new PageRefused({ url: image.url, reason: `larger than ${limits.maxBytes} bytes` }))
        : Effect.succeed({
          mediaType: image.contentType.split(";")[0]?.trim().toLowerCase() ?? "",
          bytes: image.bytes
        }))
  /**
   * The address guard alone, for an image URL the upstream will fetch: refused when it is or resolves to an
   * address inside the network. A name that does not resolve here is left to the upstream, which meets the same
   * refusal in its own fetch when it is this network's.
   */
  const screen = (raw: string): Effect.Effect<void, PageRefused> =>
    Effect.try({
      try: () => new URL(raw),
      catch: () => new PageRefused({ url: raw.slice(0, 300), reason: "not a URL" })
    }).pipe(
      Effect.flatMap((url) =>
        admitUrl(resolver, { allowedHosts: limits.allowedHosts, webPortsOnly: false, httpsOnly: false }, url)
      ),
      Effect.timeoutFail({ duration: SCREEN_LOOKUP_TIMEOUT, onTimeout: () => "unresolved" as const }),
      Effect.asVoid,
      Effect.catchAll((error) =>
        error !== "unresolved" && error._tag === "PageRefused" ? Effect.fail(error) : Effect.void
      )
    )
  return { fetch, screen }
}

export class ImageFetcher extends Context.Tag("nenas/ImageFetcher")<ImageFetcher, {
  readonly fetch: (url: string) => Effect.Effect<FetchedImage, PageError>
  readonly screen: (url: string) => Effect.Effect<void, PageRefused>
}>() {
  /** `FETCH_ALLOWED_HOSTS` from configuration, the system resolver. */
  static readonly layer = Layer.effect(
    ImageFetcher,
    Effect.gen(function*() {
      const config = yield* AppConfig
      const resolver = yield* HostResolver
      return makeImageFetcher(resolver, {
        allowedHosts: config.fetchAllowedHosts,
        timeout: IMAGE_TIMEOUT,
        maxBytes: IMAGE_MAX_BYTES,
        maxRedirects: IMAGE_MAX_REDIRECTS
      })
    })
  ).pipe(Layer.provide(HostResolver.system))
}
