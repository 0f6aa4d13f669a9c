import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { DashboardAuth } from "../Auth/Api.js"
import { InvalidRequest, NotFound, wire } from "../Domain/Errors.js"
import { allowRoles, EVERY_ROLE, Role } from "../Domain/Roles.js"
import { NoUrlParams } from "../Domain/Strict.js"
import { IdParam, InvitationList } from "../Members/Api.js"

export const AccountSummary = Schema.Struct({
  id: Schema.String,
  name: Schema.NullOr(Schema.String),
  /** Your role in it. */
  role: Role,
  member_id: Schema.String,
  /** The account your first sign-in opened: the one dashboard requests act on without `Nenas-Account`. */
  personal: Schema.Boolean
}).annotations({ identifier: "AccountSummary" })

export const AcceptedInvitation = Schema.Struct({ account: AccountSummary }).annotations({
  identifier: "AcceptedInvitation"
})

/** The signed-in person's own: the accounts they belong to and the invitations to their email. */
export class AccountsApi extends HttpApiGroup.make("accounts")
  .add(
    HttpApiEndpoint.get("list", "/dashboard/accounts")
      .setUrlParams(NoUrlParams)
      .addSuccess(Schema.Struct({ accounts: Schema.Array(AccountSummary) }))
      .annotate(
        OpenApi.Description,
        "The accounts you belong to, your personal one first; name one with `Nenas-Account`."
      )
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.get("invitations", "/dashboard/invitations")
      .setUrlParams(NoUrlParams)
      .addSuccess(InvitationList)
      .annotate(OpenApi.Description, "Open invitations to your email, from any account.")
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.post("accept")`/dashboard/invitations/${IdParam}/accept`
      .addSuccess(AcceptedInvitation)
      .addError(wire(NotFound))
      .annotate(
        OpenApi.Description,
        "Joins the inviting account with the invitation's role; only the invited email may."
      )
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .addError(wire(InvalidRequest))
  .middleware(DashboardAuth)
  .annotate(OpenApi.Description, "Your accounts and your invitations, whichever account a request names.")
{}
