import { Option } from "effect"
import { createCipheriv, createDecipheriv, createHash, createHmac, randomBytes } from "node:crypto"
import { type AppConfigShape, RATE_LIMIT_CEILING_FACTOR } from "../AppConfig.js"
import { randomBase62 } from "../Domain/Ids.js"
import type { Environment } from "./Api.js"

/** `nns_live_` or `nns_test_` and 40 random base62 characters (about 238 bits). */
export const generateKey = (environment: Environment): string => `nns_${environment}_${randomBase62(40)}`

export const PREFIX_LENGTH = 12

export const keyPrefix = (key: string): string => key.slice(0, PREFIX_LENGTH)

/** Only this hash is stored; the key itself is shown once, at creation. */
export const hashKey = (key: string): Buffer => createHash("sha256").update(key, "utf8").digest()

export const MAX_KEYS_PER_ACCOUNT = 50
/** A developer's own keys, of the account's 50: one developer cannot use up the account's quota. */
export const MAX_KEYS_PER_DEVELOPER = 10

/** How long a rotation repeated with its Idempotency-Key answers the same new secret. */
export const ROTATION_REPEAT_SECONDS = 86_400

/** An Idempotency-Key a rotation accepts is at least this long: a short one could be guessed. */
export const MIN_ROTATION_IDEMPOTENCY_KEY = 16

const derive = (purpose: string, keyId: string, idempotencyKey: string): Buffer =>
  createHash("sha256").update(`nenas:rotation:${purpose}:${keyId}:${idempotencyKey}`, "utf8").digest()

/** What identifies a rotation by its Idempotency-Key, stored; it does not reveal the sealing key. */
export const rotationToken = (keyId: string, idempotencyKey: string): Buffer => derive("token", keyId, idempotencyKey)

/** The sealing key: the Idempotency-Key (which only the caller holds) under the server's secret (which the database never holds). */
const sealingKey = (serverSecret: Buffer, keyId: string, idempotencyKey: string): Buffer =>
  createHmac("sha256", serverSecret).update(`nenas:rotation:seal:${keyId}:${idempotencyKey}`, "utf8").digest()

/**
 * The new secret sealed (AES-256-GCM) under a key derived from the
 * Idempotency-Key and the server's secret: a database dump with a guessed
 * Idempotency-Key cannot open it, and a repeat of the rotation can.
 */
export const sealSecret = (serverSecret: Buffer, keyId: string, idempotencyKey: string, secret: string): Buffer => {
  const iv = randomBytes(12)
  const cipher = createCipheriv("aes-256-gcm", sealingKey(serverSecret, keyId, idempotencyKey), iv)
  const body = Buffer.concat([cipher.update(secret, "utf8"), cipher.final()])
  return Buffer.concat([iv, cipher.getAuthTag(), body])
}

/** The secret `sealSecret` sealed; undefined when it does not open with this server secret and Idempotency-Key. */
export const openSecret = (
  serverSecret: Buffer,
  keyId: string,
  idempotencyKey: string,
  sealed: Buffer
): string | undefined => {
  try {
    const decipher = createDecipheriv(
      "aes-256-gcm",
      sealingKey(serverSecret, keyId, idempotencyKey),
      sealed.subarray(0, 12)
    )
    decipher.setAuthTag(sealed.subarray(12, 28))
    return Buffer.concat([decipher.update(sealed.subarray(28)), decipher.final()]).toString("utf8")
  } catch {
    return undefined
  }
}

type LimitConfig = Pick<
  AppConfigShape,
  "rateLimitRpm" | "rateLimitConcurrent" | "rateLimitRpmMax" | "rateLimitConcurrentMax"
>

/** The most a key may be given: the operator's ceiling, else 10× the default (docs/operations.md, "Configuration"). */
export const rateLimitCeilings = (config: LimitConfig) => ({
  rpm: Option.getOrElse(config.rateLimitRpmMax, () => config.rateLimitRpm * RATE_LIMIT_CEILING_FACTOR),
  concurrent: Option.getOrElse(
    config.rateLimitConcurrentMax,
    () => config.rateLimitConcurrent * RATE_LIMIT_CEILING_FACTOR
  )
})

/** What a key is held to: its own limits, else the defaults, never above the ceilings (which may have been lowered since). */
export const effectiveRateLimits = (
  config: LimitConfig,
  key: { readonly rateLimitRpm?: number | null; readonly rateLimitConcurrent?: number | null }
) => {
  const ceilings = rateLimitCeilings(config)
  return {
    rpm: Math.min(key.rateLimitRpm ?? config.rateLimitRpm, ceilings.rpm),
    concurrent: Math.min(key.rateLimitConcurrent ?? config.rateLimitConcurrent, ceilings.concurrent)
  }
}
