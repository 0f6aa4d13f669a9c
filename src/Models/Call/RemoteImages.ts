import { Duration, Effect } from "effect"
import { InvalidRequest } from "../../Domain/Errors.js"
import type { UpstreamMessage, UpstreamPart } from "../../Providers/Provider.js"
import type { PageError } from "../../Search/Fetch.js"
import { IMAGE_MAX_BYTES, IMAGE_TIMEOUT, type ImageFetcher } from "../../Search/ImageFetch.js"

/** Remote images one call may have fetched: each is a request we make on the caller's behalf. */
export const INLINE_MAX_IMAGES = 50
/** Their bytes together, as OpenAI caps a request's images. */
export const INLINE_MAX_TOTAL_BYTES = 50 * 1024 * 1024
const AT_ONCE = 4

const MIB = 1024 * 1024

/** The caller's answer names the image, never what the guard found (an internal address, a resolver's answer). */
const refusalOf = (error: PageError, param: string): InvalidRequest =>
  error._tag === "PageRefused"
    ? new InvalidRequest({
      message:
        `Invalid image URL: images are fetched only from public web addresses (ports 80 and 443), and only answers of an image type up to ${
          IMAGE_MAX_BYTES / MIB
        } MiB.`,
      param
    })
    : new InvalidRequest({
      message: `The image could not be fetched (an error, or no image within ${
        Duration.format(IMAGE_TIMEOUT)
      }); send it as a data: URL instead.`,
      param
    })

/**
 * Every remote image (`remote`: URL → the param of its first use) held to the address guard before the call is
 * held, in either `UPSTREAM_IMAGE_URLS` mode: an address inside the network is the caller's 400, naming the image.
 */
export const screenRemoteImages = (
  fetcher: ImageFetcher["Type"],
  remote: ReadonlyMap<string, string> | undefined
): Effect.Effect<void, InvalidRequest> =>
  remote === undefined || remote.size === 0 ?
    Effect.void :
    Effect.forEach(remote, ([url, param]) =>
      fetcher.screen(url).pipe(
        Effect.tapError((error) => Effect.logWarning("remote image refused", { url: error.url, reason: error.reason })),
        Effect.mapError((error) => refusalOf(error, param))
      ), { concurrency: AT_ONCE, discard: true })

/**
 * `UPSTREAM_IMAGE_URLS=inline`: the conversation with each remote image
 * (`remote`: URL → the param of its first use) fetched through the fetch guard
 * and replaced by a `data:` URL, so that a self-hosted upstream never fetches
 * anything from inside the network. A refused or failed fetch is the caller's
 * 400, naming the image.
 */
export const inlineRemoteImages = Effect.fnUntraced(function*(
  fetcher: ImageFetcher["Type"],
  upstream: ReadonlyArray<UpstreamMessage>,
  remote: ReadonlyMap<string, string>
) {
  if (remote.size === 0) return upstream
  const entries = [...remote]
  const beyond = entries[INLINE_MAX_IMAGES]
  if (beyond !== undefined) {
    return yield* new InvalidRequest({
      message: `At most ${INLINE_MAX_IMAGES} remote images a request; send the others as data: URLs.`,
      param: beyond[1]
    })
  }
  let total = 0
  const inlined = new Map<string, string>()
  yield* Effect.forEach(entries, ([url, param]) =>
    fetcher.fetch(url).pipe(
      Effect.tapError((error) => Effect.logWarning("remote image refused", { url: error.url, reason: error.reason })),
      Effect.mapError((error) => refusalOf(error, param)),
      Effect.flatMap((image) => {
        total += image.bytes.length
        if (total > INLINE_MAX_TOTAL_BYTES) {
          return Effect.fail(
            new InvalidRequest({
              message: `The remote images together exceed ${INLINE_MAX_TOTAL_BYTES / MIB} MiB.`,
              param
            })
          )
        }
        inlined.set(url, `data:${image.mediaType};base64,${image.bytes.toString("base64")}`)
        return Effect.void
      })
    ), { concurrency: AT_ONCE, discard: true })
  const partOf = (part: UpstreamPart): UpstreamPart => {
    if (part.type !== "image_url") return part
    const data = inlined.get(part.image_url.url)
    return data === undefined ? part : { type: "image_url", image_url: { ...part.image_url, url: data } }
  }
  return upstream.map((message): UpstreamMessage =>
    message.role === "assistant" || message.role === "tool" || typeof message.content === "string"
      ? message
      : { role: message.role, content: message.content.map(partOf) }
  )
})
