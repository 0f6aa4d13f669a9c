import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { ApiKeyAuth } from "../Auth/Api.js"
import { InternalError, InvalidRequest, NotFound, RateLimitExceeded, wire } from "../Domain/Errors.js"

const ResponsePath = Schema.Struct({ response_id: Schema.String })

/** A stored response as `POST /v1/responses` answered it, with `store`, `previous_response_id` and `instructions`. */
export const StoredResponseBody = Schema.Record({ key: Schema.String, value: Schema.Unknown }).annotations({
  identifier: "StoredResponse"
})

/** OpenAI's paging of a response's input items. */
export const InputItemsParams = Schema.Struct({
  after: Schema.optional(Schema.String),
  limit: Schema.optionalWith(Schema.NumberFromString.pipe(Schema.int(), Schema.between(1, 100)), { default: () => 20 }),
  order: Schema.optionalWith(Schema.Literal("asc", "desc"), { default: () => "desc" as const }),
  include: Schema.optional(Schema.Union(Schema.String, Schema.Array(Schema.String)))
})

export const InputItemsPage = Schema.Struct({
  object: Schema.Literal("list"),
  data: Schema.Array(Schema.Record({ key: Schema.String, value: Schema.Unknown })),
  first_id: Schema.NullOr(Schema.String),
  last_id: Schema.NullOr(Schema.String),
  has_more: Schema.Boolean
}).annotations({ identifier: "InputItemsPage" })

export const DeletedResponse = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("response"),
  deleted: Schema.Literal(true)
})

/** Stored responses (`store`, the default): read, list their input items, delete; any key of the account, 30 days (test keys: 24 hours). */
export class StoredResponsesApi extends HttpApiGroup.make("storedResponses")
  .add(
    HttpApiEndpoint.get("retrieve", "/v1/responses/:response_id").setPath(ResponsePath).addSuccess(StoredResponseBody)
  )
  .add(
    HttpApiEndpoint.get("inputItems", "/v1/responses/:response_id/input_items")
      .setPath(ResponsePath)
      .setUrlParams(InputItemsParams)
      .addSuccess(InputItemsPage)
  )
  .add(HttpApiEndpoint.del("remove", "/v1/responses/:response_id").setPath(ResponsePath).addSuccess(DeletedResponse))
  .addError(wire(InvalidRequest))
  .addError(wire(NotFound))
  .addError(wire(RateLimitExceeded))
  .addError(wire(InternalError))
  .middleware(ApiKeyAuth)
  .annotate(
    OpenApi.Description,
    "Stored responses: kept 30 days (a test key's 24 hours) unless created with `store: false`; another account's id answers 404."
  )
{}
