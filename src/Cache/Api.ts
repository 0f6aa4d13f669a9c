import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { DashboardAuth } from "../Auth/Api.js"
import { wire } from "../Domain/Errors.js"
import { InvalidRequest } from "../Domain/Errors.js"
import { ADMINS, allowRoles } from "../Domain/Roles.js"

export const CacheCleared = Schema.Struct({
  /** How many stored answers were dropped. */
  deleted: Schema.Int
}).annotations({ identifier: "CacheCleared" })

/** `DELETE /dashboard/cache` (docs/api/cache.md, "Emptying it"): owners and admins empty the account's cache. */
export class CacheApi extends HttpApiGroup.make("cache")
  .add(HttpApiEndpoint.del("clear", "/dashboard/cache").addSuccess(CacheCleared).pipe(allowRoles(...ADMINS)))
  .addError(wire(InvalidRequest))
  .middleware(DashboardAuth)
  .annotate(OpenApi.Description, "The response cache of the account: every instance forgets it within moments.")
{}
