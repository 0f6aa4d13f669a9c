import { Context, Effect, Layer } from "effect"
import { createServer, type IncomingMessage, type ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import { SANDBOX_SUPPLIER } from "../../src/AppConfig.js"
import { docDigestOf, hashOf } from "../../src/EInvoicing/Rules.js"
import {
  type Answer,
  errorBody,
  SimulatedMyInvois,
  type SimulatedOptions
} from "../../src/EInvoicing/SimulatedMyInvois.js"

/** A request the stand-in received, with the stand-in's time and what it answered (0: the connection was cut). */
export interface StandInRequest {
  readonly method: string
  readonly path: string
  readonly query: Readonly<Record<string, string>>
  readonly at: Date
  readonly status: number
}

/** A submission MyInvois took (answered 202): the code numbers it held. */
export interface StandInSubmission {
  readonly submissionUid: string | null
  readonly codeNumbers: ReadonlyArray<string>
  readonly at: Date
}

export interface MyInvoisStandInOptions extends Partial<Omit<SimulatedOptions, "now">> {}

/**
 * MyInvois' API on 127.0.0.1 for the real HTTP client (`MYINVOIS_BASE_URL`): one `SimulatedMyInvois` behind the
 * SDK's paths, each API call needing a bearer token the stand-in issued and that has not expired. Tests break it
 * (`outage`, `throttle`) and move its clock (`setNow`, `advance`) with the server's, for the 72-hour rules.
 */
export class MyInvoisStandIn extends Context.Tag("test/MyInvoisStandIn")<MyInvoisStandIn, {
  readonly url: string
  readonly sim: SimulatedMyInvois
  /** Every request, in order, outages and throttling included. */
  readonly requests: ReadonlyArray<StandInRequest>
  /** Every submission MyInvois took. */
  readonly submissions: ReadonlyArray<StandInSubmission>
  /** Tokens issued. */
  readonly logins: number
  /** While on, every request answers 503; with `reset`, its connection is cut instead. */
  readonly outage: (on: boolean, options?: { readonly reset?: boolean }) => void
  /** The next `count` API requests (not logins) answer 429 with `Retry-After: retryAfterSeconds`. */
  readonly throttle: (count: number, retryAfterSeconds: number) => void
  readonly now: () => Date
  readonly setNow: (at: Date) => void
  readonly advance: (ms: number) => void
  readonly close: () => Promise<void>
}>() {}

const readBody = (request: IncomingMessage) =>
  new Promise<string>((resolve, reject) => {
    const chunks: Array<Buffer> = []
    request.on("data", (chunk: Buffer) => chunks.push(chunk))
    request.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")))
    request.on("error", reject)
  })

const API = "/api/v1.0"

/** The API's routes, as the SDK writes them (a trailing slash on submissions too). */
const route = (
  sim: SimulatedMyInvois,
  method: string,
  path: string,
  query: Record<string, string>,
  body: string
): Answer => {
  const json = (): { ok: true; value: unknown } | { ok: false } => {
    try {
      return { ok: true, value: body === "" ? undefined : JSON.parse(body) }
    } catch {
      return { ok: false }
    }
  }
  const unreadable: Answer = {
    status: 400,
    body: errorBody("BadStructure", "The request body is not JSON", { target: "body" })
  }
  if (method === "POST" && (path === `${API}/documentsubmissions` || path === `${API}/documentsubmissions/`)) {
    const parsed = json()
    return parsed.ok ? sim.submit(parsed.value) : unreadable
  }
  if (method === "GET" && path === `${API}/documents/search`) return sim.search(query)
  const submission = new RegExp(`^${API.replace(".", "\\.")}/documentsubmissions/([^/]+)$`).exec(path)
  if (method === "GET" && submission !== null) {
    return sim.submission(
      decodeURIComponent(submission[1]!), // the pattern has one group
      query["pageNo"] === undefined ? undefined : Number(query["pageNo"]),
      query["pageSize"] === undefined ? undefined : Number(query["pageSize"])
    )
  }
  const details = new RegExp(`^${API.replace(".", "\\.")}/documents/([^/]+)/details$`).exec(path)
  if (method === "GET" && details !== null) return sim.details(decodeURIComponent(details[1]!)) // one group
  const state = new RegExp(`^${API.replace(".", "\\.")}/documents/state/([^/]+)/state$`).exec(path)
  if (method === "PUT" && state !== null) {
    const parsed = json()
    return parsed.ok ? sim.cancel(decodeURIComponent(state[1]!), parsed.value) : unreadable // one group
  }
  return { status: 404, body: errorBody("NotFound", `No API at ${method} ${path}`) }
}

/** The code numbers of a submission's body, as sent. */
const codeNumbersOf = (body: string): ReadonlyArray<string> => {
  try {
    const documents = (JSON.parse(body) as { documents?: ReadonlyArray<{ codeNumber?: unknown }> }).documents ?? []
    return documents.flatMap((document) => typeof document.codeNumber === "string" ? [document.codeNumber] : [])
  } catch {
    return []
  }
}

/** A stand-in on a random port of 127.0.0.1, closed with its scope. */
export const makeMyInvoisStandIn = (options: MyInvoisStandInOptions = {}) =>
  Effect.gen(function*() {
    let offsetMs = 0
    const now = () => new Date(Date.now() + offsetMs)
    const sim = new SimulatedMyInvois({
      issuerTin: options.issuerTin ?? SANDBOX_SUPPLIER.tin ?? "C25845632020",
      // Quick enough for tests that wait for validity; a test can ask for longer.
      validateAfterMs: options.validateAfterMs ?? 300,
      now,
      ...(options.credentials === undefined ? {} : { credentials: options.credentials }),
      ...(options.isRegisteredTin === undefined ? {} : { isRegisteredTin: options.isRegisteredTin })
    })
    const requests: Array<StandInRequest> = []
    const submissions: Array<StandInSubmission> = []
    let logins = 0
    let down: false | "503" | "reset" = false
    let throttled = 0
    let retryAfterSeconds = 0

    const answer = (request: IncomingMessage, response: ServerResponse, body: string) => {
      const url = new URL(request.url ?? "/", "http://127.0.0.1")
      const query = Object.fromEntries(url.searchParams)
      const method = request.method ?? "GET"
      const log = (status: number) => requests.push({ method, path: url.pathname, query, at: now(), status })
      const send = (reply: Answer) => {
        log(reply.status)
        response.writeHead(reply.status, {
          "content-type": "application/json; charset=utf-8",
          correlationId: `STANDIN-${requests.length}`,
          ...reply.headers
        })
        response.end(reply.body === undefined ? "" : JSON.stringify(reply.body))
      }
      if (down === "reset") {
        log(0)
        request.socket.destroy()
        return
      }
      if (down === "503") return send({ status: 503, body: errorBody("ServiceUnavailable", "MyInvois is unavailable") })
      if (method === "POST" && url.pathname === "/connect/token") {
        const reply = sim.login(Object.fromEntries(new URLSearchParams(body)))
        if (reply.status === 200) logins++
        return send(reply)
      }
      if (url.pathname.startsWith(`${API}/`)) {
        if (throttled > 0) {
          throttled--
          return send({
            status: 429,
            headers: {
              "Retry-After": String(retryAfterSeconds),
              "X-Rate-Limit-Reset": new Date(now().getTime() + retryAfterSeconds * 1000).toISOString()
            },
            body: errorBody("TooManyRequests", `Too many requests; retry after ${retryAfterSeconds} seconds`)
          })
        }
        const token = /^Bearer (.+)$/.exec(request.headers.authorization ?? "")?.[1]
        if (token === undefined || !sim.authenticates(token)) {
          return send({
            status: 401,
            body: errorBody("Unauthorized", "The access token is missing, not issued here or expired")
          })
        }
      }
      const reply = route(sim, method, url.pathname, query, body)
      if (method === "POST" && url.pathname.startsWith(`${API}/documentsubmissions`) && reply.status === 202) {
        const uid = (reply.body as { submissionUid: string | null }).submissionUid
        submissions.push({ submissionUid: uid, codeNumbers: codeNumbersOf(body), at: now() })
      }
      return send(reply)
    }

    const server = createServer((request, response) => {
      readBody(request).then((body) => answer(request, response, body), () => response.destroy())
    })
    const close = () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      })
    yield* Effect.acquireRelease(
      Effect.async<void>((resume) => {
        server.listen(0, "127.0.0.1", () => resume(Effect.void))
      }),
      () => Effect.promise(() => server.listening ? close() : Promise.resolve())
    )
    const { port } = server.address() as AddressInfo
    return {
      url: `http://127.0.0.1:${port}`,
      sim,
      requests,
      submissions,
      get logins() {
        return logins
      },
      outage: (on: boolean, outageOptions: { readonly reset?: boolean } = {}) => {
        down = !on ? false : outageOptions.reset === true ? "reset" : "503"
      },
      throttle: (count: number, seconds: number) => {
        throttled = count
        retryAfterSeconds = seconds
      },
      now,
      setNow: (at: Date) => {
        offsetMs = at.getTime() - Date.now()
      },
      advance: (ms: number) => {
        offsetMs += ms
      },
      close
    }
  })

/** The stand-in as a Layer; `options` as `SimulatedOptions` (issuer TIN, validation delay, credentials). */
export const myInvoisStandIn = (options: MyInvoisStandInOptions = {}) =>
  Layer.scoped(MyInvoisStandIn, makeMyInvoisStandIn(options))

/** The stand-in for the sandbox supplier (`SANDBOX_SUPPLIER`), any client id accepted. */
export const MyInvoisStandInLive = myInvoisStandIn()

/** What a hand-built document holds; amounts in sen. */
export interface SampleDocument {
  readonly number: string
  readonly typeCode?: "01" | "02" | "03" | "04"
  readonly version?: "1.0" | "1.1"
  readonly issuedAt: Date
  readonly supplierTin?: string
  readonly buyerTin?: string
  readonly lines?: ReadonlyArray<{ readonly netSen: number; readonly taxSen: number; readonly classification?: string }>
  /** What a note adjusts: the original's number and MyInvois UUID. */
  readonly references?: ReadonlyArray<{ readonly number: string; readonly uuid: string }>
}

const v = (value: string | number, attributes: Record<string, string> = {}) => [{ _: value, ...attributes }]
const myr = (sen: number) => v(sen / 100, { currencyID: "MYR" })

/**
 * A UBL JSON document built as the SDK's samples are (`1.0-Invoice-Sample.json`, its consolidated and note
 * samples), with totals that add up (SDK, "Mathematical Mappings"). A buyer of `EI00000000010` is the
 * consolidated e-invoice's general public.
 */
export const sampleDocument = (sample: SampleDocument): Record<string, unknown> => {
  const iso = sample.issuedAt.toISOString()
  const lines = sample.lines ?? [{ netSen: 1000, taxSen: 80 }]
  const net = lines.reduce((sum, line) => sum + line.netSen, 0)
  const tax = lines.reduce((sum, line) => sum + line.taxSen, 0)
  const buyerTin = sample.buyerTin ?? "C1234567890"
  const generalPublic = buyerTin === "EI00000000010"
  const address = [{
    CityName: v("Kuala Lumpur"),
    PostalZone: v("50480"),
    CountrySubentityCode: v("14"),
    AddressLine: [{ Line: v("Lot 66") }, { Line: v("Bangunan Merdeka") }],
    Country: [{ IdentificationCode: v("MYS", { listID: "ISO3166-1", listAgencyID: "6" }) }]
  }]
  const taxTotal = (netSen: number, taxSen: number) => [{
    TaxAmount: myr(taxSen),
    TaxSubtotal: [{
      TaxableAmount: myr(netSen),
      TaxAmount: myr(taxSen),
      TaxCategory: [{ ID: v("02"), TaxScheme: [{ ID: v("OTH", { schemeID: "UN/ECE 5153", schemeAgencyID: "6" }) }] }]
    }]
  }]
  const invoice = {
    ID: v(sample.number),
    IssueDate: v(iso.slice(0, 10)),
    IssueTime: v(`${iso.slice(11, 19)}Z`),
    InvoiceTypeCode: v(sample.typeCode ?? "01", { listVersionID: sample.version ?? "1.0" }),
    DocumentCurrencyCode: v("MYR"),
    TaxCurrencyCode: v("MYR"),
    ...(sample.references === undefined ? {} : {
      BillingReference: sample.references.map((reference) => ({
        InvoiceDocumentReference: [{ ID: v(reference.number), UUID: v(reference.uuid) }]
      }))
    }),
    AccountingSupplierParty: [{
      Party: [{
        IndustryClassificationCode: v("62099", { name: "Other information technology service activities" }),
        PartyIdentification: [
          { ID: v(sample.supplierTin ?? "C25845632020", { schemeID: "TIN" }) },
          { ID: v("201901234567", { schemeID: "BRN" }) },
          { ID: v("NA", { schemeID: "SST" }) },
          { ID: v("NA", { schemeID: "TTX" }) }
        ],
        PostalAddress: address,
        PartyLegalEntity: [{ RegistrationName: v("Supplier Sdn. Bhd.") }],
        Contact: [{ Telephone: v("+60312345678"), ElectronicMail: v("billing@supplier.my") }]
      }]
    }],
    AccountingCustomerParty: [{
      Party: [{
        PostalAddress: generalPublic
          ? [{
            CityName: v(""),
            PostalZone: v(""),
            CountrySubentityCode: v(""),
            AddressLine: [{ Line: v("NA") }],
            Country: [{ IdentificationCode: v("", { listID: "ISO3166-1", listAgencyID: "6" }) }]
          }]
          : address,
        PartyLegalEntity: [{ RegistrationName: v(generalPublic ? "General Public" : "Buyer Sdn. Bhd.") }],
        PartyIdentification: [
          { ID: v(buyerTin, { schemeID: "TIN" }) },
          { ID: v(generalPublic ? "NA" : "202001234567", { schemeID: "BRN" }) },
          { ID: v("NA", { schemeID: "SST" }) },
          { ID: v("NA", { schemeID: "TTX" }) }
        ],
        Contact: [{
          Telephone: v(generalPublic ? "NA" : "+60123456789"),
          ElectronicMail: v(generalPublic ? "NA" : "buyer@email.com")
        }]
      }]
    }],
    TaxTotal: taxTotal(net, tax),
    LegalMonetaryTotal: [{
      LineExtensionAmount: myr(net),
      TaxExclusiveAmount: myr(net),
      TaxInclusiveAmount: myr(net + tax),
      PayableAmount: myr(net + tax)
    }],
    InvoiceLine: lines.map((line, index) => ({
      ID: v(String(index + 1)),
      InvoicedQuantity: v(1, { unitCode: "C62" }),
      LineExtensionAmount: myr(line.netSen),
      TaxTotal: taxTotal(line.netSen, line.taxSen),
      Item: [{
        CommodityClassification: [{
          ItemClassificationCode: v(line.classification ?? (generalPublic ? "004" : "022"), { listID: "CLASS" })
        }],
        Description: v(generalPublic ? "Receipts 001 - 100" : "Prepaid credit")
      }],
      Price: [{ PriceAmount: myr(line.netSen) }],
      ItemPriceExtension: [{ Amount: myr(line.netSen) }]
    }))
  }
  return {
    _D: "urn:oasis:names:specification:ubl:schema:xsd:Invoice-2",
    _A: "urn:oasis:names:specification:ubl:schema:xsd:CommonAggregateComponents-2",
    _B: "urn:oasis:names:specification:ubl:schema:xsd:CommonBasicComponents-2",
    Invoice: [invoice]
  }
}

/**
 * The document with a version 1.1 enveloped signature whose document digest is right (SDK, "Signing a JSON
 * document", step 7). Its signature value and certificate are placeholders: the simulated MyInvois checks the digest.
 */
export const withSignature = (
  document: Record<string, unknown>,
  digest = docDigestOf(document)
): Record<string, unknown> => {
  const [invoice] = document["Invoice"] as Array<Record<string, unknown>>
  const sha256 = { _: "", Algorithm: "http://www.w3.org/2001/04/xmlenc#sha256" }
  const signature = {
    Id: "signature",
    Object: [{
      QualifyingProperties: [{
        Target: "signature",
        SignedProperties: [{
          Id: "id-xades-signed-props",
          SignedSignatureProperties: [{ SigningTime: v("2026-01-01T00:00:00Z") }]
        }]
      }]
    }],
    KeyInfo: [{
      X509Data: [{
        X509Certificate: v("MIIB"),
        X509SubjectName: v("CN=Supplier"),
        X509IssuerSerial: [{ X509IssuerName: v("CN=CA"), X509SerialNumber: v("1") }]
      }]
    }],
    SignatureValue: v("c2lnbmF0dXJl"),
    SignedInfo: [{
      SignatureMethod: [{ _: "", Algorithm: "http://www.w3.org/2001/04/xmldsig-more#rsa-sha256" }],
      Reference: [
        {
          Type: "http://uri.etsi.org/01903/v1.3.2#SignedProperties",
          URI: "#id-xades-signed-props",
          DigestMethod: [sha256],
          DigestValue: v("cHJvcHM=")
        },
        { Type: "", URI: "", DigestMethod: [sha256], DigestValue: v(digest) }
      ]
    }]
  }
  return {
    ...document,
    Invoice: [{
      ...invoice,
      UBLExtensions: [{
        UBLExtension: [{
          ExtensionURI: v("urn:oasis:names:specification:ubl:dsig:enveloped:xades"),
          ExtensionContent: [{
            UBLDocumentSignatures: [{
              SignatureInformation: [{
                ID: v("urn:oasis:names:specification:ubl:signature:1"),
                ReferencedSignatureID: v("urn:oasis:names:specification:ubl:signature:Invoice"),
                Signature: [signature]
              }]
            }]
          }]
        }]
      }],
      Signature: [{
        ID: v("urn:oasis:names:specification:ubl:signature:Invoice"),
        SignatureMethod: v("urn:oasis:names:specification:ubl:dsig:enveloped:xades")
      }]
    }]
  }
}

/** One entry of a submission's `documents`, as the SDK's "Submit Documents" takes it. */
export const submissionEntry = (document: unknown, text = JSON.stringify(document)) => ({
  format: "JSON",
  document: Buffer.from(text, "utf8").toString("base64"),
  documentHash: hashOf(text),
  codeNumber: ((document as { Invoice: Array<{ ID: Array<{ _: string }> }> }).Invoice[0]!.ID[0]!._) // a sample has both
})
