import { createHash } from "node:crypto"
import type { Environment } from "./Api.js"
import { randomBase62 } from "../Domain/Ids.js"

/** `nns_live_` or `nns_test_` and 40 random base62 characters (about 238 bits). */
export const generateKey = (environment: Environment): string => `nns_${environment}_${randomBase62(40)}`

export const PREFIX_LENGTH = 12

export const keyPrefix = (key: string): string => key.slice(0, PREFIX_LENGTH)

/** Only this hash is stored; the key itself is shown once, at creation. */
export const hashKey = (key: string): Buffer => createHash("sha256").update(key, "utf8").digest()

export const MAX_KEYS_PER_ACCOUNT = 50
