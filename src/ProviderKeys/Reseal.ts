import { Effect } from "effect"
import { ProviderKeysRepo } from "./Repo.js"
import { ProviderKeySecrets } from "./SecretBox.js"

/** Keys sealed again per read: a large table is gone through in bounded pieces. */
const BATCH = 100

/**
 * During a rotation (docs/api/provider-keys.md, "Rotating the server secret"): every key sealed under
 * `PROVIDER_KEYS_SECRET_PREVIOUS` is opened with it and sealed under `PROVIDER_KEYS_SECRET`, in batches. Each
 * write is conditional on the key being still under the previous secret, so instances starting together do
 * the work once between them. A key that does not open is left as it is: loading reports it. Answers how
 * many it sealed again.
 */
export const resealUnderCurrent = Effect.gen(function*() {
  const { current, previous } = yield* ProviderKeySecrets
  if (previous === undefined) return 0
  const repo = yield* ProviderKeysRepo
  let after = ""
  let resealed = 0
  while (true) {
    const batch = yield* repo.sealedUnder(previous.keyId, after, BATCH)
    for (const row of batch) {
      const apiKey = previous.open(row.id, row.accountId, row.secret)
      if (apiKey === undefined) continue
      const sealed = {
        secret: current.seal(row.id, row.accountId, apiKey),
        secretKeyId: current.keyId,
        last4: row.last4
      }
      if (yield* repo.reseal(row.id, previous.keyId, sealed)) resealed++
    }
    const last = batch[batch.length - 1]
    if (last === undefined || batch.length < BATCH) break
    after = last.id
  }
  if (resealed > 0) {
    yield* Effect.logInfo(`${resealed} provider key(s) sealed again under the new PROVIDER_KEYS_SECRET`)
  }
  return resealed
})
