import { Context, Effect, Layer, Option, Redacted } from "effect"
import { createCipheriv, createDecipheriv, createHmac, randomBytes } from "node:crypto"
import { join } from "node:path"
import { AppConfig, dataDirSecret } from "../AppConfig.js"

/**
 * Provider keys' API keys at rest (docs/api/provider-keys.md, "Secrets"): AES-256-GCM under a key derived from
 * the server's secret, the row's id and account bound as associated data (a sealed key copied to another row does
 * not open), stored as iv (12 bytes), tag (16 bytes), ciphertext.
 */
export interface SecretBox {
  /** The server secret's fingerprint (`provider_keys.secret_key_id`): which secret sealed a row, never the secret. */
  readonly keyId: string
  readonly seal: (id: string, accountId: string, apiKey: string) => Buffer
  /** The API key, or undefined when `sealed` does not open under this secret (another secret, or altered). */
  readonly open: (id: string, accountId: string, sealed: Buffer) => string | undefined
}

const IV_BYTES = 12
const TAG_BYTES = 16

const associated = (id: string, accountId: string) => Buffer.from(`nenas:provider-key:${id}:${accountId}`, "utf8")

export const makeSecretBox = (secret: string): SecretBox => {
  const material = Buffer.from(secret, "utf8")
  const key = createHmac("sha256", material).update("nenas:provider-keys:aes-256-gcm").digest()
  const keyId = createHmac("sha256", material).update("nenas:provider-keys:fingerprint").digest("hex").slice(0, 16)
  return {
    keyId,
    seal: (id, accountId, apiKey) => {
      const iv = randomBytes(IV_BYTES)
      const cipher = createCipheriv("aes-256-gcm", key, iv)
      cipher.setAAD(associated(id, accountId))
      const ciphertext = Buffer.concat([cipher.update(apiKey, "utf8"), cipher.final()])
      return Buffer.concat([iv, cipher.getAuthTag(), ciphertext])
    },
    open: (id, accountId, sealed) => {
      if (sealed.length < IV_BYTES + TAG_BYTES) return undefined
      try {
        const decipher = createDecipheriv("aes-256-gcm", key, sealed.subarray(0, IV_BYTES))
        decipher.setAAD(associated(id, accountId))
        decipher.setAuthTag(sealed.subarray(IV_BYTES, IV_BYTES + TAG_BYTES))
        return Buffer.concat([decipher.update(sealed.subarray(IV_BYTES + TAG_BYTES)), decipher.final()]).toString(
          "utf8"
        )
      } catch {
        return undefined
      }
    }
  }
}

const FILE = "provider-keys-secret"

/** The secret in `DATA_DIR` (64 hex characters, used as the text it is). */
const fromDataDir = (dataDir: string) => dataDirSecret(dataDir, FILE, (text) => text.length >= 32 ? text : undefined)

/**
 * The boxes of the server's secrets: `current` seals (`PROVIDER_KEYS_SECRET`, else a secret kept in `DATA_DIR`),
 * `previous` (`PROVIDER_KEYS_SECRET_PREVIOUS`, during a rotation) only opens what it sealed.
 */
export class ProviderKeySecrets extends Context.Tag("nenas/ProviderKeySecrets")<ProviderKeySecrets, {
  readonly current: SecretBox
  readonly previous: SecretBox | undefined
}>() {
  static readonly layer = Layer.effect(
    ProviderKeySecrets,
    Effect.gen(function*() {
      const config = yield* AppConfig
      const configured = Option.map(config.providerKeysSecret, Redacted.value)
      const secret = Option.isSome(configured) ? configured.value : yield* fromDataDir(config.dataDir).pipe(
        Effect.flatMap((stored) =>
          stored !== undefined ? Effect.succeed(stored) : Effect.as(
            // Keys saved now open on this process only, until it stops; after that they answer `failing`.
            Effect.logWarning(
              `PROVIDER_KEYS_SECRET is unset and ${
                join(config.dataDir, FILE)
              } cannot be kept: provider keys saved now open on this process only`
            ),
            randomBytes(32).toString("hex")
          )
        )
      )
      const current = makeSecretBox(secret)
      const previous = Option.match(config.providerKeysSecretPrevious, {
        onNone: () => undefined,
        onSome: (old) => makeSecretBox(Redacted.value(old))
      })
      return { current, previous: previous?.keyId === current.keyId ? undefined : previous }
    })
  )
}
