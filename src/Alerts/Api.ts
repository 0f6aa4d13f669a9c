import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as HttpApiSchema from "@effect/platform/HttpApiSchema"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { DashboardAuth } from "../Auth/Api.js"
import { InvalidRequest, NotFound, wire } from "../Domain/Errors.js"
import { allowRoles, EVERY_ROLE } from "../Domain/Roles.js"

export const Banner = Schema.Struct({
  kind: Schema.Literal("balance_low", "auto_topup_failed", "webhook_endpoint_disabled"),
  message: Schema.String,
  action_url: Schema.String
}).annotations({ identifier: "Banner" })

export class AlertsApi extends HttpApiGroup.make("alerts")
  .add(
    HttpApiEndpoint.get("banners", "/dashboard/alerts")
      .addSuccess(Schema.Struct({ banners: Schema.Array(Banner) }))
      .annotate(
        OpenApi.Description,
        "What the dashboard shows at its top: a low balance, a failed auto top-up, a disabled endpoint."
      )
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .addError(wire(InvalidRequest))
  .middleware(DashboardAuth)
  .annotate(OpenApi.Description, "What the dashboard alerts the signed-in developer to.")
{}

export const MailboxMessage = Schema.Struct({
  id: Schema.String,
  to: Schema.String,
  subject: Schema.String,
  body: Schema.String,
  status: Schema.Literal("pending", "sent", "kept", "failed"),
  created_at: Schema.String
}).annotations({ identifier: "MailboxMessage" })

const Html = HttpApiSchema.Text({ contentType: "text/html; charset=utf-8" })

/** The development mailbox (only while `SMTP_URL` is unset, never in production): what alert emails would have said. */
export class DevMailboxApi extends HttpApiGroup.make("devMailbox")
  .add(HttpApiEndpoint.get("page", "/dev/mailbox").addSuccess(Html))
  .add(
    HttpApiEndpoint.get("messages", "/dev/mailbox/messages").addSuccess(
      Schema.Struct({ messages: Schema.Array(MailboxMessage) })
    )
  )
  .addError(wire(NotFound))
  .annotate(OpenApi.Description, "Development only: emails kept instead of sent while SMTP_URL is unset.")
{}
