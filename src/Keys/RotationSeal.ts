import { Context, Effect, Layer, Option, Redacted } from "effect"
import { randomBytes } from "node:crypto"
import { mkdir, readFile, writeFile } from "node:fs/promises"
import { join } from "node:path"
import { AppConfig } from "../AppConfig.js"
import { openSecret, sealSecret } from "./ApiKeys.js"

const FILE = "rotation-seal-key"

/** The secret in `DATA_DIR`, made on first start (as the development identity key is); none when the folder refuses. */
const fromDataDir = (dataDir: string) =>
  Effect.promise(async (): Promise<Buffer | undefined> => {
    const file = join(dataDir, FILE)
    const read = () => readFile(file, "utf8").then((text) => Buffer.from(text.trim(), "hex"), () => undefined)
    const stored = await read()
    if (stored !== undefined && stored.length >= 32) return stored
    try {
      await mkdir(dataDir, { recursive: true })
      // `wx`: of two instances starting together on one DATA_DIR, the second keeps the first one's secret.
      await writeFile(file, randomBytes(32).toString("hex"), { mode: 0o600, flag: "wx" })
    } catch {
      // Made by another process meanwhile, or the folder refuses: read below.
    }
    const made = await read()
    return made !== undefined && made.length >= 32 ? made : undefined
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
