import { Context, Effect, Layer, Option, Redacted } from "effect"
import { randomBytes } from "node:crypto"
import { join } from "node:path"
import { AppConfig, dataDirSecret } from "../AppConfig.js"
import { openSecret, sealSecret } from "./ApiKeys.js"

const FILE = "rotation-seal-key"

/** The secret in `DATA_DIR`, as bytes (as the development identity key is kept). */
const fromDataDir = (dataDir: string) =>
  dataDirSecret(dataDir, FILE, (text) => {
    const bytes = Buffer.from(text, "hex")
    return bytes.length >= 32 ? bytes : undefined
  })

/**
 * Seals and opens a rotation's replayable secret with the server's secret
 * besides the caller's Idempotency-Key (`ApiKeys.sealSecret`), so that the
 * database alone never opens it: `ROTATION_SEAL_SECRET`, shared by a
 * deployment's instances, else a secret kept in `DATA_DIR`.
 */
export class RotationSeal extends Context.Tag("nenas/RotationSeal")<RotationSeal, {
  readonly seal: (keyId: string, idempotencyKey: string, secret: string) => Buffer
  readonly open: (keyId: string, idempotencyKey: string, sealed: Buffer) => string | undefined
}>() {
  static readonly layer = Layer.effect(
    RotationSeal,
    Effect.gen(function*() {
      const config = yield* AppConfig
      const configured = Option.map(config.rotationSealSecret, (secret) => Buffer.from(Redacted.value(secret), "utf8"))
      const secret = Option.isSome(configured) ? configured.value : yield* fromDataDir(config.dataDir).pipe(
        Effect.flatMap((stored) =>
          stored !== undefined ? Effect.succeed(stored) : Effect.as(
            // Repeats then answer the same secret only on this process, until it stops.
            Effect.logWarning(
              `ROTATION_SEAL_SECRET is unset and ${
                join(config.dataDir, FILE)
              } cannot be kept: rotations replay on this process only`
            ),
            randomBytes(32)
          )
        )
      )
      return RotationSeal.of({
        seal: (keyId, idempotencyKey, text) => sealSecret(secret, keyId, idempotencyKey, text),
        open: (keyId, idempotencyKey, sealed) => openSecret(secret, keyId, idempotencyKey, sealed)
      })
    })
  )
}
