/**
 * Writes web/src/contract.ts: the routes the dashboard calls, as the service's
 * contract declares them (the OpenAPI document of `NenasApi`, which is what
 * /openapi.json serves), printed as TypeScript types of their JSON, and the
 * roles each allows (its `x-nenas-roles`) as the data `ROUTE_ROLES`.
 *
 * The types of an `HttpApiEndpoint` hold neither its path nor the encoded side
 * of its schemas, so the dashboard cannot derive them with `import type`; the
 * OpenAPI document has both. `npm run contract:web` writes the file;
 * `--check` (run by `npm run typecheck`) fails while it differs from the contract.
 */
import { OpenApi } from "@effect/platform"
import { JSONSchema } from "effect"
import { readFileSync, writeFileSync } from "node:fs"
import { fileURLToPath } from "node:url"
import { NenasApi } from "../src/Api.js"
import { ErrorBody } from "../src/Domain/Errors.js"

export const CONTRACT_FILE = fileURLToPath(new URL("src/contract.ts", import.meta.url))

/** The dashboard's API and the development sign-in. */
const INCLUDED = (path: string): boolean => path.startsWith("/dashboard/") || path === "/dev/session"

const METHODS = ["get", "post", "put", "patch", "delete"] as const

type Json = { readonly [key: string]: unknown }

const isObject = (value: unknown): value is Json => typeof value === "object" && value !== null && !Array.isArray(value)

const REF = /^#\/(?:components\/schemas|\$defs)\/(.+)$/

const IDENTIFIER = /^[A-Za-z_$][A-Za-z0-9_$]*$/
const key = (name: string): string => IDENTIFIER.test(name) ? name : JSON.stringify(name)

/** Prints JSON schemas as TypeScript types; a named schema becomes `Schemas["Name"]` unless it is a plain scalar. */
const printer = (definitions: Readonly<Record<string, Json>>) => {
  const named = new Set<string>()
  const printing = new Set<string>()

  const object = (fields: ReadonlyArray<string>, indent: string): string => {
    if (fields.length === 0) return "{}"
    const inline = `{ ${fields.join("; ")} }`
    if (inline.length <= 120 && !inline.includes("\n")) return inline
    return `{\n${fields.map((field) => `${indent}  ${field}`).join("\n")}\n${indent}}`
  }

  const print = (schema: unknown, indent: string): string => {
    if (!isObject(schema)) throw new Error(`not a schema: ${JSON.stringify(schema)}`)
    if (typeof schema["$ref"] === "string") {
      const name = REF.exec(schema["$ref"])?.[1]
      const target = name === undefined ? undefined : definitions[name]
      if (name === undefined || target === undefined) throw new Error(`unknown reference ${schema["$ref"]}`)
      // A recursive schema stays a reference.
      if (printing.has(name)) {
        named.add(name)
        return `Schemas[${JSON.stringify(name)}]`
      }
      printing.add(name)
      const printed = print(target, indent)
      printing.delete(name)
      if (!printed.includes("{") && !printed.includes("Schemas[")) return printed
      named.add(name)
      return `Schemas[${JSON.stringify(name)}]`
    }
    const members = schema["anyOf"] ?? schema["oneOf"]
    if (Array.isArray(members)) return [...new Set(members.map((member) => print(member, indent)))].join(" | ")
    if (Array.isArray(schema["allOf"])) return schema["allOf"].map((member) => print(member, indent)).join(" & ")
    if ("const" in schema) return JSON.stringify(schema["const"])
    if (Array.isArray(schema["enum"])) return schema["enum"].map((value) => JSON.stringify(value)).join(" | ")
    const type = schema["type"]
    if (Array.isArray(type)) return type.map((one) => print({ ...schema, type: one }, indent)).join(" | ")
    switch (type) {
      case "string":
        return "string"
      case "number":
      case "integer":
        return "number"
      case "boolean":
        return "boolean"
      case "null":
        return "null"
      case "array": {
        const prefix = schema["prefixItems"]
        if (Array.isArray(prefix)) {
          const rest = schema["items"] === undefined || schema["items"] === false
            ? []
            : [`...Array<${print(schema["items"], indent)}>`]
          return `readonly [${[...prefix.map((item) => print(item, indent)), ...rest].join(", ")}]`
        }
        return `ReadonlyArray<${schema["items"] === undefined ? "unknown" : print(schema["items"], indent)}>`
      }
      case "object": {
        const required = new Set(Array.isArray(schema["required"]) ? schema["required"] : [])
        const properties = isObject(schema["properties"]) ? schema["properties"] : {}
        const fields = Object.entries(properties).map(([name, field]) =>
          `readonly ${key(name)}${required.has(name) ? "" : "?"}: ${print(field, `${indent}  `)}`
        )
        const additional = schema["additionalProperties"]
        if (isObject(additional)) fields.push(`readonly [key: string]: ${print(additional, `${indent}  `)}`)
        return object(fields, indent)
      }
      case undefined:
        // `Schema.Unknown`, or a schema with no constraint at all.
        if (
          schema["$id"] === "/schemas/unknown" ||
          Object.keys(schema).every((name) => name === "description" || name === "title")
        ) {
          return "unknown"
        }
    }
    throw new Error(`cannot print the schema ${JSON.stringify(schema)}`)
  }

  return { print, named, object }
}

interface Parameter {
  readonly name: string
  readonly in: "path" | "query" | "header" | "cookie"
  readonly required?: boolean
  readonly schema: Json
}

interface Operation {
  /** The roles the endpoint allows (`allowRoles` in its contract); absent: it takes no session role. */
  readonly "x-nenas-roles"?: ReadonlyArray<string>
  readonly parameters?: ReadonlyArray<Parameter>
  readonly requestBody?: { readonly content: Readonly<Record<string, { readonly schema: Json }>> }
  readonly responses: Readonly<
    Record<string, { readonly content?: Readonly<Record<string, { readonly schema: Json }>> }>
  >
}

/** The source of web/src/contract.ts for the contract as it is now. */
export const contractSource = (): string => {
  const spec = OpenApi.fromApi(NenasApi) as unknown as {
    readonly paths: Readonly<Record<string, Readonly<Record<string, Operation>>>>
    readonly components: { readonly schemas: Readonly<Record<string, Json>> }
  }
  const errorBody = JSONSchema.make(ErrorBody) as unknown as { readonly $defs: Readonly<Record<string, Json>> }
  const definitions: Record<string, Json> = { ...spec.components.schemas }
  for (const [name, schema] of Object.entries(errorBody.$defs)) {
    const known = definitions[name]
    if (known !== undefined && JSON.stringify(known) !== JSON.stringify(schema)) {
      throw new Error(`two schemas named ${name}`)
    }
    definitions[name] = schema
  }
  const { print, named, object } = printer(definitions)

  const routes = Object.entries(spec.paths)
    .filter(([path]) => INCLUDED(path))
    .flatMap(([path, item]) =>
      METHODS.flatMap((method) => {
        const operation = item[method]
        return operation === undefined ? [] : [{ route: `${method.toUpperCase()} ${path}`, operation }]
      })
    )
    // Sorted by route, not by group: moving an endpoint to another group changes nothing here.
    .sort((a, b) => a.route < b.route ? -1 : a.route > b.route ? 1 : 0)

  const entries = routes.map(({ route, operation }) => {
    const lines: Array<string> = []
    for (const place of ["path", "query", "header"] as const) {
      const parameters = (operation.parameters ?? []).filter((parameter) => parameter.in === place)
      if (parameters.length === 0) continue
      const fields = parameters.map((p) =>
        `readonly ${key(p.name)}${p.required === true ? "" : "?"}: ${print(p.schema, "    ")}`
      )
      lines.push(`readonly ${place === "header" ? "headers" : place}: ${object(fields, "    ")}`)
    }
    if (operation.requestBody !== undefined) {
      const body = operation.requestBody.content["application/json"]
      if (body === undefined) throw new Error(`${route}: a request body that is not JSON`)
      lines.push(`readonly payload: ${print(body.schema, "    ")}`)
    }
    const successes = Object.entries(operation.responses).filter(([status]) => status.startsWith("2"))
    const bodies = successes.flatMap(([, response]) => Object.entries(response.content ?? {}))
    // A 204 (a deletion) answers no body: `void`, as the transport returns it.
    if (bodies.length === 0 && successes.every(([status]) => status === "204")) {
      lines.push("readonly success: void")
      return `  readonly ${JSON.stringify(route)}: {\n${lines.map((line) => `    ${line}`).join("\n")}\n  }`
    }
    if (bodies.length === 0) throw new Error(`${route}: no success body`)
    lines.push(
      `readonly success: ${
        [
          ...new Set(
            bodies.map(([media, body]) => media === "application/json" ? print(body.schema, "    ") : "string")
          )
        ].join(" | ")
      }`
    )
    // JSON unless said otherwise (a CSV export).
    const media = [...new Set(bodies.map(([media]) => media))]
    if (media.some((one) => one !== "application/json")) {
      lines.push(`readonly media: ${media.map((one) => JSON.stringify(one)).join(" | ")}`)
    }
    return `  readonly ${JSON.stringify(route)}: {\n${lines.map((line) => `    ${line}`).join("\n")}\n  }`
  })
  const errorType = print({ $ref: "#/$defs/ErrorBody" }, "")
  const roleLines = routes.flatMap(({ route, operation }) => {
    const roles = operation["x-nenas-roles"]
    return roles === undefined
      ? []
      : [`  ${JSON.stringify(route)}: [${roles.map((role) => JSON.stringify(role)).join(", ")}],`]
  })

  // Named schemas, printed until none refers to one not printed yet.
  const schemas = new Map<string, string>()
  for (let pending = [...named]; pending.length > 0; pending = [...named].filter((name) => !schemas.has(name))) {
    for (const name of pending) schemas.set(name, print(definitions[name], "  "))
  }
  const schemaLines = [...schemas.keys()].sort().map((name) => `  readonly ${key(name)}: ${schemas.get(name)}`)

  return [
    "// Generated by web/contract.ts from the service's contract (NenasApi's OpenAPI document): do not edit.",
    "// `npm run contract:web` writes it again; `npm run typecheck` fails while it is not what the contract says.",
    "",
    "/**",
    " * Each route the dashboard may call, keyed `METHOD /path` with `{name}` for a path parameter: its parameters,",
    " * its JSON as sent (`payload`) and answered (`success`), and `media` when the answer is not JSON.",
    " */",
    "export interface Routes {",
    entries.join("\n"),
    "}",
    "",
    "/** The contract's named schemas (components), as JSON. */",
    "export interface Schemas {",
    ...schemaLines,
    "}",
    "",
    "/** The body of every error answer. */",
    `export type ErrorBody = ${errorType}`,
    "",
    "/**",
    " * The roles each route allows (its `x-nenas-roles`): the service answers any other role 403 `permission_denied`.",
    " * The dashboard's one piece of runtime data from the contract, so that a page offers only what the role may do.",
    " */",
    "export const ROUTE_ROLES = {",
    ...roleLines,
    "} as const",
    ""
  ].join("\n")
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) {
  const source = contractSource()
  if (process.argv.includes("--check")) {
    let current = ""
    try {
      current = readFileSync(CONTRACT_FILE, "utf8")
    } catch {
      // Missing: reported below as out of date.
    }
    if (current !== source) {
      console.error(
        "web/src/contract.ts is not what the service's contract says: run `npm run contract:web`, then fix what `tsc -p web` reports."
      )
      process.exit(1)
    }
  } else {
    writeFileSync(CONTRACT_FILE, source)
  }
}
