import { describe, expect, it } from "@effect/vitest"
import { Either, Option, ParseResult, Schema } from "effect"
import { SANDBOX_SUPPLIER, supplierFrom } from "../../src/AppConfig.js"
import { BillingProfileInput, isTin } from "../../src/Invoices/Api.js"

/**
 * The billing profile's rules (docs/api/invoices.md, "The billing profile") and the supplier's configuration
 * (docs/operations.md, "Configuration"), as tables on the schema and the parser: no server.
 */

const VALID = {
  legal_name: "Contoh Teknologi Sdn. Bhd.",
  tin: "C1234567890",
  id_type: "BRN",
  id_value: "201901234567",
  sst_number: "W10-1808-32000001",
  email: "finance@example.my",
  phone: "012-345 6789",
  address: { line1: "Level 5, Menara Contoh", city: "Kuala Lumpur", postcode: "50450", state_code: "14" }
}

/** The path and message of the first problem, or "ok". */
const firstProblem = (input: unknown): string => {
  const decoded = Schema.decodeUnknownEither(BillingProfileInput)(input, { errors: "all" })
  if (Either.isRight(decoded)) return "ok"
  const [issue] = ParseResult.ArrayFormatter.formatErrorSync(decoded.left)
  return `${issue?.path.join(".")}: ${issue?.message}`
}

const withField = (path: ReadonlyArray<string>, value: unknown): unknown => {
  const copy = structuredClone(VALID) as Record<string, unknown>
  let target = copy
  for (const key of path.slice(0, -1)) target = target[key] as Record<string, unknown>
  const last = path[path.length - 1]!
  if (value === undefined) delete target[last]
  else target[last] = value
  return copy
}

describe("the billing profile", () => {
  it("a complete profile is taken; line2, sst_number and country_code default", () => {
    expect(firstProblem(VALID)).toBe("ok")
    const decoded = Schema.decodeUnknownSync(BillingProfileInput)(withField(["sst_number"], undefined))
    expect(decoded.sst_number).toBeNull()
    expect(decoded.address).toEqual({ ...VALID.address, line2: null, country_code: "MYS" })
  })

  const refused: ReadonlyArray<readonly [path: ReadonlyArray<string>, value: unknown, expected: RegExp]> = [
    [["legal_name"], "", /^legal_name: legal_name must not be empty/],
    [["legal_name"], "   ", /^legal_name: legal_name must not be empty/],
    [["legal_name"], "x".repeat(301), /^legal_name: legal_name must be at most 300/],
    [["legal_name"], "Contoh\u0000", /^legal_name: .*U\+0000/],
    [["legal_name"], "Contoh \uD800", /^legal_name: .*surrogate/],
    [["legal_name"], "x".repeat(10_000_000), /^legal_name: legal_name must be at most 300/],
    [["tin"], "123456789", /^tin: must be a MyInvois TIN/],
    [["tin"], "C01234567890", /^tin: must be a MyInvois TIN/], // a leading zero after the prefix
    [["tin"], "C123456789", /^tin: must be a MyInvois TIN/], // a company's TIN ends in 0
    [["tin"], "IG1150020001234", /^tin: must be a MyInvois TIN/], // 15 characters
    [["tin"], "EI00000000010", /^tin: must be a MyInvois TIN/], // the general public's TIN is not a buyer's
    [["id_type"], "SSM", /^id_type: must be one of BRN, NRIC, PASSPORT or ARMY/],
    [["id_value"], "20190123456", /^id_value: must be an SSM registration number/],
    [["sst_number"], "W10180832000001", /^sst_number: must be an SST registration number/],
    [["email"], "finance", /^email: must be an email address/],
    [["phone"], "12345", /^phone: must be a phone number/],
    [["phone"], "call me", /^phone: must be a phone number/],
    [["address", "state_code"], "18", /^address\.state_code: must be a MyInvois state code/],
    [["address", "state_code"], "17", /^address\.state_code: must name the state/],
    [["address", "postcode"], "5045", /^address\.postcode: must be 5 digits in Malaysia/],
    [["address", "country_code"], "MY", /^address\.country_code: must be an ISO 3166-1 alpha-3/],
    [["address", "city"], undefined, /^address\.city: is missing/]
  ]
  it.each(refused)("%j = %j is refused naming it", (path, value, expected) => {
    expect(firstProblem(withField(path, value))).toMatch(expected)
  })

  it("each identification is checked by its own form", () => {
    const cases: ReadonlyArray<readonly [string, string, boolean]> = [
      ["NRIC", "770625015324", true],
      ["NRIC", "770625-01-5324", false],
      ["PASSPORT", "A12345678", true],
      ["PASSPORT", "a1", false],
      ["ARMY", "5515", true],
      ["BRN", "123456-A", true]
    ]
    for (const [idType, idValue, ok] of cases) {
      const result = firstProblem({ ...VALID, id_type: idType, id_value: idValue })
      expect(result === "ok", `${idType} ${idValue}: ${result}`).toBe(ok)
    }
  })

  it("an address abroad takes its own postcode and state 17", () => {
    expect(firstProblem({
      ...VALID,
      tin: "EI00000000020",
      address: {
        line1: "1 Raffles Place",
        city: "Singapore",
        postcode: "048616",
        state_code: "17",
        country_code: "SGP"
      }
    })).toBe("ok")
  })

  it("TINs as MyInvois writes them", () => {
    for (const tin of ["IG115002000", "C25845632020", "C1234567890", "CS12345678900", "EI00000000020"]) {
      expect(isTin(tin), tin).toBe(true)
    }
    for (const tin of ["", "IG", "C0", "c25845632020", "OG115002000", "C2584563202"]) {
      expect(isTin(tin), tin).toBe(false)
    }
  })
})

const supplierVariables = (set: Partial<Record<string, string>>) => ({
  SUPPLIER_NAME: Option.fromNullable(set["SUPPLIER_NAME"]),
  SUPPLIER_TIN: Option.fromNullable(set["SUPPLIER_TIN"]),
  SUPPLIER_BRN: Option.fromNullable(set["SUPPLIER_BRN"]),
  SUPPLIER_SST_NUMBER: Option.fromNullable(set["SUPPLIER_SST_NUMBER"]),
  SUPPLIER_MSIC: Option.fromNullable(set["SUPPLIER_MSIC"]),
  SUPPLIER_ADDRESS: Option.fromNullable(set["SUPPLIER_ADDRESS"]),
  SUPPLIER_EMAIL: Option.fromNullable(set["SUPPLIER_EMAIL"]),
  SUPPLIER_PHONE: Option.fromNullable(set["SUPPLIER_PHONE"])
})

const OPERATOR = {
  SUPPLIER_NAME: "Nenas Digital Sdn. Bhd.",
  SUPPLIER_TIN: "C25845632020",
  SUPPLIER_BRN: "202401012345",
  SUPPLIER_MSIC: "62099",
  SUPPLIER_ADDRESS: JSON.stringify({
    line1: "1 Jalan Nenas",
    city: "Kuala Lumpur",
    postcode: "50000",
    state_code: "14"
  }),
  SUPPLIER_EMAIL: "billing@nenas.my",
  SUPPLIER_PHONE: "+60312345678"
}

describe("the supplier", () => {
  it("unset: the sandbox supplier, whose name says so (production refuses it: test/server/http/production.test.ts)", () => {
    const sandbox = supplierFrom(supplierVariables({}), 0)
    expect(sandbox).toEqual(Either.right({ supplier: SANDBOX_SUPPLIER, sandbox: true }))
    expect(SANDBOX_SUPPLIER.legal_name).toMatch(/sandbox.*not a real business/)
  })

  it("set: the operator; partly set, or with tax but no SST number, names what is missing", () => {
    const operator = supplierFrom(supplierVariables(OPERATOR), 0)
    expect(Either.isRight(operator) && operator.right.supplier.address?.country_code).toBe("MYS")
    expect(supplierFrom(supplierVariables({ ...OPERATOR, SUPPLIER_PHONE: undefined }), 0))
      .toEqual(Either.left("The supplier on invoices is incomplete; set SUPPLIER_PHONE"))
    expect(supplierFrom(supplierVariables(OPERATOR), 800))
      .toEqual(Either.left("The supplier on invoices is incomplete; set SUPPLIER_SST_NUMBER"))
    expect(supplierFrom(supplierVariables({ ...OPERATOR, SUPPLIER_TIN: "12345" }), 0))
      .toEqual(Either.left("SUPPLIER_TIN must be a MyInvois TIN (C25845632020, IG115002000)"))
    const badAddress = supplierFrom(supplierVariables({ ...OPERATOR, SUPPLIER_ADDRESS: "{\"line1\":\"x\"}" }), 0)
    expect(Either.isLeft(badAddress) && badAddress.left).toMatch(/^SUPPLIER_ADDRESS must be JSON/)
  })
})
