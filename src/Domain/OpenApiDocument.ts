/**
 * What the OpenAPI document says beyond the schemas (`OpenApi.Transform` on an endpoint or the API): a
 * header the server reads by hand, a streamed answer, an error body written by path. A client generated
 * from `/openapi.json` must accept every real answer and send what the server needs.
 */

type Json = Record<string, unknown>

const recordAt = (node: Json, key: string): Json => {
  const value = node[key]
  return typeof value === "object" && value !== null && !Array.isArray(value) ? value as Json : {}
}

/** An OpenAPI header parameter. */
export interface HeaderParameter {
  readonly name: string
  readonly required: boolean
  readonly description: string
}

/** The operation also reads `header` (one the server checks itself, so no schema declares it). */
export const withHeader = (header: HeaderParameter) => (operation: Json): Json => {
  const parameters = Array.isArray(operation["parameters"]) ? operation["parameters"] as ReadonlyArray<Json> : []
  if (parameters.some((p) => p["in"] === "header" && String(p["name"]).toLowerCase() === header.name.toLowerCase())) {
    return operation
  }
  const parameter = {
    name: header.name,
    in: "header",
    required: header.required,
    description: header.description,
    schema: { type: "string" }
  }
  return Object.assign({}, operation, { parameters: [...parameters, parameter] })
}

/** The operation's 200 is also `text/event-stream` (the body asks for `stream: true`): its events are described in prose. */
export const withEventStream = (description: string) => (operation: Json): Json => {
  const responses = recordAt(operation, "responses")
  const ok = recordAt(responses, "200")
  const content = Object.assign({}, recordAt(ok, "content"), {
    "text/event-stream": { schema: { type: "string", description } }
  })
  return Object.assign({}, operation, {
    responses: Object.assign({}, responses, { "200": Object.assign({}, ok, { content }) })
  })
}

/** Every error status of the operation answers `schemaName` (a component schema), not the error bodies its endpoint declares. */
export const withErrorBody = (schemaName: string) => (operation: Json): Json => {
  const responses = recordAt(operation, "responses")
  const out: Json = {}
  for (const [status, response] of Object.entries(responses)) {
    out[status] = Number(status) < 400 ? response : {
      description: recordAt(responses, status)["description"] ?? "Error",
      content: { "application/json": { schema: { $ref: `#/components/schemas/${schemaName}` } } }
    }
  }
  return Object.assign({}, operation, { responses: out })
}

/** Applies each transform in turn. */
export const documented = (...steps: ReadonlyArray<(operation: Json) => Json>) => (operation: Json): Json =>
  steps.reduce((current, step) => step(current), operation)
