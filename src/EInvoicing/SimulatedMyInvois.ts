import { createHash, randomBytes } from "node:crypto"
import {
  checkDocument,
  checkedAtSubmission,
  GENERAL_TINS,
  hashOf,
  type ValidationError,
  type Validator,
  validatorOf,
  VALIDATORS
} from "./Rules.js"

/**
 * An in-memory MyInvois (docs/api/e-invoices.md, "How submission works"): the API's requests and answers in
 * MyInvois' wire shapes (its SDK's "Submit Documents", "Get Submission", "Get Document Details", "Cancel
 * Document", "Search Documents", "Login as Taxpayer System"), so that an HTTP stand-in passes bodies straight
 * through. One taxpayer, `issuerTin`, is behind every client id. A document is `Submitted` until
 * `validateAfterMs` has passed on `now()`, then `Valid` (with a long id) or `Invalid` (with its validation steps).
 */

export interface SimulatedOptions {
  readonly issuerTin: string
  /** How long a document stays `Submitted` (default 2000 ms). */
  readonly validateAfterMs?: number
  readonly now?: () => Date
  /** The one client id and secret accepted; by default any non-empty pair is. */
  readonly credentials?: { readonly clientId: string; readonly clientSecret: string }
  /** Whether LHDN knows a TIN (its Taxpayer Validator); by default every TIN but one of nines, `C99999999990`. */
  readonly isRegisteredTin?: (tin: string) => boolean
}

export type DocumentStatus = "Submitted" | "Valid" | "Invalid" | "Cancelled"

export interface Answer {
  readonly status: number
  readonly body: unknown
  readonly headers?: Record<string, string>
}

interface Stored {
  readonly uuid: string
  readonly codeNumber: string
  readonly submissionUid: string
  readonly document: Record<string, unknown>
  readonly receivedAt: Date
  /** What the checks at validation will report (those of submission passed already). */
  readonly pending: ReadonlyArray<ValidationError>
  status: DocumentStatus
  longId: string | null
  validatedAt: Date | null
  errors: ReadonlyArray<ValidationError>
  cancelledAt: Date | null
  reason: string | null
}

interface Submission {
  readonly uid: string
  readonly receivedAt: Date
  readonly uuids: ReadonlyArray<string>
}

const TOKEN_LIFETIME_S = 3600
const MAX_DOCUMENTS = 100
const MAX_SUBMISSION_BYTES = 5 * 1024 * 1024
const MAX_DOCUMENT_BYTES = 300 * 1024
/** SDK, "Submit Documents": an identical submission within 10 minutes is refused. */
const DUPLICATE_SUBMISSION_MS = 10 * 60 * 1000
/** FAQ, "How does the system validate if a document is a duplicate?": within a 2-hour period. */
const DUPLICATE_DOCUMENT_MS = 2 * 60 * 60 * 1000
/** SDK, "Cancel Document": within 72 hours of validation. */
const CANCEL_WINDOW_MS = 72 * 60 * 60 * 1000
const MAX_PAGE_SIZE = 100
/** Documents the simulated MyInvois remembers; older ones are forgotten (a restart forgets them all). */
const MAX_KEPT = 10_000
/** SDK, "Search Documents": the date filters span at most 31 days. */
const MAX_SEARCH_SPAN_MS = 31 * 24 * 60 * 60 * 1000

const ALPHANUMERIC = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
/** MyInvois' ids: "26 Latin alphanumeric symbols". */
const randomId = (length: number) =>
  Array.from(randomBytes(length), (byte) => ALPHANUMERIC[byte % ALPHANUMERIC.length]).join("")

const base64Url = (value: unknown) => Buffer.from(JSON.stringify(value)).toString("base64url")

/** The TINs the simulated LHDN does not know: a prefix, nines, a final 0 (as test card numbers go). */
export const unregisteredTin = (tin: string): boolean => /^[A-Z]{1,2}9{8,12}0$/.test(tin)

/**
 * An error body with the SDK's fields ("Standard Error Response") and those the live API answers with
 * (`code`, `message`, `target`, `details`), so a client reading either finds the code.
 */
export const errorBody = (
  code: string,
  message: string,
  options: { readonly target?: string | null; readonly details?: ReadonlyArray<ValidationError> } = {}
) => ({
  error: {
    code,
    message,
    target: options.target ?? null,
    details: options.details?.map(detailOf) ?? null,
    propertyName: options.target ?? null,
    propertyPath: null,
    errorCode: code,
    error: message,
    errorMS: null,
    innerError: options.details ?? null
  }
})

const detailOf = (error: ValidationError) => ({
  code: error.errorCode,
  message: error.error,
  target: error.propertyName,
  propertyPath: error.propertyPath,
  details: null
})

const invalidRequest = (code: string, message: string, target?: string): Answer => ({
  status: 400,
  body: errorBody(code, message, { target: target ?? null })
})

const notFound = (what: string): Answer => ({ status: 404, body: errorBody("NotFound", `${what} was not found`) })

type Node = Record<string, unknown>
const first = (node: unknown, name: string): Node | undefined => {
  const value = (node as Node | undefined)?.[name]
  return Array.isArray(value) && typeof value[0] === "object" && value[0] !== null ? value[0] as Node : undefined
}
const path = (node: unknown, names: ReadonlyArray<string>) =>
  names.reduce<Node | undefined>((at, name) => first(at, name), node as Node)
const valueOf = (node: Node | undefined): unknown => node?.["_"]
const textAt = (node: unknown, names: ReadonlyArray<string>): string | null => {
  const value = valueOf(path(node, names))
  return typeof value === "string" ? value : null
}
const amountAt = (node: unknown, names: ReadonlyArray<string>): number => {
  const value = valueOf(path(node, names))
  return typeof value === "number" ? value : 0
}
const identification = (party: Node | undefined, schemes: ReadonlyArray<string>): string | null => {
  const ids = (party?.["PartyIdentification"] as Array<Node> | undefined) ?? []
  for (const id of ids) {
    const leaf = first(id, "ID")
    if (leaf !== undefined && schemes.includes(String(leaf["schemeID"])) && typeof leaf["_"] === "string") {
      return leaf["_"]
    }
  }
  return null
}

const TYPE_NAMES: Record<string, string> = {
  "01": "invoice",
  "02": "credit note",
  "03": "debit note",
  "04": "refund note"
}

const iso = (at: Date | null) => at === null ? null : `${at.toISOString().slice(0, 19)}Z`

const stepName = (validator: Validator) =>
  `Step${String(VALIDATORS.indexOf(validator) + 1).padStart(2, "0")}-${validator} Validator`
const stepCode = (validator: Validator) => `Error${String(VALIDATORS.indexOf(validator) + 1).padStart(2, "0")}`

export class SimulatedMyInvois {
  private readonly issuerTin: string
  private readonly validateAfterMs: number
  private readonly now: () => Date
  private readonly options: SimulatedOptions
  private readonly stored: Array<Stored> = []
  private readonly byUuid = new Map<string, Stored>()
  private readonly submissions = new Map<string, Submission>()
  /** Each accepted request body's hash, and when it came. */
  private readonly bodies = new Map<string, number>()
  private readonly tokens = new Map<string, number>()

  constructor(options: SimulatedOptions) {
    this.options = options
    this.issuerTin = options.issuerTin
    this.validateAfterMs = options.validateAfterMs ?? 2000
    this.now = options.now ?? (() => new Date())
  }

  /**
   * Keeps memory bounded in a long-running `npm start`: request bodies past the duplicate window, expired
   * tokens, and beyond `MAX_KEPT` documents the oldest (with their submissions) are forgotten.
   */
  private forgetOld(now: Date): void {
    for (const [key, at] of this.bodies) if (now.getTime() - at >= DUPLICATE_SUBMISSION_MS) this.bodies.delete(key)
    for (const [token, expires] of this.tokens) if (expires <= now.getTime()) this.tokens.delete(token)
    if (this.stored.length <= MAX_KEPT) return
    for (const dropped of this.stored.splice(0, this.stored.length - MAX_KEPT)) {
      this.byUuid.delete(dropped.uuid)
      this.submissions.delete(dropped.submissionUid)
    }
  }

  /** SDK, "Login as Taxpayer System": OAuth client credentials, a bearer token for an hour. */
  login(form: Record<string, string>): Answer {
    const oauth = (error: string, description: string): Answer => ({
      status: 400,
      body: { error, error_description: description }
    })
    const id = form["client_id"] ?? ""
    const secret = form["client_secret"] ?? ""
    if (form["grant_type"] !== "client_credentials") {
      return oauth("unsupported_grant_type", "grant_type must be client_credentials")
    }
    if (id === "" || secret === "") return oauth("invalid_request", "client_id and client_secret are required")
    const expected = this.options.credentials
    if (expected !== undefined && (expected.clientId !== id || expected.clientSecret !== secret)) {
      return oauth("invalid_client", "Invalid client credentials")
    }
    const issued = this.now().getTime()
    const payload = {
      name: `${this.issuerTin}::nenas`,
      client_id: id,
      iat: issued / 1000,
      exp: issued / 1000 + TOKEN_LIFETIME_S
    }
    const token = `${base64Url({ alg: "RS256", typ: "JWT" })}.${base64Url(payload)}.${randomId(43)}`
    this.tokens.set(token, issued + TOKEN_LIFETIME_S * 1000)
    return {
      status: 200,
      body: {
        access_token: token,
        token_type: "Bearer",
        expires_in: TOKEN_LIFETIME_S,
        scope: form["scope"] ?? "InvoicingAPI"
      }
    }
  }

  /** Whether `token` was issued here and has not expired. */
  authenticates(token: string): boolean {
    const expires = this.tokens.get(token)
    return expires !== undefined && expires > this.now().getTime()
  }

  /** SDK, "Submit Documents". */
  submit(body: unknown): Answer {
    const documents = (body as { readonly documents?: unknown } | null)?.documents
    if (typeof body !== "object" || body === null || !Array.isArray(documents) || documents.length === 0) {
      return invalidRequest(
        "BadStructure",
        "The submission must be {\"documents\": [...]} with at least one document",
        "documents"
      )
    }
    const malformed = documents.findIndex((entry) => !isEntry(entry))
    if (malformed >= 0) {
      return invalidRequest(
        "BadStructure",
        `documents[${malformed}] must have format, document, documentHash and codeNumber as text`,
        `documents[${malformed}]`
      )
    }
    const text = JSON.stringify(body)
    if (documents.length > MAX_DOCUMENTS || Buffer.byteLength(text) > MAX_SUBMISSION_BYTES) {
      return invalidRequest(
        "MaximumSizeExceeded",
        `A submission holds at most ${MAX_DOCUMENTS} documents and 5 MB; this has ${documents.length} and ${
          Buffer.byteLength(text)
        } bytes`,
        "documents"
      )
    }
    const now = this.now()
    const key = createHash("sha256").update(text).digest("hex")
    const seen = this.bodies.get(key)
    if (seen !== undefined && now.getTime() - seen < DUPLICATE_SUBMISSION_MS) {
      const seconds = Math.ceil((seen + DUPLICATE_SUBMISSION_MS - now.getTime()) / 1000)
      return {
        status: 422,
        headers: { "Retry-After": String(seconds) },
        body: errorBody(
          "DuplicateSubmission",
          `An identical submission was received within 10 minutes; retry after ${seconds} seconds`
        )
      }
    }
    this.forgetOld(now)
    this.bodies.set(key, now.getTime())
    const uid = randomId(26)
    const accepted: Array<{ uuid: string; invoiceCodeNumber: string }> = []
    const rejected: Array<{ invoiceCodeNumber: string; error: unknown }> = []
    for (const entry of documents as ReadonlyArray<Entry>) {
      const outcome = this.receive(entry, uid, now)
      if (outcome.kind === "accepted") accepted.push({ uuid: outcome.uuid, invoiceCodeNumber: entry.codeNumber })
      else rejected.push({ invoiceCodeNumber: entry.codeNumber, error: rejectionOf(entry.codeNumber, outcome.errors) })
    }
    if (accepted.length > 0) {
      this.submissions.set(uid, {
        uid,
        receivedAt: now,
        uuids: accepted.map((each) => each.uuid)
      })
    }
    return {
      status: 202,
      body: {
        submissionUid: accepted.length > 0 ? uid : null,
        acceptedDocuments: accepted,
        rejectedDocuments: rejected
      }
    }
  }

  /** SDK, "Get Submission": the documents of one submission, a page at a time. */
  submission(uid: string, pageNo = 1, pageSize = MAX_PAGE_SIZE): Answer {
    this.settle()
    const submission = this.submissions.get(uid)
    if (submission === undefined) return notFound(`Submission ${uid}`)
    if (!Number.isInteger(pageNo) || pageNo < 1) {
      return invalidRequest("BadArgument", "pageNo must be 1 or more", "pageNo")
    }
    if (!Number.isInteger(pageSize) || pageSize < 1 || pageSize > MAX_PAGE_SIZE) {
      return invalidRequest("BadArgument", `pageSize must be from 1 to ${MAX_PAGE_SIZE}`, "pageSize")
    }
    const documents = submission.uuids.map((uuid) => this.byUuid.get(uuid)!) // every uuid of a submission is stored
    const statuses = documents.map((document) => document.status)
    const overallStatus = statuses.includes("Submitted")
      ? "in progress"
      : statuses.every((status) => status === "Invalid")
      ? "invalid"
      : statuses.includes("Invalid")
      ? "partially valid"
      : "valid"
    return {
      status: 200,
      body: {
        submissionUid: uid,
        documentCount: documents.length,
        dateTimeReceived: iso(submission.receivedAt),
        overallStatus,
        documentSummary: documents.slice((pageNo - 1) * pageSize, pageNo * pageSize).map((document) =>
          this.summaryOf(document)
        )
      }
    }
  }

  /** SDK, "Get Document Details": the summary and every validation step's result. */
  details(uuid: string): Answer {
    this.settle()
    const document = this.byUuid.get(uuid)
    if (document === undefined) return notFound(`Document ${uuid}`)
    return { status: 200, body: { ...this.summaryOf(document), validationResults: validationResultsOf(document) } }
  }

  /** SDK, "Cancel Document": a valid document, within 72 hours of its validation, referenced by no valid note. */
  cancel(uuid: string, body: unknown): Answer {
    this.settle()
    const document = this.byUuid.get(uuid)
    if (document === undefined) return notFound(`Document ${uuid}`)
    const { status, reason } = (typeof body === "object" && body !== null ? body : {}) as {
      status?: unknown
      reason?: unknown
    }
    if (status !== "cancelled") return invalidRequest("BadArgument", "status must be \"cancelled\"", "status")
    if (typeof reason !== "string" || reason.trim() === "" || reason.length > 300) {
      return invalidRequest("BadArgument", "reason must be a text of 1 to 300 characters", "reason")
    }
    if (document.status !== "Valid") {
      return invalidRequest("IncorrectState", `A ${document.status} document cannot be cancelled`, uuid)
    }
    const now = this.now()
    if (now.getTime() - document.validatedAt!.getTime() > CANCEL_WINDOW_MS) { // a Valid document has its time
      return invalidRequest(
        "OperationPeriodOver",
        "The time limit for cancellation (72 hours from validation) has passed",
        uuid
      )
    }
    const referencing = this.stored.filter((note) =>
      note.status === "Valid" && referencesOf(note.document).includes(uuid)
    )
    if (referencing.length > 0) {
      return invalidRequest(
        "ActiveReferencingDocuments",
        `The document is referenced by ${referencing.map((note) => note.uuid).join(", ")}; cancel those first`,
        uuid
      )
    }
    document.status = "Cancelled"
    document.cancelledAt = now
    document.reason = reason
    return { status: 200, body: { uuid, status: "Cancelled" } }
  }

  /** SDK, "Search Documents": by submission or issue dates (at most 31 days), filtered and paged. */
  search(params: Record<string, string>): Answer {
    this.settle()
    const window = searchWindow(params)
    if ("status" in window) return window
    const pageSize = params["pageSize"] === undefined ? MAX_PAGE_SIZE : Number(params["pageSize"])
    const pageNo = params["pageNo"] === undefined ? 1 : Number(params["pageNo"])
    if (!Number.isInteger(pageSize) || pageSize < 1 || pageSize > MAX_PAGE_SIZE) {
      return invalidRequest("BadArgument", `pageSize must be from 1 to ${MAX_PAGE_SIZE}`, "pageSize")
    }
    if (!Number.isInteger(pageNo) || pageNo < 1) {
      return invalidRequest("BadArgument", "pageNo must be 1 or more", "pageNo")
    }
    const query = params["searchQuery"]
    if (query !== undefined && /[^A-Za-z0-9 .]/.test(query)) {
      return invalidRequest("BadArgument", "searchQuery cannot hold special characters", "searchQuery")
    }
    const found = this.stored.filter((document) => {
      const at = window.by === "submission" ? document.receivedAt : issuedAtOf(document.document)
      return at !== null && at >= window.from && at <= window.to && this.matches(document, params)
    })
    return {
      status: 200,
      body: {
        result: found.slice((pageNo - 1) * pageSize, pageNo * pageSize).map((document) =>
          this.searchResultOf(document)
        ),
        metadata: { totalPages: Math.ceil(found.length / pageSize), totalCount: found.length }
      }
    }
  }

  /** Every document accepted, for tests. */
  documents(): ReadonlyArray<{
    uuid: string
    codeNumber: string
    submissionUid: string
    longId: string | null
    status: string
    document: unknown
    receivedAt: Date
  }> {
    this.settle()
    return this.stored.map((document) => ({
      uuid: document.uuid,
      codeNumber: document.codeNumber,
      submissionUid: document.submissionUid,
      longId: document.longId,
      status: document.status,
      document: document.document,
      receivedAt: document.receivedAt
    }))
  }

  /** The checks of submission: the entry's encoding, hash and size, then the document's synchronous rules. */
  private receive(
    entry: Entry,
    uid: string,
    now: Date
  ): { kind: "accepted"; uuid: string } | { kind: "rejected"; errors: ReadonlyArray<ValidationError> } {
    const refuse = (errorCode: string, error: string, propertyName = "document") =>
      ({ kind: "rejected", errors: [{ propertyName, propertyPath: propertyName, errorCode, error }] }) as const
    if (entry.format !== "JSON") {
      return refuse("BadArgument", `The simulated MyInvois reads JSON documents, not ${entry.format}`, "format")
    }
    const text = Buffer.from(entry.document, "base64").toString("utf8")
    if (Buffer.from(text, "utf8").toString("base64").replace(/=+$/, "") !== entry.document.replace(/=+$/, "")) {
      return refuse("BadArgument", "document is not the base64 of a UTF-8 text")
    }
    if (Buffer.byteLength(text) > MAX_DOCUMENT_BYTES) {
      return refuse("MaximumSizeExceeded", `A document is at most 300 KB; this one is ${Buffer.byteLength(text)} bytes`)
    }
    if (entry.documentHash.toLowerCase() !== hashOf(text)) {
      return refuse(
        "BadArgument",
        `documentHash ${entry.documentHash} is not the SHA-256 of the document, ${hashOf(text)}`,
        "documentHash"
      )
    }
    let document: unknown
    try {
      document = JSON.parse(text)
    } catch {
      return refuse("NotUblJson", "The document is not JSON")
    }
    const errors = checkDocument(document, { issuerTin: this.issuerTin, now })
    const atSubmission = errors.filter(checkedAtSubmission)
    if (atSubmission.length > 0) return { kind: "rejected", errors: atSubmission }
    const id = textAt(document, ["Invoice", "ID"])
    if (id !== entry.codeNumber) {
      return refuse("BadArgument", `codeNumber ${entry.codeNumber} is not the document's ID, ${id}`, "codeNumber")
    }
    const uuid = randomId(26)
    const stored: Stored = {
      uuid,
      codeNumber: entry.codeNumber,
      submissionUid: uid,
      document: document as Record<string, unknown>,
      receivedAt: now,
      pending: errors,
      status: "Submitted",
      longId: null,
      validatedAt: null,
      errors: [],
      cancelledAt: null,
      reason: null
    }
    this.stored.push(stored)
    this.byUuid.set(uuid, stored)
    return { kind: "accepted", uuid }
  }

  /** Validates, in the order received, every document whose time has come. */
  private settle() {
    const now = this.now()
    for (const document of this.stored) {
      if (document.status !== "Submitted" || document.receivedAt.getTime() + this.validateAfterMs > now.getTime()) {
        continue
      }
      const errors = [
        ...document.pending,
        ...this.duplicateErrors(document),
        ...this.taxpayerErrors(document),
        ...this.referenceErrors(document)
      ]
      document.errors = errors
      document.validatedAt = now
      if (errors.length === 0) {
        document.status = "Valid"
        document.longId = randomId(40)
      } else document.status = "Invalid"
    }
  }

  /** FAQ: the same type and version, issuance, internal ID and supplier as one processed in the last 2 hours. */
  private duplicateErrors(document: Stored): ReadonlyArray<ValidationError> {
    const keyOf = (each: Stored) =>
      JSON.stringify([
        textAt(each.document, ["Invoice", "InvoiceTypeCode"]),
        path(each.document, ["Invoice", "InvoiceTypeCode"])?.["listVersionID"],
        textAt(each.document, ["Invoice", "IssueDate"]),
        textAt(each.document, ["Invoice", "IssueTime"]),
        each.codeNumber
      ])
    const key = keyOf(document)
    const earlier = this.stored.find((other) =>
      other !== document && (other.status === "Valid" || other.status === "Submitted") &&
      other.receivedAt <= document.receivedAt &&
      document.receivedAt.getTime() - other.receivedAt.getTime() <= DUPLICATE_DOCUMENT_MS &&
      this.stored.indexOf(other) < this.stored.indexOf(document) && keyOf(other) === key
    )
    if (earlier === undefined) return []
    return [{
      propertyName: "document",
      propertyPath: "document",
      errorCode: "DS302",
      error:
        `Duplicated submitted document with UUID ${document.uuid} where the values of configured attributes match with values for the document with UUID: ${earlier.uuid}`
    }]
  }

  /** The Taxpayer Validator: LHDN knows the supplier's and the buyer's TINs. */
  private taxpayerErrors(document: Stored): ReadonlyArray<ValidationError> {
    const known = this.options.isRegisteredTin ?? ((tin: string) => !unregisteredTin(tin))
    const general: ReadonlyArray<string> = Object.values(GENERAL_TINS)
    return (["AccountingSupplierParty", "AccountingCustomerParty"] as const).flatMap((role) => {
      const tin = identification(path(document.document, ["Invoice", role, "Party"]), ["TIN"])
      if (tin === null || general.includes(tin) || known(tin)) return []
      return [{
        propertyName: "ID",
        propertyPath: `$.Invoice[0].${role}[0].Party[0].PartyIdentification.ID[@schemeID='TIN']`,
        errorCode: "UnregisteredTin",
        error: `TIN ${tin} is not registered with LHDN`
      }]
    })
  }

  /** The Referenced Documents Validator: a note's originals are valid documents of this issuer. */
  private referenceErrors(document: Stored): ReadonlyArray<ValidationError> {
    if (textAt(document.document, ["Invoice", "InvoiceTypeCode"]) === "01") return []
    return referencesOf(document.document).flatMap((uuid) => {
      const original = this.byUuid.get(uuid)
      if (original !== undefined && original.status === "Valid") return []
      return [{
        propertyName: "UUID",
        propertyPath: "$.Invoice[0].BillingReference.InvoiceDocumentReference.UUID",
        errorCode: "ReferencedDocumentNotValid",
        error: `The referenced document ${uuid} is ${original === undefined ? "not known" : original.status}, not Valid`
      }]
    })
  }

  private matches(document: Stored, params: Record<string, string>): boolean {
    if (params["uuid"] !== undefined && params["uuid"] !== document.uuid) return false
    if (params["status"] !== undefined && params["status"] !== document.status) return false
    if (
      params["documentType"] !== undefined &&
      params["documentType"] !== textAt(document.document, ["Invoice", "InvoiceTypeCode"])
    ) return false
    // Every document here is the issuer's own: none is received.
    if (params["invoiceDirection"] === "Received") return false
    const query = params["searchQuery"]?.toLowerCase()
    if (query === undefined || query === "") return true
    const result = this.searchResultOf(document)
    return [
      result.uuid,
      result.buyerTIN,
      result.supplierTIN,
      result.buyerName,
      result.supplierName,
      result.internalId,
      String(result.total)
    ]
      .some((field) => field !== null && field.toLowerCase().includes(query))
  }

  private summaryOf(document: Stored) {
    const invoice = document.document
    const supplier = path(invoice, ["Invoice", "AccountingSupplierParty", "Party"])
    const buyer = path(invoice, ["Invoice", "AccountingCustomerParty", "Party"])
    const totals = ["Invoice", "LegalMonetaryTotal"]
    return {
      uuid: document.uuid,
      submissionUid: document.submissionUid,
      longId: document.longId,
      internalId: document.codeNumber,
      typeName: TYPE_NAMES[textAt(invoice, ["Invoice", "InvoiceTypeCode"]) ?? ""] ?? "invoice",
      typeVersionName: String(path(invoice, ["Invoice", "InvoiceTypeCode"])?.["listVersionID"] ?? ""),
      issuerTin: identification(supplier, ["TIN"]) ?? this.issuerTin,
      issuerName: textAt(supplier, ["PartyLegalEntity", "RegistrationName"]),
      receiverId: identification(buyer, ["BRN", "NRIC", "PASSPORT", "ARMY"]),
      receiverName: textAt(buyer, ["PartyLegalEntity", "RegistrationName"]),
      dateTimeIssued: iso(issuedAtOf(invoice)),
      dateTimeReceived: iso(document.receivedAt),
      dateTimeValidated: iso(document.validatedAt),
      totalExcludingTax: amountAt(invoice, [...totals, "TaxExclusiveAmount"]),
      totalDiscount: amountAt(invoice, [...totals, "AllowanceTotalAmount"]),
      totalNetAmount: amountAt(invoice, [...totals, "LineExtensionAmount"]),
      totalPayableAmount: amountAt(invoice, [...totals, "PayableAmount"]),
      status: document.status,
      cancelDateTime: iso(document.cancelledAt),
      rejectRequestDateTime: null,
      documentStatusReason: document.reason,
      createdByUserId: `${this.issuerTin}:nenas`
    }
  }

  /** Search's result names some fields differently from Get Submission's summary (SDK, "Search Documents"). */
  private searchResultOf(document: Stored) {
    const summary = this.summaryOf(document)
    const buyer = path(document.document, ["Invoice", "AccountingCustomerParty", "Party"])
    return {
      uuid: summary.uuid,
      submissionUID: summary.submissionUid,
      submissionUid: summary.submissionUid,
      longId: summary.longId,
      internalId: summary.internalId,
      typeName: summary.typeName,
      typeVersionName: summary.typeVersionName,
      issuerTin: summary.issuerTin,
      issuerName: summary.issuerName,
      receiverId: summary.receiverId,
      receiverName: summary.receiverName,
      dateTimeIssued: summary.dateTimeIssued,
      dateTimeReceived: summary.dateTimeReceived,
      dateTimeValidated: summary.dateTimeValidated,
      totalSales: summary.totalExcludingTax,
      totalDiscount: summary.totalDiscount,
      netAmount: summary.totalNetAmount,
      total: summary.totalPayableAmount,
      status: summary.status,
      cancelDateTime: summary.cancelDateTime,
      rejectRequestDateTime: null,
      documentStatusReason: summary.documentStatusReason,
      createdByUserId: summary.createdByUserId,
      supplierTIN: summary.issuerTin,
      supplierName: summary.issuerName,
      submissionChannel: "ERP",
      intermediaryName: null,
      intermediaryTin: null,
      intermediaryRob: null,
      buyerName: summary.receiverName,
      buyerTIN: identification(buyer, ["TIN"])
    }
  }
}

interface Entry {
  readonly format: string
  readonly document: string
  readonly documentHash: string
  readonly codeNumber: string
}

const isEntry = (entry: unknown): entry is Entry => {
  if (typeof entry !== "object" || entry === null) return false
  const fields = entry as Record<string, unknown>
  return ["format", "document", "documentHash", "codeNumber"].every((field) =>
    typeof fields[field] === "string" && fields[field] !== ""
  )
}

/** A rejected document's `error` as the live API writes it (code "3", "Validation Error", its details). */
const rejectionOf = (codeNumber: string, errors: ReadonlyArray<ValidationError>) => ({
  code: "3",
  message: "Validation Error",
  target: codeNumber,
  propertyPath: null,
  details: errors.map(detailOf),
  errorCode: "3",
  error: "Validation Error",
  innerError: errors
})

const validationResultsOf = (document: Stored) => {
  if (document.status === "Submitted") return { status: "Submitted", validationSteps: [] }
  const steps = VALIDATORS.map((validator) => {
    const errors = document.errors.filter((error) => validatorOf(error) === validator)
    return errors.length === 0
      ? { status: "Valid", name: stepName(validator) }
      : {
        status: "Invalid",
        name: stepName(validator),
        error: {
          propertyName: null,
          propertyPath: null,
          errorCode: stepCode(validator),
          error: `${validator} Validator`,
          innerError: errors
        }
      }
  })
  return { status: document.errors.length === 0 ? "Valid" : "Invalid", validationSteps: steps }
}

/** The MyInvois UUIDs a note's BillingReference names. */
const referencesOf = (document: unknown): ReadonlyArray<string> => {
  const invoice = first(document, "Invoice")
  const references = (invoice?.["BillingReference"] as Array<Node> | undefined) ?? []
  return references.flatMap((reference) => {
    const uuid = textAt(reference, ["InvoiceDocumentReference", "UUID"])
    return uuid === null ? [] : [uuid]
  })
}

const issuedAtOf = (document: unknown): Date | null => {
  const date = textAt(document, ["Invoice", "IssueDate"])
  const time = textAt(document, ["Invoice", "IssueTime"])
  const at = new Date(`${date}T${time}`)
  return date === null || time === null || Number.isNaN(at.getTime()) ? null : at
}

/** Search's date window: submission dates or issue dates, both ends, in order, at most 31 days. */
const searchWindow = (
  params: Record<string, string>
): Answer | { by: "submission" | "issue"; from: Date; to: Date } => {
  const pairs = [["submission", "submissionDateFrom", "submissionDateTo"], [
    "issue",
    "issueDateFrom",
    "issueDateTo"
  ]] as const
  for (const [by, fromName, toName] of pairs) {
    const fromText = params[fromName]
    const toText = params[toName]
    if (fromText === undefined && toText === undefined) continue
    if (fromText === undefined || toText === undefined) {
      return invalidRequest(
        "BadArgument",
        `${fromName} and ${toName} are given together`,
        fromText === undefined ? fromName : toName
      )
    }
    const from = new Date(fromText)
    const to = new Date(toText)
    if (Number.isNaN(from.getTime()) || Number.isNaN(to.getTime())) {
      return invalidRequest("BadArgument", `${fromName} and ${toName} must be UTC date-times`, fromName)
    }
    if (from >= to) return invalidRequest("BadArgument", `${fromName} must be before ${toName}`, fromName)
    if (to.getTime() - from.getTime() > MAX_SEARCH_SPAN_MS) {
      return invalidRequest("BadArgument", `${fromName} to ${toName} spans more than 31 days`, toName)
    }
    return { by, from, to }
  }
  return invalidRequest(
    "BadArgument",
    "submissionDateFrom and submissionDateTo, or issueDateFrom and issueDateTo, are required",
    "submissionDateFrom"
  )
}
