import * as FetchHttpClient from "@effect/platform/FetchHttpClient"
import * as HttpClient from "@effect/platform/HttpClient"
import * as HttpClientRequest from "@effect/platform/HttpClientRequest"
import { Clock, Context, Data, Duration, Effect, Layer, Option, Redacted, Ref, Schema } from "effect"
import { createHash } from "node:crypto"
import { AppConfig } from "../AppConfig.js"
import { SimulatedMyInvois } from "./SimulatedMyInvois.js"

/**
 * LHDN's MyInvois as nenas speaks to it (docs/api/e-invoices.md, "How submission works"). One client serves
 * both forms: the real API over HTTP (`MYINVOIS_BASE_URL`) and the built-in simulated MyInvois in this process,
 * which answers the same requests in the same shapes. The client logs in with the ERP system's client
 * credentials, keeps the access token until shortly before it expires (MyInvois allows 12 logins a minute),
 * and turns MyInvois' answers into the few outcomes the submission worker acts on.
 */

/** One error of a rejected or invalid document, as the Invoices API shows it. */
export interface EInvoiceError {
  readonly code: string
  readonly message: string
  readonly target: string | null
}

/**
 * Why a request did not do what it asked: `unavailable` (no answer, 5xx: try later), `throttled` (429, or
 * MyInvois' duplicate-submission answer: try after `retryAfterMs`), `refused` (MyInvois said no, for good,
 * with its code), `not_found`.
 */
export class MyInvoisFailure extends Data.TaggedError("MyInvoisFailure")<{
  readonly kind: "unavailable" | "throttled" | "refused" | "not_found"
  readonly status: number
  readonly code: string
  readonly message: string
  readonly retryAfterMs: number | null
}> {}

export interface SubmittedDocument {
  /** The document's number: MyInvois' `codeNumber`, its `internalId` later. */
  readonly codeNumber: string
  /** The document's JSON text exactly as its hash was taken. */
  readonly text: string
}

export interface SubmissionAnswer {
  /** Null when MyInvois rejected every document. */
  readonly submissionUid: string | null
  readonly accepted: ReadonlyArray<{ readonly codeNumber: string; readonly uuid: string }>
  readonly rejected: ReadonlyArray<{ readonly codeNumber: string; readonly errors: ReadonlyArray<EInvoiceError> }>
}

export type DocumentStatus = "Submitted" | "Valid" | "Invalid" | "Cancelled"

export interface DocumentState {
  readonly uuid: string
  readonly codeNumber: string
  readonly submissionUid: string | null
  readonly status: DocumentStatus
  readonly longId: string | null
  readonly validatedAt: Date | null
}

export interface EInvoicingShape {
  /** Which MyInvois this is, for logs and the docs' walkthrough. */
  readonly form: "myinvois" | "simulated"
  readonly submit: (
    documents: ReadonlyArray<SubmittedDocument>
  ) => Effect.Effect<SubmissionAnswer, MyInvoisFailure>
  /** Every document of a submission (all its pages). */
  readonly submission: (submissionUid: string) => Effect.Effect<ReadonlyArray<DocumentState>, MyInvoisFailure>
  /** A document's state and, when invalid, why. */
  readonly details: (
    uuid: string
  ) => Effect.Effect<DocumentState & { readonly errors: ReadonlyArray<EInvoiceError> }, MyInvoisFailure>
  readonly cancel: (uuid: string, reason: string) => Effect.Effect<void, MyInvoisFailure>
  /** The document of `codeNumber` issued at `issuedAt` submitted earlier, if MyInvois has one (not invalid). */
  readonly findByNumber: (
    codeNumber: string,
    issuedAt: Date
  ) => Effect.Effect<Option.Option<DocumentState>, MyInvoisFailure>
}

export class EInvoicing extends Context.Tag("nenas/EInvoicing")<EInvoicing, EInvoicingShape>() {}

/** MyInvois' documentHash: the SHA-256 of the document's bytes, in hex. */
export const documentHash = (text: string): string => createHash("sha256").update(text, "utf8").digest("hex")

/** One request as both forms take it. */
export interface WireRequest {
  readonly method: "GET" | "POST" | "PUT"
  readonly path: string
  readonly query?: Record<string, string> | undefined
  readonly form?: Record<string, string> | undefined
  readonly json?: unknown
  readonly token?: string | undefined
}

export interface WireResponse {
  readonly status: number
  readonly headers: Record<string, string>
  readonly body: unknown
}

/** Sends one request; fails only when no answer came (the network, a deadline). */
export type Transport = (request: WireRequest) => Effect.Effect<WireResponse, MyInvoisFailure>

const REQUEST_TIMEOUT = Duration.seconds(30)
/** A token is renewed this long before MyInvois says it expires. */
const RENEW_BEFORE_MS = 5 * 60 * 1000
const PAGE_SIZE = 100
/** Pages of one submission read at most (100 documents each): a submission holds at most 100. */
const MAX_PAGES = 10
/** Pages of a search read at most when looking a number up. */
const SEARCH_PAGES = 5

const unavailable = (message: string, status = 0, retryAfterMs: number | null = null) =>
  new MyInvoisFailure({ kind: "unavailable", status, code: "unavailable", message, retryAfterMs })

/** `Retry-After` in seconds or as an HTTP date, in milliseconds from `now`. */
export const retryAfterMs = (header: string | undefined, now: number): number | null => {
  if (header === undefined || header.trim() === "") return null
  const seconds = Number(header)
  if (Number.isFinite(seconds)) return Math.max(0, Math.round(seconds * 1000))
  const at = Date.parse(header)
  return Number.isNaN(at) ? null : Math.max(0, at - now)
}

const Token = Schema.Struct({ access_token: Schema.String, expires_in: Schema.Number })

/**
 * An error answer: the OAuth shape of a refused login (`{error, error_description}`), or MyInvois' error
 * object, which the API writes as `{code, message, target, details}` and the SDK as `{errorCode, error, …}`.
 */
const ErrorBody = Schema.Struct({
  error: Schema.optional(Schema.Union(
    Schema.String,
    Schema.Struct({
      code: Schema.optional(Schema.NullOr(Schema.String)),
      errorCode: Schema.optional(Schema.NullOr(Schema.String)),
      message: Schema.optional(Schema.NullOr(Schema.String)),
      error: Schema.optional(Schema.NullOr(Schema.String)),
      target: Schema.optional(Schema.NullOr(Schema.String)),
      details: Schema.optional(Schema.NullOr(Schema.Array(Schema.Unknown)))
    })
  )),
  error_description: Schema.optional(Schema.String)
})

const RejectedError = Schema.Struct({
  code: Schema.optional(Schema.NullOr(Schema.String)),
  message: Schema.optional(Schema.NullOr(Schema.String)),
  target: Schema.optional(Schema.NullOr(Schema.String)),
  propertyPath: Schema.optional(Schema.NullOr(Schema.String)),
  details: Schema.optional(Schema.NullOr(Schema.Array(Schema.Struct({
    code: Schema.optional(Schema.NullOr(Schema.String)),
    message: Schema.optional(Schema.NullOr(Schema.String)),
    target: Schema.optional(Schema.NullOr(Schema.String)),
    propertyPath: Schema.optional(Schema.NullOr(Schema.String))
  }))))
})

/** `submissionUid` is null when every document was rejected (the answer is still 202). */
const SubmitAnswer = Schema.Struct({
  submissionUid: Schema.NullOr(Schema.String),
  acceptedDocuments: Schema.Array(Schema.Struct({ uuid: Schema.String, invoiceCodeNumber: Schema.String })),
  rejectedDocuments: Schema.Array(Schema.Struct({ invoiceCodeNumber: Schema.String, error: RejectedError }))
})

const Status = Schema.Literal("Submitted", "Valid", "Invalid", "Cancelled")

const Summary = Schema.Struct({
  uuid: Schema.String,
  submissionUid: Schema.optional(Schema.NullOr(Schema.String)),
  /** Search Documents spells it so. */
  submissionUID: Schema.optional(Schema.NullOr(Schema.String)),
  longId: Schema.optional(Schema.NullOr(Schema.String)),
  internalId: Schema.String,
  status: Status,
  dateTimeValidated: Schema.optional(Schema.NullOr(Schema.String))
})

const SubmissionBody = Schema.Struct({
  submissionUid: Schema.String,
  documentCount: Schema.optional(Schema.Number),
  documentSummary: Schema.Array(Summary)
})

const StepError = Schema.Struct({
  propertyName: Schema.optional(Schema.NullOr(Schema.String)),
  propertyPath: Schema.optional(Schema.NullOr(Schema.String)),
  errorCode: Schema.optional(Schema.NullOr(Schema.String)),
  error: Schema.optional(Schema.NullOr(Schema.String)),
  innerError: Schema.optional(Schema.NullOr(Schema.Array(Schema.Unknown)))
})

const DetailsBody = Schema.Struct({
  ...Summary.fields,
  validationResults: Schema.optional(Schema.NullOr(Schema.Struct({
    status: Schema.optional(Schema.String),
    validationSteps: Schema.optional(Schema.NullOr(Schema.Array(Schema.Struct({
      status: Schema.optional(Schema.String),
      name: Schema.optional(Schema.String),
      error: Schema.optional(Schema.NullOr(StepError))
    }))))
  })))
})

const SearchBody = Schema.Struct({ result: Schema.Array(Summary) })

/** At most this many errors of one document are kept: MyInvois can report hundreds. */
const MAX_ERRORS = 50

const stateOf = (summary: typeof Summary.Type): DocumentState => ({
  uuid: summary.uuid,
  codeNumber: summary.internalId,
  submissionUid: summary.submissionUid ?? summary.submissionUID ?? null,
  status: summary.status,
  longId: summary.longId ?? null,
  validatedAt: summary.dateTimeValidated === undefined || summary.dateTimeValidated === null
    ? null
    : new Date(summary.dateTimeValidated)
})

const rejectedErrors = (error: typeof RejectedError.Type): ReadonlyArray<EInvoiceError> => {
  const details = (error.details ?? []).map((detail) => ({
    code: detail.code ?? error.code ?? "Error",
    message: detail.message ?? "",
    target: detail.propertyPath ?? detail.target ?? null
  }))
  const head = {
    code: error.code ?? "Error",
    message: error.message ?? "",
    target: error.propertyPath ?? error.target ?? null
  }
  return [head, ...details].slice(0, MAX_ERRORS)
}

const stepErrors = (body: typeof DetailsBody.Type): ReadonlyArray<EInvoiceError> =>
  (body.validationResults?.validationSteps ?? [])
    .filter((step) => step.status === "Invalid" && step.error !== undefined && step.error !== null)
    .flatMap((step) => {
      const error = step.error!
      const inner = (error.innerError ?? []).flatMap((item) => {
        const decoded = Schema.decodeUnknownOption(StepError)(item)
        return Option.isSome(decoded) ? [decoded.value] : []
      })
      return [error, ...inner].map((each) => ({
        code: each.errorCode ?? step.name ?? "Invalid",
        message: each.error ?? step.name ?? "",
        target: each.propertyPath ?? each.propertyName ?? null
      }))
    })
    .slice(0, MAX_ERRORS)

/** The client over a transport, with the token cached. */
export const makeClient = (
  transport: Transport,
  credentials: { readonly clientId: string; readonly clientSecret: Redacted.Redacted },
  form: EInvoicingShape["form"]
) =>
  Effect.gen(function*() {
    const token = yield* Ref.make<Option.Option<{ readonly value: string; readonly renewAt: number }>>(Option.none())
    const lock = yield* Effect.makeSemaphore(1)

    const failureOf = (response: WireResponse, now: number): MyInvoisFailure => {
      const decoded = Schema.decodeUnknownOption(ErrorBody)(response.body)
      const error = Option.isSome(decoded) ? decoded.value.error : undefined
      const code = typeof error === "string" ? error : error?.code ?? error?.errorCode ?? `HTTP ${response.status}`
      const message = typeof error === "string"
        ? (Option.isSome(decoded) ? decoded.value.error_description ?? error : error)
        : error?.message ?? error?.error ?? `MyInvois answered HTTP ${response.status}`
      const wait = retryAfterMs(response.headers["retry-after"], now)
      if (response.status === 429) {
        return new MyInvoisFailure({ kind: "throttled", status: 429, code, message, retryAfterMs: wait })
      }
      // A document sent again within MyInvois' duplicate window: wait as told, then look it up.
      if (response.status === 422) {
        return new MyInvoisFailure({ kind: "throttled", status: 422, code, message, retryAfterMs: wait })
      }
      if (response.status === 404) {
        return new MyInvoisFailure({ kind: "not_found", status: 404, code, message, retryAfterMs: null })
      }
      if (response.status >= 500 || response.status === 401 || response.status === 403) {
        return unavailable(`${code}: ${message}`, response.status, wait)
      }
      return new MyInvoisFailure({ kind: "refused", status: response.status, code, message, retryAfterMs: null })
    }

    const login = Effect.gen(function*() {
      const response = yield* transport({
        method: "POST",
        path: "/connect/token",
        form: {
          client_id: credentials.clientId,
          client_secret: Redacted.value(credentials.clientSecret),
          grant_type: "client_credentials",
          scope: "InvoicingAPI"
        }
      })
      const now = yield* Clock.currentTimeMillis
      if (response.status !== 200) return yield* Effect.fail(failureOf(response, now))
      const answer = yield* Schema.decodeUnknown(Token)(response.body).pipe(
        Effect.mapError(() => unavailable("MyInvois answered the login with an unreadable token", 200))
      )
      const renewAt = now + Math.max(answer.expires_in * 1000 - RENEW_BEFORE_MS, answer.expires_in * 500)
      yield* Ref.set(token, Option.some({ value: answer.access_token, renewAt }))
      return answer.access_token
    })

    const currentToken = lock.withPermits(1)(Effect.gen(function*() {
      const held = yield* Ref.get(token)
      const now = yield* Clock.currentTimeMillis
      if (Option.isSome(held) && held.value.renewAt > now) return held.value.value
      return yield* login
    }))

    /** One API request with the token; a 401 logs in again once (the token was revoked or expired early). */
    const api = (request: Omit<WireRequest, "token">) =>
      Effect.gen(function*() {
        const first = yield* transport({ ...request, token: yield* currentToken })
        if (first.status !== 401) return first
        yield* Ref.set(token, Option.none())
        return yield* transport({ ...request, token: yield* currentToken })
      })

    const expect = <A, I>(
      response: WireResponse,
      statuses: ReadonlyArray<number>,
      schema: Schema.Schema<A, I>
    ) =>
      Effect.gen(function*() {
        const now = yield* Clock.currentTimeMillis
        if (!statuses.includes(response.status)) return yield* Effect.fail(failureOf(response, now))
        return yield* Schema.decodeUnknown(schema)(response.body).pipe(
          Effect.mapError((error) =>
            unavailable(`MyInvois answered in an unexpected shape: ${error.message.slice(0, 300)}`, response.status)
          )
        )
      })

    const shape: EInvoicingShape = {
      form,
      submit: (documents) =>
        Effect.gen(function*() {
          const response = yield* api({
            method: "POST",
            path: "/api/v1.0/documentsubmissions",
            json: {
              documents: documents.map((document) => ({
                format: "JSON",
                document: Buffer.from(document.text, "utf8").toString("base64"),
                documentHash: documentHash(document.text),
                codeNumber: document.codeNumber
              }))
            }
          })
          const answer = yield* expect(response, [202], SubmitAnswer)
          return {
            submissionUid: answer.submissionUid,
            accepted: answer.acceptedDocuments.map((document) => ({
              codeNumber: document.invoiceCodeNumber,
              uuid: document.uuid
            })),
            rejected: answer.rejectedDocuments.map((document) => ({
              codeNumber: document.invoiceCodeNumber,
              errors: rejectedErrors(document.error)
            }))
          }
        }),
      submission: (submissionUid) =>
        Effect.gen(function*() {
          const states: Array<DocumentState> = []
          for (let page = 1; page <= MAX_PAGES; page++) {
            const response = yield* api({
              method: "GET",
              path: `/api/v1.0/documentsubmissions/${encodeURIComponent(submissionUid)}`,
              query: { pageNo: String(page), pageSize: String(PAGE_SIZE) }
            })
            const body = yield* expect(response, [200], SubmissionBody)
            states.push(...body.documentSummary.map(stateOf))
            if (body.documentSummary.length < PAGE_SIZE || states.length >= (body.documentCount ?? 0)) break
          }
          return states
        }),
      details: (uuid) =>
        Effect.gen(function*() {
          const response = yield* api({
            method: "GET",
            path: `/api/v1.0/documents/${encodeURIComponent(uuid)}/details`
          })
          const body = yield* expect(response, [200], DetailsBody)
          return { ...stateOf(body), errors: body.status === "Invalid" ? stepErrors(body) : [] }
        }),
      cancel: (uuid, reason) =>
        Effect.gen(function*() {
          const response = yield* api({
            method: "PUT",
            path: `/api/v1.0/documents/state/${encodeURIComponent(uuid)}/state`,
            json: { status: "cancelled", reason: reason.slice(0, 300) }
          })
          yield* expect(response, [200], Schema.Unknown)
        }),
      findByNumber: (codeNumber, issuedAt) =>
        Effect.gen(function*() {
          // MyInvois filters by issue (or submission) dates, not by number: a window around the issue time, its
          // pages read until the number turns up (at most SEARCH_PAGES; the search allows 12 requests a minute).
          const window = {
            issueDateFrom: new Date(issuedAt.getTime() - 60 * 60 * 1000).toISOString(),
            issueDateTo: new Date(issuedAt.getTime() + 60 * 60 * 1000).toISOString()
          }
          for (let page = 1; page <= SEARCH_PAGES; page++) {
            const response = yield* api({
              method: "GET",
              path: "/api/v1.0/documents/search",
              query: {
                ...window,
                invoiceDirection: "Sent",
                pageSize: String(PAGE_SIZE),
                pageNo: String(page),
                // The free-text search takes a number only without special characters.
                ...(/^[A-Za-z0-9]+$/.test(codeNumber) ? { searchQuery: codeNumber } : {})
              }
            })
            const body = yield* expect(response, [200], SearchBody)
            const found = body.result.find((summary) =>
              summary.internalId === codeNumber && summary.status !== "Invalid"
            )
            if (found !== undefined) return Option.some(stateOf(found))
            if (body.result.length < PAGE_SIZE) break
          }
          return Option.none()
        })
    }
    return shape
  })

/** An answer's JSON; text that is not JSON becomes an error the client reports. */
const parsed = (text: string): unknown => {
  if (text === "") return null
  try {
    return JSON.parse(text)
  } catch {
    return { error: { code: "Unreadable", message: text.slice(0, 300) } }
  }
}

/** The real API over HTTP: every request with a deadline, no answer being `unavailable`. */
const httpTransport = (baseUrl: string) =>
  Effect.map(HttpClient.HttpClient, (client): Transport => (request) => {
    const url = `${baseUrl}${request.path}`
    const base = request.method === "GET"
      ? HttpClientRequest.get(url)
      : request.method === "PUT"
      ? HttpClientRequest.put(url)
      : HttpClientRequest.post(url)
    const withQuery = request.query === undefined ? base : HttpClientRequest.setUrlParams(base, request.query)
    const withToken = request.token === undefined ? withQuery : HttpClientRequest.bearerToken(withQuery, request.token)
    const withBody = request.form !== undefined
      ? HttpClientRequest.bodyUrlParams(withToken, request.form)
      : request.json !== undefined
      ? HttpClientRequest.bodyUnsafeJson(withToken, request.json)
      : withToken
    return client.execute(HttpClientRequest.acceptJson(withBody)).pipe(
      Effect.flatMap((response) =>
        Effect.map(
          Effect.orElseSucceed(response.text, () => ""),
          (text): WireResponse => ({ status: response.status, headers: response.headers, body: parsed(text) })
        )
      ),
      Effect.scoped,
      Effect.timeoutFail({
        duration: REQUEST_TIMEOUT,
        onTimeout: () => unavailable(`MyInvois did not answer within ${Duration.format(REQUEST_TIMEOUT)}`)
      }),
      Effect.catchTag("RequestError", "ResponseError", (error) => Effect.fail(unavailable(error.message)))
    )
  })

/** The built-in simulated MyInvois as a transport: the same requests, answered in this process. */
export const simulatedTransport = (sim: SimulatedMyInvois): Transport => (request) =>
  Effect.sync(() => {
    const answer = routeSimulated(sim, request)
    return { status: answer.status, headers: answer.headers ?? {}, body: answer.body }
  })

const routeSimulated = (
  sim: SimulatedMyInvois,
  request: WireRequest
): { status: number; body: unknown; headers?: Record<string, string> } => {
  const path = request.path
  if (request.method === "POST" && path === "/connect/token") return sim.login(request.form ?? {})
  if (request.method === "POST" && path === "/api/v1.0/documentsubmissions") return sim.submit(request.json)
  if (request.method === "GET" && path === "/api/v1.0/documents/search") return sim.search(request.query ?? {})
  const submission = /^\/api\/v1\.0\/documentsubmissions\/([^/]+)$/.exec(path)
  if (request.method === "GET" && submission !== null) {
    return sim.submission(
      decodeURIComponent(submission[1]!),
      Number(request.query?.["pageNo"] ?? 1),
      Number(request.query?.["pageSize"] ?? PAGE_SIZE)
    )
  }
  const details = /^\/api\/v1\.0\/documents\/([^/]+)\/details$/.exec(path)
  if (request.method === "GET" && details !== null) return sim.details(decodeURIComponent(details[1]!))
  const state = /^\/api\/v1\.0\/documents\/state\/([^/]+)\/state$/.exec(path)
  if (request.method === "PUT" && state !== null) return sim.cancel(decodeURIComponent(state[1]!), request.json)
  return { status: 404, body: { error: { code: "NotFound", message: `No route ${request.method} ${path}` } } }
}

/** Simulated MyInvois' credentials: it takes any. */
const SIMULATED_CREDENTIALS = { clientId: "nenas-simulated", clientSecret: Redacted.make("simulated") }

/** The simulated MyInvois of this process, checking documents against the supplier's TIN. */
export const simulatedLayer = (options: { readonly validateAfterMs?: number } = {}) =>
  Layer.effect(
    EInvoicing,
    Effect.gen(function*() {
      const config = yield* AppConfig
      const clock = yield* Effect.clock
      const sim = new SimulatedMyInvois({
        issuerTin: config.supplier.tin ?? "",
        ...(options.validateAfterMs === undefined ? {} : { validateAfterMs: options.validateAfterMs }),
        now: () => new Date(clock.unsafeCurrentTimeMillis())
      })
      return yield* makeClient(simulatedTransport(sim), SIMULATED_CREDENTIALS, "simulated")
    })
  )

/** MyInvois from `MYINVOIS_*`, or the simulated one when `MYINVOIS_BASE_URL` is unset. */
export const EInvoicingLive = Layer.unwrapEffect(Effect.gen(function*() {
  const config = yield* AppConfig
  if (
    Option.isNone(config.myinvoisBaseUrl) || Option.isNone(config.myinvoisClientId) ||
    Option.isNone(config.myinvoisClientSecret)
  ) return simulatedLayer()
  const baseUrl = config.myinvoisBaseUrl.value
  const credentials = { clientId: config.myinvoisClientId.value, clientSecret: config.myinvoisClientSecret.value }
  return Layer.effect(
    EInvoicing,
    Effect.flatMap(httpTransport(baseUrl), (transport) => makeClient(transport, credentials, "myinvois"))
  ).pipe(Layer.provide(FetchHttpClient.layer))
}))
