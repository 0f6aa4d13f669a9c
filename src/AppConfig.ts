import { Config, ConfigError, Context, Effect, Either, Layer, Option, Redacted, Schema } from "effect"
import { randomBytes } from "node:crypto"
import { mkdir, readFile, writeFile } from "node:fs/promises"
import { hostname } from "node:os"
import { join } from "node:path"
import { DEFAULT_PRICES, PriceTable } from "./Domain/Prices.js"
import { parseUpstreams, shorthandUpstream, type UpstreamConfig, withUpstreamPrices } from "./Domain/Upstreams.js"
import { Address, isTin, type Party } from "./Invoices/Api.js"

/** Every setting of the configuration table (docs/operations.md, "Configuration"), read once at start-up. */
export interface AppConfigShape {
  readonly port: number
  readonly host: string
  readonly publicBaseUrl: string
  readonly databaseUrl: Option.Option<Redacted.Redacted>
  readonly dataDir: string
  readonly redisUrl: Option.Option<string>
  readonly rateLimitRpm: number
  readonly rateLimitConcurrent: number
  /** The most a key may be given (`RATE_LIMIT_RPM_MAX`); unset: 10× `RATE_LIMIT_RPM`. */
  readonly rateLimitRpmMax: Option.Option<number>
  /** The most a key may be given (`RATE_LIMIT_CONCURRENT_MAX`); unset: 10× `RATE_LIMIT_CONCURRENT`. */
  readonly rateLimitConcurrentMax: Option.Option<number>
  readonly upstreamBaseUrl: Option.Option<string>
  readonly upstreamApiKey: Option.Option<Redacted.Redacted>
  readonly upstreamModelGeneral: string
  readonly upstreamModelReasoning: string
  /** `UPSTREAM_MODEL_EMBEDDING`: the shorthand upstream's embedding model (`POST /v1/embeddings`). */
  readonly upstreamModelEmbedding: string
  /**
   * Every upstream, in the order fallbacks try them (`UPSTREAMS`, else the one `UPSTREAM_BASE_URL` names);
   * empty: the simulated model.
   */
  readonly upstreams: ReadonlyArray<UpstreamConfig>
  /** The whole first-byte budget of a call, shared by its attempts (Providers/Fallback.ts). */
  readonly upstreamFirstByteTimeoutMs: number
  readonly upstreamTotalTimeoutMs: number
  /** `BREAKER_FAILURES`: consecutive failures of a target that open its circuit breaker. */
  readonly breakerFailures: number
  /** `BREAKER_ERROR_RATE`: the share of failed calls (0–1) over `BREAKER_WINDOW_MS` that opens it, once `BREAKER_MIN_CALLS` were made. */
  readonly breakerErrorRate: number
  readonly breakerWindowMs: number
  readonly breakerMinCalls: number
  /** `BREAKER_COOLDOWN_MS`: how long an opened breaker skips its target before one probe call may try it. */
  readonly breakerCooldownMs: number
  /** `BREAKER_KEY_PREFIX`: the Redis key prefix of the breakers' shared state (deployments, or tests, sharing one Redis keep apart with it). */
  readonly breakerKeyPrefix: string
  /**
   * `UPSTREAM_IMAGE_URLS`: `pass` sends remote image URLs to the upstream as they came; `inline` fetches
   * them through the fetch guard and sends `data:` URLs, so a self-hosted upstream fetches nothing itself.
   */
  readonly upstreamImageUrls: "pass" | "inline"
  readonly searchBaseUrl: Option.Option<string>
  /** `FETCH_ALLOWED_HOSTS`: `host` or `host:port` entries, lower case, that page fetching may reach although they are not public. */
  readonly fetchAllowedHosts: ReadonlySet<string>
  /** `WEBHOOK_ALLOWED_HOSTS`: the same for developer webhooks (over http too); page fetching never reaches these. */
  readonly webhookAllowedHosts: ReadonlySet<string>
  /** One web page's deadline; not an environment setting (tests shorten it). */
  readonly fetchPageTimeoutMs: number
  /** `PROVIDER_ALLOWED_HOSTS`: the same for the base URLs of a team's own provider keys (over http too). */
  readonly providerAllowedHosts: ReadonlySet<string>
  /**
   * `PROVIDER_KEYS_SECRET`: what a team's provider keys are sealed with at rest, shared by the instances of one
   * deployment; unset, a secret kept in `DATA_DIR` (one machine).
   */
  readonly providerKeysSecret: Option.Option<Redacted.Redacted>
  /** `PROVIDER_KEYS_SECRET_PREVIOUS`: the secret being rotated out; keys sealed under it are sealed again at start. */
  readonly providerKeysSecretPrevious: Option.Option<Redacted.Redacted>
  /** `BYOK_FEE_BPS`: what a call answered on a team's own provider key costs, in basis points of nenas's own price. */
  readonly byokFeeBps: number
  readonly stripeSecretKey: Option.Option<Redacted.Redacted>
  readonly stripeWebhookSecret: Option.Option<Redacted.Redacted>
  readonly stripeApiUrl: Option.Option<string>
  readonly authJwksUrl: Option.Option<string>
  readonly authIssuer: Option.Option<string>
  readonly authAudience: Option.Option<string>
  /**
   * `AUTH_AUTHORIZE_URL`: the identity provider's authorization endpoint; the dashboard's sign-in
   * button starts an implicit-flow redirect there (client id = `AUTH_AUDIENCE`) with a state and nonce.
   */
  readonly authAuthorizeUrl: Option.Option<string>
  /** `DEV_AUTH`: `1` turns the development identity provider on off loopback, `0` turns it off; unset, loopback decides. */
  readonly devAuth: Option.Option<boolean>
  readonly dashboardUrl: string
  readonly businessTimezone: string
  readonly production: boolean
  /** `LOG_FORMAT`: one JSON object a line, or pretty lines for a terminal. */
  readonly logFormat: "json" | "pretty"
  /** `METRICS_TOKEN`: when set, `GET /metrics` requires it as a bearer token. */
  readonly metricsToken: Option.Option<Redacted.Redacted>
  /** `OTEL_EXPORTER_OTLP_ENDPOINT`: where traces go over OTLP/HTTP; unset, no tracer runs. */
  readonly otlpEndpoint: Option.Option<string>
  /**
   * `ROTATION_SEAL_SECRET`: what a key rotation's replayable secret is sealed with besides its Idempotency-Key,
   * shared by the instances of one deployment; unset, a secret kept in `DATA_DIR` (one machine).
   */
  readonly rotationSealSecret: Option.Option<Redacted.Redacted>
  /** Model, search and page prices; `PRICE_TABLE` (JSON) replaces the documented defaults. */
  readonly prices: PriceTable
  /** How often each instance sweeps lapsed reservations; not an environment setting (tests lengthen it). */
  readonly reservationSweepIntervalMs: number
  /**
   * `INSTANCE_ID`, default `hostname:PORT`: who this process is across restarts. A process starting
   * with the identity of an earlier one knows that one is dead and releases what it held at once.
   */
  readonly instanceId: string
  /** How long a streamed call's settlement waits for its stream to start before settling it as abandoned; not an environment setting. */
  readonly streamHandoffTimeoutMs: number
  /** How long a streamed call's client may leave its answer unread (writes backed up, nothing taken) before it is cut; not an environment setting. */
  readonly streamWriteStallMs: number
  /** `IP_AUTH_FAILURES_PER_MINUTE`: failed authentications (API keys and dashboard session tokens) one client address may make a minute before it is refused. */
  readonly ipAuthFailuresPerMinute: number
  /** `IP_CHECKOUTS_PER_MINUTE`: checkout sessions one client address may create a minute. */
  readonly ipCheckoutsPerMinute: number
  /** `IP_DEV_SESSIONS_PER_MINUTE`: development identity provider sessions (`POST /dev/session`) one client address may create a minute. */
  readonly ipDevSessionsPerMinute: number
  /** `TRUSTED_PROXIES`: addresses or CIDR ranges whose `X-Forwarded-For` names the client; unset, the socket's peer is the client. */
  readonly trustedProxies: ReadonlyArray<string>
  /** `SMTP_URL`: a `nodemailer` transport URL for alert emails; unset, they are kept in the development mailbox (`/dev/mailbox`). */
  readonly smtpUrl: Option.Option<Redacted.Redacted>
  /** `EMAIL_FROM`: the sender of alert emails. */
  readonly emailFrom: string
  /** `WEBHOOK_TIMEOUT_MS`: one webhook delivery's deadline, answer included; a receiver that hangs is cut there. */
  readonly webhookTimeoutMs: number
  /** How often each instance looks for due webhook deliveries and emails; not an environment setting. */
  readonly outboxPollMs: number
  /** `STORED_RESPONSES_MAX_BYTES`: the most an account's stored responses may hold; past it its oldest are deleted. */
  readonly storedResponsesMaxBytes: number
  /** The response cache kept per account (docs/api/cache.md, "What is stored"); past it the least recently used go. */
  readonly cacheMaxBytes: number
  /** `SST_RATE_BPS`: service tax charged on top of each top-up, in basis points (800 = 8%); 0 charges none. */
  readonly sstRateBps: number
  /** `SUPPLIER_*`: the operator as invoices name it; unset, the sandbox supplier (refused in production). */
  readonly supplier: Party
  /** True when `supplier` is the sandbox supplier, not the operator's own details. */
  readonly sandboxSupplier: boolean
  /** `MYINVOIS_PORTAL_URL`: the MyInvois portal a valid e-invoice's validation link points at. */
  readonly myinvoisPortalUrl: string
  /** `MYINVOIS_BASE_URL`: LHDN's MyInvois API (its preprod sandbox or production); unset, the built-in simulated MyInvois. */
  readonly myinvoisBaseUrl: Option.Option<string>
  /** `MYINVOIS_CLIENT_ID`, `MYINVOIS_CLIENT_SECRET`: the ERP system's client credentials, required with `MYINVOIS_BASE_URL`. */
  readonly myinvoisClientId: Option.Option<string>
  readonly myinvoisClientSecret: Option.Option<Redacted.Redacted>
  /** `MYINVOIS_SIGNING_KEY`, `MYINVOIS_SIGNING_CERT`: PEM files; both set, documents are signed (version 1.1). */
  readonly myinvoisSigningKey: Option.Option<string>
  readonly myinvoisSigningCert: Option.Option<string>
  /** How often each instance looks for e-invoices to submit, poll or cancel; not an environment setting. */
  readonly eInvoicePollMs: number
}

/** An unset `RATE_LIMIT_*_MAX` is this many times its default (docs/operations.md, "Configuration"). */
export const RATE_LIMIT_CEILING_FACTOR = 10

const nonEmpty = (name: string) => Config.option(Config.nonEmptyString(name))

/** A comma list of `host` or `host:port`, lower case; unset is none. */
const hostList = (name: string) =>
  Config.string(name).pipe(
    Config.withDefault(""),
    Config.map((value): ReadonlySet<string> =>
      new Set(value.split(",").map((entry) => entry.trim().toLowerCase()).filter((entry) => entry.length > 0))
    )
  )

/** An integer setting with a default, refused (naming it and its range) outside `min`–`max`. */
const integerBetween = (name: string, fallback: number, min: number, max: number) =>
  Config.integer(name).pipe(
    Config.withDefault(fallback),
    Config.validate({
      message: `${name} must be an integer from ${min} to ${max}`,
      validation: (value) => value >= min && value <= max
    })
  )

/** A secret shared by a deployment's instances: unset (or empty) is none, else at least 32 characters. */
const secretOfAtLeast32 = (name: string) =>
  Config.option(Config.redacted(name)).pipe(
    Config.map(Option.filter((secret) => Redacted.value(secret).length > 0)),
    Config.validate({
      message: `${name} must be at least 32 characters (a random secret shared by every instance)`,
      validation: (secret) => Option.isNone(secret) || Redacted.value(secret.value).length >= 32
    })
  )

/** The supplier invoices name while `SUPPLIER_*` is unset: its name says it is not a real business. */
export const SANDBOX_SUPPLIER: Party = {
  legal_name: "nenas sandbox supplier (not a real business; set SUPPLIER_*)",
  tin: "C25845632020",
  id_type: "BRN",
  id_value: "201901234567",
  sst_number: null,
  msic: "62099",
  email: "billing@nenas.invalid",
  phone: "+60300000000",
  address: {
    line1: "Sandbox address",
    line2: null,
    city: "Kuala Lumpur",
    postcode: "50000",
    state_code: "14",
    country_code: "MYS"
  }
}

const SUPPLIER_REQUIRED = [
  "SUPPLIER_NAME",
  "SUPPLIER_TIN",
  "SUPPLIER_BRN",
  "SUPPLIER_MSIC",
  "SUPPLIER_ADDRESS",
  "SUPPLIER_EMAIL",
  "SUPPLIER_PHONE"
] as const

type SupplierVariables = Record<typeof SUPPLIER_REQUIRED[number] | "SUPPLIER_SST_NUMBER", Option.Option<string>>

const decodeAddress = Schema.decodeUnknownEither(Schema.parseJson(Address))

/** The variables that name the supplier; with service tax charged, its SST number too. */
export const supplierVariableNames = (sstRateBps: number): ReadonlyArray<string> =>
  sstRateBps > 0 ? [...SUPPLIER_REQUIRED, "SUPPLIER_SST_NUMBER"] : SUPPLIER_REQUIRED

/**
 * The operator from `SUPPLIER_*`, or why not (one line naming the variables): all of them or none; none is
 * the sandbox supplier (which production refuses, with the other gaps: `productionGaps`). With service tax
 * charged, `SUPPLIER_SST_NUMBER` is required.
 */
export const supplierFrom = (
  variables: SupplierVariables,
  sstRateBps: number
): Either.Either<{ readonly supplier: Party; readonly sandbox: boolean }, string> => {
  const unset: Array<string> = SUPPLIER_REQUIRED.filter((name) => Option.isNone(variables[name]))
  const none = unset.length === SUPPLIER_REQUIRED.length && Option.isNone(variables.SUPPLIER_SST_NUMBER)
  if (none) {
    return Either.right({
      supplier: sstRateBps > 0 ? { ...SANDBOX_SUPPLIER, sst_number: "W00-0000-00000000" } : SANDBOX_SUPPLIER,
      sandbox: true
    })
  }
  if (sstRateBps > 0 && Option.isNone(variables.SUPPLIER_SST_NUMBER)) unset.push("SUPPLIER_SST_NUMBER")
  if (unset.length > 0) return Either.left(`The supplier on invoices is incomplete; set ${unset.join(", ")}`)
  const value = (name: keyof SupplierVariables) => Option.getOrElse(variables[name], () => "")
  const tin = value("SUPPLIER_TIN")
  if (!isTin(tin)) return Either.left("SUPPLIER_TIN must be a MyInvois TIN (C25845632020, IG115002000)")
  const address = decodeAddress(value("SUPPLIER_ADDRESS"))
  if (Either.isLeft(address)) {
    return Either.left(
      "SUPPLIER_ADDRESS must be JSON {line1, line2?, city, postcode, state_code, country_code?}: " +
        address.left.message.split("\n").slice(0, 3).join(" ")
    )
  }
  if (!/^\d{5}$/.test(value("SUPPLIER_MSIC"))) return Either.left("SUPPLIER_MSIC must be a 5-digit MSIC code")
  return Either.right({
    supplier: {
      legal_name: value("SUPPLIER_NAME"),
      tin,
      id_type: "BRN",
      id_value: value("SUPPLIER_BRN"),
      sst_number: Option.getOrNull(variables.SUPPLIER_SST_NUMBER),
      msic: value("SUPPLIER_MSIC"),
      email: value("SUPPLIER_EMAIL"),
      phone: value("SUPPLIER_PHONE"),
      address: address.right
    },
    sandbox: false
  })
}

const isValidTimezone = (zone: string): boolean => {
  try {
    new Intl.DateTimeFormat("en", { timeZone: zone })
    return true
  } catch {
    return false
  }
}

export const appConfig: Config.Config<AppConfigShape> = Config.all({
  port: Config.port("PORT").pipe(Config.withDefault(8080)),
  host: Config.string("HOST").pipe(Config.withDefault("127.0.0.1")),
  publicBaseUrl: nonEmpty("PUBLIC_BASE_URL"),
  databaseUrl: Config.option(Config.redacted("DATABASE_URL")).pipe(
    Config.map(Option.filter((url) => Redacted.value(url).length > 0))
  ),
  dataDir: Config.string("DATA_DIR").pipe(Config.withDefault("./.data")),
  redisUrl: nonEmpty("REDIS_URL"),
  rateLimitRpm: Config.integer("RATE_LIMIT_RPM").pipe(Config.withDefault(600)),
  rateLimitConcurrent: Config.integer("RATE_LIMIT_CONCURRENT").pipe(Config.withDefault(50)),
  rateLimitRpmMax: Config.option(Config.integer("RATE_LIMIT_RPM_MAX")),
  rateLimitConcurrentMax: Config.option(Config.integer("RATE_LIMIT_CONCURRENT_MAX")),
  upstreamBaseUrl: nonEmpty("UPSTREAM_BASE_URL"),
  upstreamApiKey: Config.option(Config.redacted("UPSTREAM_API_KEY")),
  upstreamModelGeneral: Config.string("UPSTREAM_MODEL_GENERAL").pipe(Config.withDefault("gpt-4.1-mini")),
  upstreamModelReasoning: Config.string("UPSTREAM_MODEL_REASONING").pipe(Config.withDefault("o4-mini")),
  upstreamModelEmbedding: Config.string("UPSTREAM_MODEL_EMBEDDING").pipe(Config.withDefault("text-embedding-3-small")),
  upstreamsJson: nonEmpty("UPSTREAMS").pipe(
    Config.mapOrFail((json) =>
      Option.match(json, {
        onNone: () => Either.right(Option.none<ReadonlyArray<UpstreamConfig>>()),
        onSome: (text) =>
          Either.map(
            Either.mapLeft(parseUpstreams(text), (line) => ConfigError.InvalidData(["UPSTREAMS"], line)),
            Option.some
          )
      })
    )
  ),
  upstreamFirstByteTimeoutMs: Config.integer("UPSTREAM_FIRST_BYTE_TIMEOUT_MS").pipe(Config.withDefault(30_000)),
  upstreamTotalTimeoutMs: Config.integer("UPSTREAM_TOTAL_TIMEOUT_MS").pipe(Config.withDefault(600_000)),
  breakerFailures: integerBetween("BREAKER_FAILURES", 5, 1, 1_000),
  breakerErrorRate: Config.number("BREAKER_ERROR_RATE").pipe(
    Config.withDefault(0.5),
    Config.validate({
      message:
        "BREAKER_ERROR_RATE must be a number above 0 and at most 1 (the share of failed calls that opens a breaker)",
      validation: (rate) => rate > 0 && rate <= 1
    })
  ),
  breakerWindowMs: integerBetween("BREAKER_WINDOW_MS", 60_000, 1_000, 3_600_000),
  breakerMinCalls: integerBetween("BREAKER_MIN_CALLS", 10, 1, 1_000_000),
  breakerCooldownMs: integerBetween("BREAKER_COOLDOWN_MS", 30_000, 100, 3_600_000),
  breakerKeyPrefix: Config.string("BREAKER_KEY_PREFIX").pipe(Config.withDefault("nenas:breaker:")),
  upstreamImageUrls: Config.literal("pass", "inline")("UPSTREAM_IMAGE_URLS").pipe(Config.withDefault("pass" as const)),
  searchBaseUrl: nonEmpty("SEARCH_BASE_URL"),
  fetchAllowedHosts: hostList("FETCH_ALLOWED_HOSTS"),
  webhookAllowedHosts: hostList("WEBHOOK_ALLOWED_HOSTS"),
  fetchPageTimeoutMs: Config.succeed(8_000),
  providerAllowedHosts: hostList("PROVIDER_ALLOWED_HOSTS"),
  providerKeysSecret: secretOfAtLeast32("PROVIDER_KEYS_SECRET"),
  providerKeysSecretPrevious: secretOfAtLeast32("PROVIDER_KEYS_SECRET_PREVIOUS"),
  byokFeeBps: integerBetween("BYOK_FEE_BPS", 500, 0, 10_000),
  stripeSecretKey: Config.option(Config.redacted("STRIPE_SECRET_KEY")),
  stripeWebhookSecret: Config.option(Config.redacted("STRIPE_WEBHOOK_SECRET")),
  stripeApiUrl: nonEmpty("STRIPE_API_URL"),
  authJwksUrl: nonEmpty("AUTH_JWKS_URL"),
  authIssuer: nonEmpty("AUTH_ISSUER"),
  authAudience: nonEmpty("AUTH_AUDIENCE"),
  authAuthorizeUrl: nonEmpty("AUTH_AUTHORIZE_URL"),
  devAuth: Config.option(Config.literal("1", "0")("DEV_AUTH")).pipe(Config.map(Option.map((flag) => flag === "1"))),
  dashboardUrl: nonEmpty("DASHBOARD_URL"),
  businessTimezone: Config.string("BUSINESS_TIMEZONE").pipe(
    Config.withDefault("Asia/Kuala_Lumpur"),
    Config.validate({ message: "BUSINESS_TIMEZONE must be an IANA time zone", validation: isValidTimezone })
  ),
  nodeEnv: Config.string("NODE_ENV").pipe(Config.withDefault("development")),
  logFormat: Config.option(Config.literal("json", "pretty")("LOG_FORMAT")),
  metricsToken: Config.option(Config.redacted("METRICS_TOKEN")).pipe(
    Config.map(Option.filter((token) => Redacted.value(token).length > 0))
  ),
  otlpEndpoint: nonEmpty("OTEL_EXPORTER_OTLP_ENDPOINT"),
  rotationSealSecret: Config.option(Config.redacted("ROTATION_SEAL_SECRET")).pipe(
    Config.validate({
      message: "ROTATION_SEAL_SECRET must be at least 32 characters (a random secret shared by every instance)",
      validation: (secret) => Option.isNone(secret) || Redacted.value(secret.value).length >= 32
    })
  ),
  prices: Config.string("PRICE_TABLE").pipe(
    Config.mapOrFail((json) =>
      Either.mapLeft(
        Schema.decodeUnknownEither(Schema.parseJson(PriceTable))(json),
        (error) => ConfigError.InvalidData(["PRICE_TABLE"], `PRICE_TABLE is not a valid price table: ${error.message}`)
      )
    ),
    Config.withDefault(DEFAULT_PRICES)
  ),
  reservationSweepIntervalMs: Config.succeed(2_000),
  instanceId: nonEmpty("INSTANCE_ID"),
  streamHandoffTimeoutMs: Config.succeed(30_000),
  streamWriteStallMs: Config.succeed(30_000),
  ipAuthFailuresPerMinute: Config.integer("IP_AUTH_FAILURES_PER_MINUTE").pipe(Config.withDefault(60)),
  ipCheckoutsPerMinute: Config.integer("IP_CHECKOUTS_PER_MINUTE").pipe(Config.withDefault(20)),
  ipDevSessionsPerMinute: Config.integer("IP_DEV_SESSIONS_PER_MINUTE").pipe(Config.withDefault(20)),
  trustedProxies: Config.string("TRUSTED_PROXIES").pipe(
    Config.withDefault(""),
    Config.map((value) => value.split(",").map((entry) => entry.trim()).filter((entry) => entry.length > 0))
  ),
  smtpUrl: Config.option(Config.redacted("SMTP_URL")).pipe(
    Config.map(Option.filter((url) => Redacted.value(url).length > 0))
  ),
  emailFrom: Config.string("EMAIL_FROM").pipe(Config.withDefault("nenas <alerts@localhost>")),
  webhookTimeoutMs: Config.integer("WEBHOOK_TIMEOUT_MS").pipe(
    Config.withDefault(10_000),
    Config.validate({
      message: "WEBHOOK_TIMEOUT_MS must be between 100 and 60000",
      validation: (ms) => ms >= 100 && ms <= 60_000
    })
  ),
  outboxPollMs: Config.succeed(250),
  storedResponsesMaxBytes: integerBetween("STORED_RESPONSES_MAX_BYTES", 1_073_741_824, 1, Number.MAX_SAFE_INTEGER),
  cacheMaxBytes: integerBetween("CACHE_MAX_BYTES", 268_435_456, 1024, Number.MAX_SAFE_INTEGER),
  sstRateBps: integerBetween("SST_RATE_BPS", 0, 0, 10_000),
  myinvoisPortalUrl: Config.string("MYINVOIS_PORTAL_URL").pipe(
    Config.withDefault("https://preprod.myinvois.hasil.gov.my"),
    Config.map((url) => url.replace(/\/+$/, ""))
  ),
  myinvoisBaseUrl: nonEmpty("MYINVOIS_BASE_URL").pipe(Config.map(Option.map((url) => url.replace(/\/+$/, "")))),
  myinvoisClientId: nonEmpty("MYINVOIS_CLIENT_ID"),
  myinvoisClientSecret: Config.option(Config.redacted("MYINVOIS_CLIENT_SECRET")).pipe(
    Config.map(Option.filter((secret) => Redacted.value(secret).length > 0))
  ),
  myinvoisSigningKey: nonEmpty("MYINVOIS_SIGNING_KEY"),
  myinvoisSigningCert: nonEmpty("MYINVOIS_SIGNING_CERT"),
  eInvoicePollMs: Config.succeed(1_000),
  supplierVariables: Config.all({
    SUPPLIER_NAME: nonEmpty("SUPPLIER_NAME"),
    SUPPLIER_TIN: nonEmpty("SUPPLIER_TIN"),
    SUPPLIER_BRN: nonEmpty("SUPPLIER_BRN"),
    SUPPLIER_SST_NUMBER: nonEmpty("SUPPLIER_SST_NUMBER"),
    SUPPLIER_MSIC: nonEmpty("SUPPLIER_MSIC"),
    SUPPLIER_ADDRESS: nonEmpty("SUPPLIER_ADDRESS"),
    SUPPLIER_EMAIL: nonEmpty("SUPPLIER_EMAIL"),
    SUPPLIER_PHONE: nonEmpty("SUPPLIER_PHONE")
  })
}).pipe(
  Config.mapOrFail(({ supplierVariables, ...rest }) =>
    Either.match(supplierFrom(supplierVariables, rest.sstRateBps), {
      onLeft: (message) => Either.left(ConfigError.InvalidData(["SUPPLIER_NAME"], message)),
      onRight: ({ sandbox, supplier }) => Either.right({ ...rest, supplier, sandboxSupplier: sandbox })
    })
  ),
  Config.map(({ dashboardUrl, instanceId, logFormat, nodeEnv, publicBaseUrl, upstreamsJson, ...rest }) => {
    // `UPSTREAMS` overrides the one-upstream shorthand; its prices override the price table's.
    const upstreams = Option.getOrElse(upstreamsJson, () =>
      Option.match(rest.upstreamBaseUrl, {
        onNone: () => [],
        onSome: (
          url
        ) => [
          shorthandUpstream(url, rest.upstreamApiKey, {
            general: rest.upstreamModelGeneral,
            reasoning: rest.upstreamModelReasoning,
            embedding: rest.upstreamModelEmbedding
          })
        ]
      }))
    const base = Option.getOrElse(publicBaseUrl, () => `http://${rest.host}:${rest.port}`).replace(/\/+$/, "")
    const production = nodeEnv === "production"
    return {
      ...rest,
      upstreams,
      prices: withUpstreamPrices(rest.prices, upstreams),
      publicBaseUrl: base,
      // The dashboard the service itself serves (src/Http/Dashboard.ts) unless another is configured.
      dashboardUrl: Option.getOrElse(dashboardUrl, () => `${base}/app`).replace(/\/+$/, ""),
      production,
      instanceId: Option.getOrElse(instanceId, () => `${hostname()}:${rest.port}`),
      logFormat: Option.getOrElse(logFormat, () => production ? "json" as const : "pretty" as const)
    }
  }),
  Config.mapOrFail((config) => {
    const missing = productionGaps(config)
    return missing.length === 0 ? Either.right(config) : Either.left(ConfigError.InvalidData(
      ["NODE_ENV"],
      `NODE_ENV=production runs no embedded or simulated part; set ${missing.join(", ")}`
    ))
  }),
  Config.mapOrFail((config) =>
    Option.match(myinvoisConfigProblem(config), {
      onNone: () => Either.right(config),
      onSome: ([name, message]) => Either.left(ConfigError.InvalidData([name], message))
    })
  ),
  Config.mapOrFail((config) =>
    Option.match(identityConfigProblem(config), {
      onNone: () => Either.right(config),
      onSome: ([name, message]) => Either.left(ConfigError.InvalidData([name], message))
    })
  )
)

/**
 * What is wrong with the identity settings, in one line naming the variables: a JWKS shared by
 * several applications signs tokens for all of them, so whom a token was issued for must be checked.
 */
export const identityConfigProblem = (
  config: Pick<AppConfigShape, "authJwksUrl" | "authIssuer" | "authAudience" | "devAuth" | "production">
): Option.Option<readonly [string, string]> => {
  const missing = [["AUTH_ISSUER", config.authIssuer], ["AUTH_AUDIENCE", config.authAudience]] as const
  const unset = missing.filter(([, value]) => Option.isNone(value)).map(([name]) => name)
  if (Option.isSome(config.authJwksUrl) && unset.length > 0) {
    return Option.some([
      "AUTH_JWKS_URL",
      `AUTH_JWKS_URL is set without ${unset.join(" and ")}: set ${
        unset.join(" and ")
      } too, so that tokens issued for another application or tenant are refused`
    ])
  }
  if (config.production && Option.contains(config.devAuth, true)) {
    return Option.some([
      "DEV_AUTH",
      "DEV_AUTH=1 is refused when NODE_ENV=production: the development identity provider signs anyone in"
    ])
  }
  return Option.none()
}

/** What is wrong with the MyInvois settings, in one line naming the variables (docs/api/e-invoices.md, "Connecting MyInvois"). */
export const myinvoisConfigProblem = (
  config: Pick<
    AppConfigShape,
    "myinvoisBaseUrl" | "myinvoisClientId" | "myinvoisClientSecret" | "myinvoisSigningKey" | "myinvoisSigningCert"
  >
): Option.Option<readonly [string, string]> => {
  const unset = [
    Option.isNone(config.myinvoisClientId) ? "MYINVOIS_CLIENT_ID" : undefined,
    Option.isNone(config.myinvoisClientSecret) ? "MYINVOIS_CLIENT_SECRET" : undefined
  ].filter((name) => name !== undefined)
  if (Option.isSome(config.myinvoisBaseUrl) && unset.length > 0) {
    return Option.some(["MYINVOIS_BASE_URL", `MYINVOIS_BASE_URL is set without ${unset.join(" and ")}`])
  }
  if (Option.isSome(config.myinvoisSigningKey) !== Option.isSome(config.myinvoisSigningCert)) {
    return Option.some([
      "MYINVOIS_SIGNING_KEY",
      "MYINVOIS_SIGNING_KEY and MYINVOIS_SIGNING_CERT go together: set both PEM files, or neither"
    ])
  }
  return Option.none()
}

/**
 * The variables production lacks: each replaces an embedded or simulated part
 * (database, model, search, checkout, identity provider) with the real one.
 */
export const productionGaps = (config: Omit<AppConfigShape, "logFormat"> & { readonly production: boolean }) => {
  if (!config.production) return []
  const required: ReadonlyArray<readonly [string, Option.Option<unknown>]> = [
    ["DATABASE_URL", config.databaseUrl],
    ["UPSTREAM_BASE_URL (or UPSTREAMS)", config.upstreams.length > 0 ? Option.some(true) : Option.none()],
    ["SEARCH_BASE_URL", config.searchBaseUrl],
    ["STRIPE_SECRET_KEY", config.stripeSecretKey],
    ["STRIPE_WEBHOOK_SECRET", config.stripeWebhookSecret],
    ["AUTH_JWKS_URL", config.authJwksUrl],
    // Invoices name the operator, never the sandbox supplier.
    [supplierVariableNames(config.sstRateBps).join(", "), config.sandboxSupplier ? Option.none() : Option.some(true)],
    // E-invoices go to LHDN, signed (version 1.1).
    ["MYINVOIS_BASE_URL", config.myinvoisBaseUrl],
    ["MYINVOIS_CLIENT_ID", config.myinvoisClientId],
    ["MYINVOIS_CLIENT_SECRET", config.myinvoisClientSecret],
    ["MYINVOIS_SIGNING_KEY", config.myinvoisSigningKey],
    ["MYINVOIS_SIGNING_CERT", config.myinvoisSigningCert]
  ]
  return required.filter(([, value]) => Option.isNone(value)).map(([name]) => name)
}

const SHORTHAND_FIELDS = [
  "upstreamBaseUrl",
  "upstreamApiKey",
  "upstreamModelGeneral",
  "upstreamModelReasoning",
  "upstreamModelEmbedding"
] as const

/**
 * `config` with `overrides`, its upstreams derived as at start-up: the shorthand's fields given (and no
 * `upstreams`) make the one-upstream list; `upstreams` given (and no `prices`) bring their prices.
 */
const withOverrides = (config: AppConfigShape, overrides: Partial<AppConfigShape>): AppConfigShape => {
  const merged = { ...config, ...overrides }
  const upstreams = overrides.upstreams ?? (SHORTHAND_FIELDS.some((field) => field in overrides)
    ? Option.match(merged.upstreamBaseUrl, {
      onNone: () => [],
      onSome: (
        url
      ) => [
        shorthandUpstream(url, merged.upstreamApiKey, {
          general: merged.upstreamModelGeneral,
          reasoning: merged.upstreamModelReasoning,
          embedding: merged.upstreamModelEmbedding
        })
      ]
    })
    : config.upstreams)
  return { ...merged, upstreams, prices: overrides.prices ?? withUpstreamPrices(config.prices, upstreams) }
}

export class AppConfig extends Context.Tag("nenas/AppConfig")<AppConfig, AppConfigShape>() {
  static readonly layer = Layer.effect(AppConfig, appConfig)
  /** For tests and tools that build the service with explicit settings. */
  static readonly layerWith = (overrides: Partial<AppConfigShape>) =>
    Layer.effect(AppConfig, Effect.map(appConfig, (config) => withOverrides(config, overrides)))
}

/**
 * A server secret kept in `DATA_DIR` under `file` (64 hex characters, mode 0600), made on first start; `parse`
 * turns its text into the secret, or undefined when the text will not do. None when the folder refuses.
 */
export const dataDirSecret = <A>(dataDir: string, file: string, parse: (text: string) => A | undefined) =>
  Effect.promise(async (): Promise<A | undefined> => {
    const path = join(dataDir, file)
    const read = () => readFile(path, "utf8").then((text) => parse(text.trim()), () => undefined)
    const stored = await read()
    if (stored !== undefined) return stored
    try {
      await mkdir(dataDir, { recursive: true })
      // `wx`: of two instances starting together on one DATA_DIR, the second keeps the first one's secret.
      await writeFile(path, randomBytes(32).toString("hex"), { mode: 0o600, flag: "wx" })
    } catch {
      // Made by another process meanwhile, or the folder refuses: read below.
    }
    return read()
  })
