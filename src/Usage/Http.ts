import { HttpApiBuilder } from "@effect/platform"
import { NenasApi } from "../Api.js"
import { notImplemented } from "../Domain/Errors.js"

export const UsageLive = HttpApiBuilder.group(NenasApi, "usage", (handlers) =>
  handlers
    .handle("logs", () => notImplemented("Request logs"))
    .handle("usage", () => notImplemented("Usage series"))
    .handle("overview", () => notImplemented("The overview")))
