import { Either, Option, ParseResult, Redacted, Schema } from "effect"
import type { PriceTable } from "./Prices.js"
import { ModelPrice } from "./Prices.js"

/**
 * The upstreams a call may reach (`UPSTREAMS`:
 * docs/operations.md, "Several upstreams and fallbacks"): named
 * OpenAI-compatible endpoints, each with its models per routing category in
 * priority order and, optionally, their prices. A category's targets are every
 * upstream's models for it, upstreams in list order and each one's models in
 * its own order: the first is the router's pick, the rest its fallbacks.
 */

/** The routing categories, and `embedding`: the models `POST /v1/embeddings` may reach. */
export type ModelCategory = "general" | "reasoning" | "embedding"

export interface UpstreamConfig {
  readonly name: string
  /** Ends before `/chat/completions`, e.g. `https://api.openai.com/v1`. */
  readonly baseUrl: string
  readonly apiKey: Option.Option<Redacted.Redacted>
  readonly models: {
    readonly general: ReadonlyArray<string>
    readonly reasoning: ReadonlyArray<string>
    readonly embedding: ReadonlyArray<string>
  }
  /** Per-model prices, in `PRICE_TABLE`'s shape; they override the table's. */
  readonly prices: Readonly<Record<string, ModelPrice>>
}

/** One model of one upstream: what a breaker guards and an attempt names (`upstream/model`). */
export interface Target {
  readonly id: string
  readonly upstream: string
  readonly model: string
}

/** The name `UPSTREAM_BASE_URL`'s one upstream goes by. */
export const SHORTHAND_NAME = "upstream"

const Name = Schema.String.pipe(
  Schema.pattern(/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/, {
    message: () => "must be 1 to 63 letters, digits, '.', '_' or '-' (it names the upstream in logs and metrics)"
  })
)
const BaseUrl = Schema.String.pipe(
  Schema.filter((url) => URL.canParse(url) && /^https?:$/.test(new URL(url).protocol), {
    message: () => "must be an http(s) URL, e.g. https://api.openai.com/v1"
  })
)
const ModelList = Schema.Array(
  Schema.NonEmptyTrimmedString.annotations({ message: () => "a model id must be a non-empty string" })
)

const UpstreamJson = Schema.Struct({
  name: Name,
  base_url: BaseUrl,
  api_key: Schema.optional(Schema.String),
  models: Schema.Struct({
    general: Schema.optional(ModelList),
    reasoning: Schema.optional(ModelList),
    embedding: Schema.optional(ModelList)
  }),
  prices: Schema.optional(Schema.Record({ key: Schema.String, value: ModelPrice }))
})
const decodeEntry = Schema.decodeUnknownEither(UpstreamJson, { onExcessProperty: "error" })

/** The first issue of a failed decode, as `field.path: what is wrong`. */
const firstIssue = (error: ParseResult.ParseError): string => {
  const [issue] = ParseResult.ArrayFormatter.formatErrorSync(error)
  if (issue === undefined) return "is not valid"
  const path = issue.path.map(String).join(".")
  return path.length === 0 ? issue.message : `${path}: ${issue.message}`
}

const entryName = (index: number, value: unknown) => {
  const name = typeof value === "object" && value !== null && "name" in value
    ? (value as { name: unknown }).name
    : undefined
  return `UPSTREAMS entry ${index + 1}${typeof name === "string" ? ` (${JSON.stringify(name)})` : ""}`
}

/**
 * `UPSTREAMS` read, or the one line that says what is wrong with it: which
 * entry, which field. Names must be unique, each entry lists at least one
 * model (an entry may serve embeddings alone), both routing categories have
 * at least one target (`embedding` may have none: embeddings calls then fail),
 * and a model priced by two upstreams is priced alike (calls are billed by model).
 */
export const parseUpstreams = (json: string): Either.Either<ReadonlyArray<UpstreamConfig>, string> => {
  let raw: unknown
  try {
    raw = JSON.parse(json)
  } catch (cause) {
    return Either.left(`UPSTREAMS is not valid JSON: ${cause instanceof Error ? cause.message : String(cause)}`)
  }
  if (!Array.isArray(raw) || raw.length === 0) {
    return Either.left("UPSTREAMS must be a non-empty JSON array of upstreams")
  }
  const upstreams: Array<UpstreamConfig> = []
  const priced = new Map<string, { readonly by: string; readonly price: ModelPrice }>()
  for (const [index, value] of raw.entries()) {
    const where = entryName(index, value)
    const decoded = decodeEntry(value)
    if (Either.isLeft(decoded)) return Either.left(`${where}: ${firstIssue(decoded.left)}`)
    const entry = decoded.right
    if (upstreams.some((u) => u.name === entry.name)) {
      return Either.left(`${where}: name: another entry is already named ${entry.name}`)
    }
    const general = entry.models.general ?? []
    const reasoning = entry.models.reasoning ?? []
    const embedding = entry.models.embedding ?? []
    if (general.length + reasoning.length + embedding.length === 0) {
      return Either.left(`${where}: models: list at least one model under general or reasoning (or embedding)`)
    }
    for (
      const [category, list] of [["general", general], ["reasoning", reasoning], ["embedding", embedding]] as const
    ) {
      const twice = list.find((model, i) => list.indexOf(model) !== i)
      if (twice !== undefined) return Either.left(`${where}: models.${category}: ${twice} is listed twice`)
    }
    for (const [model, price] of Object.entries(entry.prices ?? {})) {
      const earlier = priced.get(model)
      if (earlier !== undefined && JSON.stringify(earlier.price) !== JSON.stringify(price)) {
        return Either.left(
          `${where}: prices.${model}: priced differently by ${earlier.by}; a model has one price (calls are billed by model)`
        )
      }
      priced.set(model, { by: entry.name, price })
    }
    upstreams.push({
      name: entry.name,
      baseUrl: entry.base_url,
      apiKey: entry.api_key === undefined || entry.api_key === ""
        ? Option.none()
        : Option.some(Redacted.make(entry.api_key)),
      models: { general, reasoning, embedding },
      prices: entry.prices ?? {}
    })
  }
  for (const category of ["general", "reasoning"] as const) {
    if (targetsOf(upstreams, category).length === 0) {
      return Either.left(`UPSTREAMS: no upstream lists a ${category} model; every routing category needs at least one`)
    }
  }
  return Either.right(upstreams)
}

/** `UPSTREAM_BASE_URL`, `UPSTREAM_API_KEY` and `UPSTREAM_MODEL_*`: a list of one. */
export const shorthandUpstream = (
  baseUrl: string,
  apiKey: Option.Option<Redacted.Redacted>,
  models: { readonly general: string; readonly reasoning: string; readonly embedding: string }
): UpstreamConfig => ({
  name: SHORTHAND_NAME,
  baseUrl,
  apiKey,
  models: { general: [models.general], reasoning: [models.reasoning], embedding: [models.embedding] },
  prices: {}
})

/** A category's targets in the order they are tried: upstreams in list order, each one's models in order. */
export const targetsOf = (upstreams: ReadonlyArray<UpstreamConfig>, category: ModelCategory): ReadonlyArray<Target> =>
  upstreams.flatMap((upstream) =>
    upstream.models[category].map((model) => ({ id: `${upstream.name}/${model}`, upstream: upstream.name, model }))
  )

/**
 * The targets a request for `model` may reach: its category's, when the
 * router picked that category's first model; otherwise (a router replaced in
 * tests, say) `model` alone, on the first upstream that lists it, else the first.
 * `embedding` has no router and one public model: always all its targets,
 * whatever `model` is, and none when no upstream lists an embedding model.
 */
export const targetsFor = (
  upstreams: ReadonlyArray<UpstreamConfig>,
  category: ModelCategory,
  model: string
): ReadonlyArray<Target> => {
  const targets = targetsOf(upstreams, category)
  if (category === "embedding" || targets[0]?.model === model) return targets
  const upstream = upstreams.find((u) => u.models.general.includes(model) || u.models.reasoning.includes(model)) ??
    upstreams[0]
  return upstream === undefined ? [] : [{ id: `${upstream.name}/${model}`, upstream: upstream.name, model }]
}

/** The price table with the upstreams' own prices in place of its entries for those models. */
export const withUpstreamPrices = (table: PriceTable, upstreams: ReadonlyArray<UpstreamConfig>): PriceTable => {
  const own = Object.assign({}, ...upstreams.map((u) => u.prices)) as Record<string, ModelPrice>
  return Object.keys(own).length === 0 ? table : { ...table, models: { ...table.models, ...own } }
}
