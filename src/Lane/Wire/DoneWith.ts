import type { EventEmitter } from "node:events"

type Listener = Parameters<EventEmitter["off"]>[1]

/** Where a late error of an emitter a call is done with goes: nowhere, and no closure of the call's is kept for it. */
export const ignoreLateError = (): void => {}

/**
 * Takes a call's listeners off an emitter it is done with (its request, its upstream request or answer) and leaves
 * the shared `ignoreLateError` for an error that comes later. A listener left on such an emitter keeps the call's
 * objects through young-generation collections on Node 20, and they are promoted
 * (docs/performance.md, "What kept a request's objects through young collections").
 */
export const doneWith = (emitter: EventEmitter, listeners: Readonly<Record<string, Listener>>): void => {
  for (const event in listeners) emitter.off(event, listeners[event] as Listener)
  emitter.on("error", ignoreLateError)
}
