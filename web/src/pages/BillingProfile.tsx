import { useEffect, useRef, useState } from "react"
import { Link } from "react-router"
import { ApiError, ID_TYPES, api, type BillingProfile, type BillingProfileInput, type IdType, type StateCode } from "../api"
import { useAccounts } from "../accounts"
import { DateTime, ErrorPanel, Field, Load, PageHeading } from "../components"
import { STATE_CODES, STATE_NAMES } from "../myinvois"
import { neededRoles } from "../roles"
import { useApi, useSession } from "../session"

/** The form's fields, as typed: the payload's, with the address's own beside them. */
interface Draft {
  readonly legal_name: string
  readonly tin: string
  readonly id_type: IdType
  readonly id_value: string
  readonly sst_number: string
  readonly email: string
  readonly phone: string
  readonly line1: string
  readonly line2: string
  readonly city: string
  readonly postcode: string
  readonly state_code: StateCode | ""
  readonly country_code: string
}
type FieldName = keyof Draft

const ID_TYPE_LABELS: Record<IdType, string> = {
  BRN: "Business registration (BRN)",
  NRIC: "MyKad (NRIC)",
  PASSPORT: "Passport",
  ARMY: "Army number"
}

/** What each identification looks like, as docs/api/invoices.md, "The billing profile" says. */
const ID_VALUE_HINTS: Record<IdType, string> = {
  BRN: "SSM's 12 digits (201901234567), or the old form (123456-A).",
  NRIC: "12 digits without dashes (770625015324).",
  PASSPORT: "6 to 12 capital letters and digits.",
  ARMY: "4 to 12 capital letters and digits."
}

const isStateCode = (code: string | undefined): code is StateCode => STATE_CODES.some((one) => one === code)

const draftOf = (profile: BillingProfile | null): Draft => ({
  legal_name: profile?.legal_name ?? "",
  tin: profile?.tin ?? "",
  id_type: profile?.id_type ?? "BRN",
  id_value: profile?.id_value ?? "",
  sst_number: profile?.sst_number ?? "",
  email: profile?.email ?? "",
  phone: profile?.phone ?? "",
  line1: profile?.address?.line1 ?? "",
  line2: profile?.address?.line2 ?? "",
  city: profile?.address?.city ?? "",
  postcode: profile?.address?.postcode ?? "",
  state_code: isStateCode(profile?.address?.state_code) ? profile.address.state_code : "",
  country_code: profile?.address?.country_code ?? "MYS"
})

/** The payload: the optional fields left empty are null (or, for the country, the service's default). */
const inputOf = (draft: Draft, stateCode: StateCode): BillingProfileInput => {
  const country = draft.country_code.trim()
  return {
    legal_name: draft.legal_name.trim(),
    tin: draft.tin.trim(),
    id_type: draft.id_type,
    id_value: draft.id_value.trim(),
    sst_number: draft.sst_number.trim() === "" ? null : draft.sst_number.trim(),
    email: draft.email.trim(),
    phone: draft.phone.trim(),
    address: {
      line1: draft.line1.trim(),
      line2: draft.line2.trim() === "" ? null : draft.line2.trim(),
      city: draft.city.trim(),
      postcode: draft.postcode.trim(),
      state_code: stateCode,
      ...(country === "" ? {} : { country_code: country })
    }
  }
}

const FIELDS: ReadonlyArray<FieldName> = [
  "legal_name",
  "tin",
  "id_type",
  "id_value",
  "sst_number",
  "email",
  "phone",
  "line1",
  "line2",
  "city",
  "postcode",
  "state_code",
  "country_code"
]

/** The field a 400's `param` names (`tin`, `address.postcode`); null when it names none of them (`address` itself). */
const fieldOf = (param: string | null): FieldName | null => {
  const name = param?.replace(/^address\./, "")
  return FIELDS.find((field) => field === name) ?? null
}

/** Why the last save failed: under the field the service named, or above the form. */
type Failure =
  | { readonly field: FieldName; readonly message: string }
  | { readonly field: null; readonly error: ApiError }

const ProfileForm = ({ profile, editable }: { profile: BillingProfile | null; editable: boolean }) => {
  const { caller } = useSession()
  const [draft, setDraft] = useState(() => draftOf(profile))
  const [updatedAt, setUpdatedAt] = useState(profile?.updated_at ?? null)
  const [busy, setBusy] = useState(false)
  const [failure, setFailure] = useState<Failure | null>(null)
  const [saved, setSaved] = useState(false)
  const form = useRef<HTMLFormElement>(null)

  // The field the service refused takes the focus, so its message is read with it.
  useEffect(() => {
    if (failure?.field) form.current?.querySelector<HTMLElement>("[aria-invalid=true]")?.focus()
  }, [failure])

  const set = <K extends FieldName>(field: K, value: Draft[K]) => {
    setDraft((current) => ({ ...current, [field]: value }))
    setSaved(false)
    if (failure?.field === field) setFailure(null)
  }
  // How to fill a field, for those who may.
  const hint = (text: string): string | undefined => editable ? text : undefined
  const errorFor = (field: FieldName): string | null => failure?.field === field ? failure.message : null
  const text = (field: Exclude<FieldName, "id_type" | "state_code">, extra: Record<string, string> = {}) =>
    (props: { id: string }) => (
      <input {...props} {...extra} readOnly={!editable} value={draft[field]} onChange={(e) => set(field, e.target.value)} />
    )

  const save = async () => {
    setFailure(null)
    setSaved(false)
    if (draft.state_code === "") {
      setFailure({ field: "state_code", message: "Choose the state (Not Applicable for an address outside Malaysia)." })
      return
    }
    setBusy(true)
    try {
      const answer = await api("PUT /dashboard/billing/profile", { caller, json: inputOf(draft, draft.state_code) })
      setDraft(draftOf(answer.profile))
      setUpdatedAt(answer.profile?.updated_at ?? null)
      setSaved(true)
    } catch (cause) {
      if (!(cause instanceof ApiError)) throw cause
      const field = cause.status === 400 ? fieldOf(cause.body.param) : null
      setFailure(field === null ? { field: null, error: cause } : { field, message: cause.body.message })
    } finally {
      setBusy(false)
    }
  }

  return (
    <form ref={form} className="card profile" aria-labelledby="profile-heading" noValidate onSubmit={(e) => {
      e.preventDefault()
      if (editable) void save()
    }}>
      <h2 id="profile-heading">The buyer</h2>
      <p className="note">
        {profile === null && updatedAt === null
          ? "Not set yet: documents name the account only, without a TIN."
          : <>Last saved <DateTime iso={updatedAt ?? ""} />.</>}
      </p>
      {failure?.field === null ? <ErrorPanel error={failure.error} /> : null}
      <fieldset>
        <legend>Identity</legend>
        <div className="form-grid">
          <Field label="Legal name" hint={hint("As registered with SSM, or as on the MyKad or passport.")} error={errorFor("legal_name")}>
            {text("legal_name", { autoComplete: "organization" })}
          </Field>
          <Field label="TIN" hint={hint("IG and 9 to 12 digits for a person; for a company its prefix and digits ending in 0 (C25845632020).")} error={errorFor("tin")}>
            {text("tin", { autoComplete: "off", spellCheck: "false" })}
          </Field>
          <Field label="ID type" error={errorFor("id_type")}>
            {(props) => (
              <select {...props} value={draft.id_type} disabled={!editable} onChange={(e) => set("id_type", ID_TYPES.find((one) => one === e.target.value) ?? "BRN")}>
                {ID_TYPES.map((one) => <option key={one} value={one}>{ID_TYPE_LABELS[one]}</option>)}
              </select>
            )}
          </Field>
          <Field label="ID number" hint={hint(ID_VALUE_HINTS[draft.id_type])} error={errorFor("id_value")}>
            {text("id_value", { autoComplete: "off", spellCheck: "false" })}
          </Field>
          <Field label="SST registration number" hint={hint("Optional: W10-1808-32000001.")} error={errorFor("sst_number")}>
            {text("sst_number", { autoComplete: "off", spellCheck: "false" })}
          </Field>
        </div>
      </fieldset>
      <fieldset>
        <legend>Contact</legend>
        <div className="form-grid">
          <Field label="Email" error={errorFor("email")}>
            {text("email", { type: "email", autoComplete: "email" })}
          </Field>
          <Field label="Phone" hint={hint("+60123456789 or 012-345 6789.")} error={errorFor("phone")}>
            {text("phone", { type: "tel", autoComplete: "tel" })}
          </Field>
        </div>
      </fieldset>
      <fieldset>
        <legend>Address</legend>
        <div className="form-grid">
          <Field label="Address line 1" error={errorFor("line1")}>
            {text("line1", { autoComplete: "address-line1" })}
          </Field>
          <Field label="Address line 2" hint={hint("Optional.")} error={errorFor("line2")}>
            {text("line2", { autoComplete: "address-line2" })}
          </Field>
          <Field label="City" error={errorFor("city")}>
            {text("city", { autoComplete: "address-level2" })}
          </Field>
          <Field label="Postcode" hint={hint("5 digits in Malaysia.")} error={errorFor("postcode")}>
            {text("postcode", { autoComplete: "postal-code", inputMode: "numeric" })}
          </Field>
          <Field label="State" error={errorFor("state_code")}>
            {(props) => (
              <select {...props} value={draft.state_code} disabled={!editable} onChange={(e) => set("state_code", STATE_CODES.find((one) => one === e.target.value) ?? "")}>
                <option value="" disabled>Choose a state</option>
                {STATE_CODES.map((code) => <option key={code} value={code}>{STATE_NAMES[code]}</option>)}
              </select>
            )}
          </Field>
          <Field label="Country" hint={hint("ISO 3166-1 alpha-3: MYS for Malaysia.")} error={errorFor("country_code")}>
            {text("country_code", { autoComplete: "off", spellCheck: "false" })}
          </Field>
        </div>
      </fieldset>
      {editable
        ? (
          <div className="actions">
            <button type="submit" disabled={busy} aria-busy={busy}>{busy ? "Saving…" : "Save the buyer's details"}</button>
            {saved ? <p role="status" className="saved">Saved</p> : null}
          </div>
        )
        : null}
    </form>
  )
}

/** The buyer's details that invoices carry (docs/api/invoices.md, "The billing profile"). */
export const BillingProfilePage = () => {
  const { can } = useAccounts()
  const editable = can("PUT /dashboard/billing/profile")
  const [loaded, reload] = useApi("GET /dashboard/billing/profile")
  return (
    <>
      <PageHeading title="Billing profile" />
      <p className="note">
        The buyer's details as MyInvois checks them. Invoices and notes issued from now on carry them; those already issued
        keep what they were issued with. <Link to="/invoices">See the invoices</Link>.
      </p>
      {editable ? null : <p className="note">Changing these needs the role {neededRoles("PUT /dashboard/billing/profile")} in this account.</p>}
      <Load value={loaded} what="the billing profile" retry={reload}>
        {(data) => <ProfileForm key={data.profile?.updated_at ?? "none"} profile={data.profile} editable={editable} />}
      </Load>
    </>
  )
}
