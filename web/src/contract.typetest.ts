/**
 * The web client follows the contract: checked by `tsc -p web` (`npm run typecheck`),
 * never imported by the app, so never bundled. Each `@ts-expect-error` below must
 * be an error; were one to compile, tsc would fail on the unused directive.
 */
import type { Schema } from "effect"
import type { Balance as BalanceSchema } from "../../src/Billing/Api.js"
import type { ID_TYPES as SERVER_ID_TYPES, STATE_CODES as SERVER_STATE_CODES } from "../../src/Invoices/Api.js"
import type { ApiKeyRecord, UpdateApiKeyRequest } from "../../src/Keys/Api.js"
import {
  api,
  type ApiKey,
  type Balance,
  download,
  type IdType,
  type PathParams,
  type Payload,
  type Query,
  type Route,
  type Success,
  type UpdateKey
} from "./api"
import type { Routes } from "./contract"
import type { STATE_NAMES } from "./myinvois"
import { useApi } from "./session"

type Equals<A, B> = (<T>() => T extends A ? 1 : 2) extends (<T>() => T extends B ? 1 : 2) ? true : false
type Assert<T extends true> = T

/** The types printed from the contract's OpenAPI are the schemas' own encoded types. */
export type SameAsTheSchemas = [
  Assert<Equals<Success<"GET /dashboard/billing/balance">, Schema.Schema.Encoded<typeof BalanceSchema>>>,
  Assert<Equals<Balance, Schema.Schema.Encoded<typeof BalanceSchema>>>,
  Assert<Equals<ApiKey, Schema.Schema.Encoded<typeof ApiKeyRecord>>>,
  Assert<Equals<UpdateKey, Schema.Schema.Encoded<typeof UpdateApiKeyRequest>>>
]

/** The copies the bundle keeps of the server's lists: MyInvois' states, by code and name, and the ID types. */
export type SameAsTheServer = [
  Assert<Equals<typeof STATE_NAMES, typeof SERVER_STATE_CODES>>,
  Assert<Equals<IdType, typeof SERVER_ID_TYPES[number]>>
]

/** The encoded side, not the decoded one: defaults are optional when sent, numbers in a query are text. */
export type EncodedSide = [
  Assert<Equals<Payload<"POST /dashboard/api-keys">["environment"], "live" | "test" | undefined>>,
  Assert<Equals<Query<"GET /dashboard/logs">["page"], string | undefined>>,
  Assert<Equals<PathParams<"PATCH /dashboard/api-keys/{id}">, { readonly id: string }>>,
  Assert<Equals<Payload<"DELETE /dashboard/api-keys/{id}">, never>>,
  Assert<Equals<Success<"GET /dashboard/logs/export">, string>>
]

/** Keys are method and path, not the group that serves them. */
export type KeyScheme = [
  Assert<"GET /dashboard/api-keys" extends Route ? true : false>,
  Assert<"POST /dashboard/webhooks/{id}/deliveries/{delivery_id}/resend" extends Route ? true : false>,
  Assert<
    Equals<
      Extract<Route, `${string} /dashboard/logs${string}`>,
      "GET /dashboard/logs" | "GET /dashboard/logs/export" | "GET /dashboard/logs/{request_id}/conversation"
    >
  >,
  Assert<Equals<keyof Routes, Route>>
]

/** Calls the contract refuses; typed only (the function is never called). */
export const refused = (token: string) => {
  const caller = { token, account: null }
  // @ts-expect-error a path the contract does not have
  void api("GET /dashboard/api-key", { caller })
  // @ts-expect-error a method the path does not answer
  void api("PUT /dashboard/api-keys", { caller })
  // @ts-expect-error the path's own form, not the route's
  void api("/dashboard/api-keys", { caller })
  // @ts-expect-error a payload field the endpoint does not take
  void api("POST /dashboard/api-keys", { caller, json: { name: "backend", colour: "red" } })
  // @ts-expect-error a payload field of the wrong type
  void api("PATCH /dashboard/api-keys/{id}", { caller, path: { id: "key_1" }, json: { disabled: "yes" } })
  // @ts-expect-error a payload missing a required field
  void api("POST /dashboard/webhooks", { caller, json: { url: "https://example.com/hook" } })
  // @ts-expect-error a body where the endpoint takes none
  void api("DELETE /dashboard/api-keys/{id}", { caller, path: { id: "key_1" }, json: {} })
  // @ts-expect-error a payload left out
  void api("PUT /dashboard/billing/settings", { caller })
  // @ts-expect-error the path parameter left out
  void api("PATCH /dashboard/api-keys/{id}", { caller, json: {} })
  // @ts-expect-error a path parameter of another route
  void api("GET /dashboard/logs/{request_id}/conversation", { caller, path: { id: "req_1" } })
  // @ts-expect-error a query where the endpoint takes none
  void api("GET /dashboard/api-keys", { caller, query: { page: "1" } })
  // @ts-expect-error a query parameter the list does not take
  void api("GET /dashboard/logs", { caller, query: { colour: "red" } })
  // @ts-expect-error a query value outside its literals
  void api("GET /dashboard/logs", { caller, query: { status: "lost" } })
  // @ts-expect-error a CSV export is downloaded, not read as JSON
  void api("GET /dashboard/logs/export", { caller })
  // @ts-expect-error a JSON route is not an export
  void download("GET /dashboard/logs", { caller }, "logs.csv")
  // @ts-expect-error a field the success type lacks
  void api("GET /dashboard/api-keys", { caller }).then((list) => list.api_keys)
  // @ts-expect-error a field of the answer read with the wrong type
  void api("GET /dashboard/billing/balance", { caller }).then((balance): string => balance.balance_myr)
  // @ts-expect-error a member route called without naming who calls and for which account
  void api("GET /dashboard/api-keys", {})
  // @ts-expect-error the bare token: the account is named on every call
  void api("POST /dashboard/members/invitations", { token, json: { email: "siti@example.com", role: "viewer" } })
  // @ts-expect-error an export without its caller
  void download("GET /dashboard/audit-log/export", {}, "audit.csv")
  // @ts-expect-error a role the contract does not have
  void api("PATCH /dashboard/members/{id}", { caller, path: { id: "mem_1" }, json: { role: "superuser" } })
}

/** What pages may read; typed only (a hook outside a component is never called). */
export const refusedReads = () => {
  // @ts-expect-error only GET routes are read as a page loads
  useApi("POST /dashboard/api-keys")
  // @ts-expect-error a route with a path parameter needs it
  useApi("GET /dashboard/webhooks/{id}/deliveries")
  const [keys] = useApi("GET /dashboard/api-keys")
  // @ts-expect-error a field the key lacks
  return keys.data?.keys[0]?.secret
}
