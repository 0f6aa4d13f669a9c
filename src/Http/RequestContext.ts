import { Effect, FiberRef } from "effect"

/** What the access log learns about a request as it is served: never a key, a token or a prompt. */
export interface RequestFacts {
  requestId?: string
  keyId?: string
  accountId?: string
}

/** The access log gives each request its own record; the error middleware and authentication fill it in. */
export const CurrentRequestFacts: FiberRef.FiberRef<RequestFacts | undefined> = FiberRef.unsafeMake<
  RequestFacts | undefined
>(undefined)

export const noteRequestFacts = (facts: RequestFacts) =>
  Effect.map(FiberRef.get(CurrentRequestFacts), (record) => {
    if (record !== undefined) Object.assign(record, facts)
  })
