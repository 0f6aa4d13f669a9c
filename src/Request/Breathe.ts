import { Effect, FiberRef } from "effect"

/**
 * Past this many characters of body, a request's phases (reading, the depth check, parsing, decoding, counting,
 * the call) each end with a turn of the event loop, so one large request never runs them back to back while
 * other requests wait (docs/security.md, "Bounded work per request"). A small request takes none of these turns.
 */
export const LARGE_BODY_CHARS = 256 * 1024

/** Whether the request being served has a large body (set by the request guard once it has read it). */
export const LargeRequest = FiberRef.unsafeMake(false)

/** A turn of the event loop: a macrotask, so that I/O and timers run (a microtask would not let them). */
export const breathe: Effect.Effect<void> = Effect.async<void>((resume) => {
  const turn = setImmediate(() => resume(Effect.void))
  return Effect.sync(() => clearImmediate(turn))
})

/** A turn of the event loop when the body of `chars` characters is large. */
export const breatheAfter = (chars: number): Effect.Effect<void> => chars > LARGE_BODY_CHARS ? breathe : Effect.void

/** A turn of the event loop when the request being served has a large body. */
export const breatheIfLarge: Effect.Effect<void> = Effect.flatMap(
  FiberRef.get(LargeRequest),
  (large) => large ? breathe : Effect.void
)
