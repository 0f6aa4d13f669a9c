import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import { Effect } from "effect"
import { NenasApi } from "../Api.js"
import { AuditLog } from "../Audit/Repo.js"
import { CurrentAccount } from "../Auth/Api.js"
import { KeyCache } from "../Keys/KeyCache.js"
import { allOff, type GuardrailPolicy } from "./Api.js"
import { checkedFilters, type Found, partsChanged, redactFound, scanWith, testScanner } from "./Policy.js"
import { GuardrailsRepo, type StoredPolicy } from "./Repo.js"

const view = (stored: StoredPolicy | undefined) => ({
  policy: stored?.policy ?? allOff,
  updated_at: stored?.updatedAt.toISOString() ?? null
})

export const GuardrailsLive = HttpApiBuilder.group(
  NenasApi,
  "guardrails",
  (handlers) =>
    Effect.gen(function*() {
      const repo = yield* GuardrailsRepo
      const audit = yield* AuditLog
      const keys = yield* KeyCache
      const stored = Effect.flatMap(CurrentAccount, (account) => Effect.orDie(repo.find(account.id)))
      return handlers
        .handle("get", () => Effect.map(stored, view))
        .handle("put", ({ payload }) =>
          Effect.gen(function*() {
            const account = yield* CurrentAccount
            yield* checkedFilters(payload.filters, "filters")
            const before = yield* Effect.orDie(repo.find(account.id))
            const saved = yield* audit.within(
              Effect.orDie(repo.save(account.id, payload, account.member.id)),
              () => ({
                action: "guardrails.updated",
                targetType: "guardrails",
                targetId: account.id,
                // The parts changed, by name: a filter's pattern may itself be personal data.
                details: { parts: partsChanged(before?.policy ?? allOff, payload) }
              })
            )
            // Every instance hears of it through the table's NOTIFY within moments; this one knows at once.
            yield* keys.forgetAccount(account.id)
            return view(saved)
          }))
        .handle("test", ({ payload }) =>
          Effect.gen(function*() {
            // Every filter given is checked, one that is off too; labels name findings, so each is the policy's own.
            const policy: GuardrailPolicy = payload.policy ?? (yield* stored)?.policy ?? allOff
            yield* checkedFilters(policy.filters, "policy.filters")
            const scanner = testScanner(policy)
            const found: ReadonlyArray<Found> = scanner === undefined ? [] : scanWith(scanner, payload.text)
            return {
              redacted_text: redactFound(payload.text, found),
              findings: found.map(({ action, end, label, start, type }) =>
                label === undefined ? { type, start, end, action } : { type, label, start, end, action }
              ),
              blocked: found.some((finding) => finding.action === "block")
            }
          }))
    })
)
