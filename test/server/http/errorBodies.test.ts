import { HttpApi, HttpApiBuilder, HttpApiEndpoint, HttpApiGroup, HttpApiSchema } from "@effect/platform"
import { NodeHttpServer } from "@effect/platform-node"
import { expect, layer } from "@effect/vitest"
import { Effect, Layer, Schema } from "effect"
import { createServer } from "node:http"
import { createRequire } from "node:module"
import { AppConfig } from "../../../src/AppConfig.js"
import { freePort } from "../../../src/Database/EmbeddedPostgres.js"
import { errorClasses, wire } from "../../../src/Domain/Errors.js"
import { PipelineLive } from "../../../src/Http/Pipeline.js"
import { ERROR_TABLE } from "../../support/ErrorTable.js"
import { call, createKey, devToken } from "../../support/Http.js"
import { TestServer, TestServerLive } from "../../support/TestServer.js"

const SECRET = "db password is hunter2"

/** A tiny API behind the real error middleware: fails with any error by name, or dies. */
class WalkApi extends HttpApi.make("walk").add(
  HttpApiGroup.make("walk")
    .add(HttpApiEndpoint.get("fail")`/fail/${HttpApiSchema.param("tag", Schema.String)}`)
    .add(HttpApiEndpoint.get("die", "/die"))
) {}

const WalkLive = HttpApiBuilder.group(WalkApi, "walk", (handlers) =>
  handlers
    .handle("fail", ({ path }) => {
      const cls = errorClasses.find((c) => c._tag === path.tag)
      if (cls === undefined) return Effect.dieMessage(`no error ${path.tag}`)
      const retryAfter = path.tag === "RateLimitExceeded" ? { retry_after_seconds: 7 } : {}
      // The walk API declares no errors: the middleware must encode whatever arrives.
      return Effect.fail(new cls({ message: `walked ${path.tag}`, ...retryAfter })) as unknown as Effect.Effect<void>
    })
    .handle("die", () => Effect.die(new Error(SECRET))))

const WalkServer = Layer.unwrapEffect(Effect.map(Effect.promise(freePort), (port) =>
  HttpApiBuilder.serve().pipe(
    Layer.provide(PipelineLive),
    Layer.provide(HttpApiBuilder.api(WalkApi).pipe(Layer.provide(WalkLive))),
    Layer.provide(NodeHttpServer.layer(createServer, { port, host: "127.0.0.1" })),
    Layer.provide(AppConfig.layerWith({ dashboardUrl: "https://dash.test" })),
    Layer.merge(
      Layer.succeed(TestServer, {
        baseUrl: `http://127.0.0.1:${port}`,
        databaseUrl: "",
        clock: undefined as never,
        settled: Effect.void
      })
    )
  )))

const expectErrorShape = (reply: { headers: Headers; body: any }) => { // arbitrary JSON body
  expect(reply.body.type).toBe("error")
  expect(Object.keys(reply.body.error).sort()).toEqual(
    expect.arrayContaining(["action_url", "code", "guidance", "message", "param", "request_id", "retryable", "type"])
  )
  expect(reply.body.error.request_id).toMatch(/^req_/)
  expect(reply.headers.get("x-request-id")).toBe(reply.body.error.request_id)
  expect(reply.body.error.guidance.length).toBeGreaterThan(0)
}

layer(WalkServer, { excludeTestServices: true })("every error code through the error middleware", (it) => {
  it.effect.each(ERROR_TABLE)("%s", ([tag, code, status, type, retryable]) =>
    Effect.gen(function*() {
      const reply = yield* call("GET", `/fail/${tag}`)
      expect(reply.status).toBe(status)
      expectErrorShape(reply)
      expect(reply.body.error).toMatchObject({ code, type, retryable, message: `walked ${tag}`, param: null })
      const actionUrl = reply.body.error.action_url
      if (actionUrl !== null) expect(actionUrl).toMatch(/^https:\/\/dash\.test\//)
      if (tag === "RateLimitExceeded") {
        expect(reply.body.error.retry_after_seconds).toBe(7)
        expect(reply.headers.get("retry-after")).toBe("7")
      } else {
        expect(reply.body.error).not.toHaveProperty("retry_after_seconds")
      }
      // The wire schema endpoints declare decodes the body back into the tagged error.
      const cls = errorClasses.find((c) => c._tag === tag)
      if (cls === undefined) throw new Error(`no class ${tag}`)
      const decoded = yield* Schema.decodeUnknown(wire(cls))(reply.body)
      expect(decoded).toBeInstanceOf(cls)
      expect(decoded.message).toBe(`walked ${tag}`)
    }))

  it.effect("a defect answers 500 internal_error and tells the client nothing of it", () =>
    Effect.gen(function*() {
      const reply = yield* call("GET", "/die")
      expect(reply.status).toBe(500)
      expectErrorShape(reply)
      expect(reply.body.error).toMatchObject({ code: "internal_error", type: "api_error", retryable: true })
      expect(reply.text).not.toContain(SECRET)
      expect(reply.text).not.toMatch(/at .*\.ts:\d+/)
    }))

  it.effect("each request gets its own id", () =>
    Effect.gen(function*() {
      const a = yield* call("GET", "/fail/NotFound")
      const b = yield* call("GET", "/fail/NotFound")
      expect(a.body.error.request_id).not.toBe(b.body.error.request_id)
    }))
})

layer(TestServerLive(), { excludeTestServices: true })("the service's contract and errors", (it) => {
  it.effect("successes carry X-Request-Id too", () =>
    Effect.gen(function*() {
      const reply = yield* call("GET", "/healthz")
      expect(reply.status).toBe(200)
      expect(reply.body).toEqual({ status: "ok" })
      expect(reply.headers.get("x-request-id")).toMatch(/^req_/)
      const ready = yield* call("GET", "/readyz")
      expect(ready.status).toBe(200)
    }))

  it.effect("/openapi.json documents every endpoint of the spec and the spec's error body", () =>
    Effect.gen(function*() {
      const reply = yield* call("GET", "/openapi.json")
      expect(reply.status).toBe(200)
      const { paths, info } = reply.body
      expect(info.version).toBe("1.0.0")
      const operations = Object.entries(paths as Record<string, Record<string, unknown>>)
        .flatMap(([path, methods]) => Object.keys(methods).map((method) => `${method.toUpperCase()} ${path}`))
      expect(operations).toEqual(expect.arrayContaining([
        "POST /v1/responses",
        "POST /v1/chat/completions",
        "GET /v1/models",
        "POST /dashboard/api-keys",
        "GET /dashboard/api-keys",
        "DELETE /dashboard/api-keys/{id}",
        "POST /dashboard/billing/checkout",
        "GET /dashboard/billing/balance",
        "GET /dashboard/billing/transactions",
        "GET /dashboard/logs",
        "GET /dashboard/usage",
        "GET /dashboard/overview",
        "POST /billing/stripe/webhook"
      ]))
      const refs = JSON.stringify(paths["/v1/models"].get.responses["401"]).match(/#\/components\/schemas\/\w+/g) ?? []
      const bodies = refs.map((ref) => reply.body.components.schemas[ref.split("/").pop() ?? ""])
      const codes = bodies.map((body) => body.properties.error.properties.code.enum[0])
      expect(codes.sort()).toEqual(["authentication_error", "expired_api_key", "invalid_api_key", "revoked_api_key"])
      for (const body of bodies) {
        expect(body.required).toEqual(["type", "error"])
        expect(Object.keys(body.properties.error.properties)).toEqual(
          expect.arrayContaining(["request_id", "guidance", "retryable"])
        )
        expect(JSON.stringify(body)).not.toContain("_tag")
      }
    }))

  it.effect("/docs renders the OpenAPI document, reading Scalar's 3.4 MB bundle only then", () =>
    Effect.gen(function*() {
      const scalarLoaded = () =>
        Object.keys(createRequire(import.meta.url).cache).some((path) => path.endsWith("internal/httpApiScalar.js"))
      expect(scalarLoaded()).toBe(false)
      const reply = yield* call("GET", "/docs")
      expect(reply.status).toBe(200)
      expect(reply.headers.get("content-type")).toContain("text/html")
      expect(reply.text).toContain("nenas")
      expect(reply.text).toContain("Minified by jsDelivr")
      expect(scalarLoaded()).toBe(true)
    }))

  it.effect("an OpenAI field not implemented yet says not_implemented in the error shape, naming the field", () =>
    Effect.gen(function*() {
      const key = yield* createKey(yield* devToken("later@example.com"))
      const reply = yield* call("POST", "/v1/chat/completions", {
        token: key.full_key,
        json: { model: "svc/nenas-flash", messages: [{ role: "user", content: "hi" }], functions: [] }
      })
      expect(reply.status).toBe(400)
      expectErrorShape(reply)
      expect(reply.body.error.code).toBe("not_implemented")
      expect(reply.body.error.param).toBe("functions")
    }))
})
