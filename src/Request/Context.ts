import { Context, Effect, FiberRef } from "effect"

/** The request id of the request being served; the pipeline (`Http/Pipeline.ts`) sets it. */
export const CurrentRequestId: FiberRef.FiberRef<string> = FiberRef.unsafeMake("")

/** What the access log learns about a request as it is served: never a key, a token or a prompt. */
export interface RequestFacts {
  requestId?: string
  keyId?: string
  accountId?: string
}

/** Each request's own record for the access log; the error middleware and authentication fill it in. */
export const CurrentRequestFacts: FiberRef.FiberRef<RequestFacts | undefined> = FiberRef.unsafeMake<
  RequestFacts | undefined
>(undefined)

const FACTS = Symbol.for("nenas/RequestFacts")

/** The record the access log will read for a Node request (`Lane/Front.ts` makes it, before the app sees the request). */
export const attachRequestFacts = (incoming: object, facts: RequestFacts): void => {
  ;(incoming as { [FACTS]?: RequestFacts })[FACTS] = facts
}

export const requestFactsOf = (incoming: object): RequestFacts | undefined =>
  (incoming as { [FACTS]?: RequestFacts })[FACTS]

export const noteRequestFacts = (facts: RequestFacts) =>
  Effect.map(FiberRef.get(CurrentRequestFacts), (record) => {
    if (record !== undefined) Object.assign(record, facts)
  })

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

/** The request id of the request being served (the `X-Request-Id` it answers with). */
export const currentRequestId = FiberRef.get(CurrentRequestId)

/**
 * `service` for `effect` and the rest of this fiber: one update of its context.
 * For a request's own fiber only, which ends with its request: nothing after
 * `effect` needs the context back, which `Effect.provideService` restores
 * around it (an acquire-use-release and its runtime flags, on every call).
 */
export const provideForRequest = <I, S, A, E, R>(
  effect: Effect.Effect<A, E, R>,
  tag: Context.Tag<I, S>,
  service: NoInfer<S>
): Effect.Effect<A, E, Exclude<R, I>> =>
  Effect.zipRight(FiberRef.update(FiberRef.currentContext, Context.add(tag, service)), effect) as Effect.Effect<
    A,
    E,
    Exclude<R, I>
  >
