import type { Context } from "effect"
import { Effect, Layer } from "effect"

/** A method a test did not give: calling it (or yielding it, for an Effect-valued member) dies, naming it. */
const unimplemented = (service: string, member: PropertyKey) => {
  const dead = Effect.die(`${service}: unimplemented ${String(member)} (a test gave no implementation)`)
  const method = () => dead
  Object.assign(method, dead)
  Object.setPrototypeOf(method, Object.getPrototypeOf(dead))
  return method
}

/**
 * A Layer of `tag` built from the members a test gives; any other member dies when used, naming itself
 * (as Effect-TS/examples' http-server example does in its `lib/Layer` module). A handler test stubs one repository
 * method this way without PostgreSQL: `KeysRepo.Test({ list: () => Effect.succeed([]) })`.
 */
export const makeTestLayer = <I, S extends object>(tag: Context.Tag<I, S>) => (service: Partial<S>): Layer.Layer<I> =>
  Layer.succeed(
    tag,
    new Proxy({ ...service } as S, {
      get: (target, member) => {
        if (!(member in target)) (target as Record<PropertyKey, unknown>)[member] = unimplemented(tag.key, member)
        return (target as Record<PropertyKey, unknown>)[member]
      },
      has: () => true
    })
  )
