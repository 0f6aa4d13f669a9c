/**
 * A company buyer's billing profile as `PUT /dashboard/billing/profile` takes it (docs/api/invoices.md, "The
 * billing profile"): with a TIN, its documents get e-invoices of their own (docs/api/e-invoices.md, "Who gets
 * what").
 */
export const COMPANY_PROFILE = {
  legal_name: "Contoh Teknologi Sdn. Bhd.",
  tin: "C1234567890",
  id_type: "BRN",
  id_value: "201901234567",
  sst_number: null,
  email: "finance@example.my",
  phone: "+60312345678",
  address: { line1: "Level 5, Menara Contoh", city: "Kuala Lumpur", postcode: "50450", state_code: "14" }
} as const

/** A TIN the simulated MyInvois reports as not registered with LHDN: its documents come back invalid. */
export const UNREGISTERED_TIN = "C99999999990"
