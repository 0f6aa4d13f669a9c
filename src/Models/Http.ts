import { HttpApiBuilder } from "@effect/platform"
import { Effect } from "effect"
import { NenasApi } from "../Api.js"
import { notImplemented } from "../Domain/Errors.js"
import { requireActiveAccount } from "./Access.js"
import { CONTEXT_WINDOW, MAX_OUTPUT_TOKENS, PUBLIC_MODEL } from "./Api.js"
import type { Capability } from "./Api.js"

/**
 * Exactly the capabilities that work end to end. Model calls arrive with the
 * model-calls issue; until then none is claimed.
 */
export const CAPABILITIES: ReadonlyArray<typeof Capability.Type> = []

export const ModelsLive = HttpApiBuilder.group(NenasApi, "models", (handlers) =>
  handlers.handle("list", () =>
    Effect.succeed({
      object: "list" as const,
      data: [{
        id: PUBLIC_MODEL,
        object: "model" as const,
        owned_by: "svc",
        context_window: CONTEXT_WINDOW,
        max_output_tokens: MAX_OUTPUT_TOKENS,
        capabilities: CAPABILITIES
      }]
    })))

export const ModelCallsLive = HttpApiBuilder.group(NenasApi, "modelCalls", (handlers) =>
  handlers
    .handle("responses", () => Effect.zipRight(requireActiveAccount, notImplemented("POST /v1/responses")))
    .handle("chatCompletions", () => Effect.zipRight(requireActiveAccount, notImplemented("POST /v1/chat/completions"))))
