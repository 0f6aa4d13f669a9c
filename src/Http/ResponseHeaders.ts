import { Effect, FiberRef } from "effect"

/**
 * Headers a handler adds to whatever response its request ends with, the
 * error middleware's error bodies included (a 429 carries its
 * `X-RateLimit-*`). The middleware gives each request its own record.
 */
export const CurrentResponseHeaders: FiberRef.FiberRef<Record<string, string> | undefined> = FiberRef.unsafeMake<
  Record<string, string> | undefined
>(undefined)

export const addResponseHeaders = (headers: Record<string, string>) =>
  Effect.map(FiberRef.get(CurrentResponseHeaders), (record) => {
    if (record !== undefined) Object.assign(record, headers)
  })
