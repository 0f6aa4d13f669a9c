/**
 * A deterministic value valid against a JSON schema, for the simulated model's
 * tool arguments and structured answers: the first `enum`/`const`/`default`,
 * every property (required or not), bounds and lengths respected, the first
 * branch of `anyOf`/`oneOf`, `allOf` merged, local `$ref`s followed.
 */

type Schema = { readonly [key: string]: unknown }

const isSchema = (value: unknown): value is Schema =>
  typeof value === "object" && value !== null && !Array.isArray(value)

const FORMATS: Readonly<Record<string, string>> = {
  "date-time": "2026-01-01T00:00:00Z",
  date: "2026-01-01",
  time: "00:00:00Z",
  email: "user@example.com",
  uri: "https://example.com",
  url: "https://example.com",
  uuid: "00000000-0000-4000-8000-000000000000",
  hostname: "example.com",
  ipv4: "192.0.2.1",
  ipv6: "2001:db8::1"
}

/** Bounds on the work a caller's schema can ask for: lengths, items, and values in all. */
const MAX_LENGTH = 4096
const MAX_ITEMS = 64
const MAX_VALUES = 10_000

const num = (value: unknown): number | undefined =>
  typeof value === "number" && Number.isFinite(value) ? value : undefined

/** A number within the schema's bounds: 1 when allowed, else the lowest allowed. */
const numberFor = (schema: Schema, integer: boolean): number => {
  const min = num(schema["minimum"]) ??
    (num(schema["exclusiveMinimum"]) === undefined
      ? undefined
      : (num(schema["exclusiveMinimum"]) as number) + (integer ? 1 : 0.5))
  const max = num(schema["maximum"]) ??
    (num(schema["exclusiveMaximum"]) === undefined
      ? undefined
      : (num(schema["exclusiveMaximum"]) as number) - (integer ? 1 : 0.5))
  let value = 1
  if (min !== undefined && value < min) value = min
  if (max !== undefined && value > max) value = max
  if (integer) value = min !== undefined && Math.ceil(value) <= (max ?? Infinity) ? Math.ceil(value) : Math.floor(value)
  const step = num(schema["multipleOf"])
  if (step !== undefined && step > 0) value = Math.ceil(value / step) * step
  return value
}

const stringFor = (schema: Schema, name: string): string => {
  const format = typeof schema["format"] === "string" ? FORMATS[schema["format"]] : undefined
  let value = format ?? (name.length > 0 ? `example ${name}` : "example")
  const min = Math.min(num(schema["minLength"]) ?? 0, MAX_LENGTH)
  const max = num(schema["maxLength"])
  if (value.length < min) value += "x".repeat(min - value.length)
  if (max !== undefined && value.length > max) value = value.slice(0, max)
  return value
}

const resolve = (schema: Schema, root: Schema): Schema => {
  const ref = schema["$ref"]
  if (typeof ref !== "string" || !ref.startsWith("#")) return schema
  let target: unknown = root
  for (const segment of ref.slice(1).split("/").filter((s) => s.length > 0)) {
    target = isSchema(target) ? target[decodeURIComponent(segment.replace(/~1/g, "/").replace(/~0/g, "~"))] : undefined
  }
  return isSchema(target) ? target : {}
}

interface Budget {
  values: number
}

const valueFor = (raw: unknown, root: Schema, name: string, depth: number, budget: Budget): unknown => {
  budget.values += 1
  if (!isSchema(raw) || depth > 16 || budget.values > MAX_VALUES) return null
  const schema = resolve(raw, root)
  if (schema !== raw) return valueFor(schema, root, name, depth + 1, budget)
  if ("const" in schema) return schema["const"]
  if (Array.isArray(schema["enum"]) && schema["enum"].length > 0) return schema["enum"][0]
  for (const key of ["anyOf", "oneOf"]) {
    const branches = schema[key]
    if (Array.isArray(branches) && branches.length > 0) {
      // A nullable field's first useful branch: not the null one.
      const chosen = branches.find((b) => !(isSchema(b) && b["type"] === "null")) ?? branches[0]
      return valueFor(chosen, root, name, depth + 1, budget)
    }
  }
  if (Array.isArray(schema["allOf"])) {
    const merged = schema["allOf"].reduce<Schema>((acc, part) => {
      const resolved = isSchema(part) ? resolve(part, root) : {}
      return {
        ...acc,
        ...resolved,
        properties: {
          ...(isSchema(acc["properties"]) ? acc["properties"] : {}),
          ...(isSchema(resolved["properties"]) ? resolved["properties"] : {})
        }
      }
    }, {})
    const { allOf: _allOf, ...rest } = schema
    return valueFor(
      {
        ...merged,
        ...rest,
        properties: { ...(merged["properties"] as Schema), ...(isSchema(rest["properties"]) ? rest["properties"] : {}) }
      },
      root,
      name,
      depth + 1,
      budget
    )
  }
  if ("default" in schema) return schema["default"]
  const types = Array.isArray(schema["type"]) ? schema["type"].filter((t) => t !== "null") : [schema["type"]]
  const type = types[0] ??
    (isSchema(schema["properties"]) ? "object" : schema["items"] !== undefined ? "array" : undefined)
  switch (type) {
    case "object": {
      const properties = isSchema(schema["properties"]) ? schema["properties"] : {}
      const value: Record<string, unknown> = {}
      for (const [key, property] of Object.entries(properties)) {
        value[key] = valueFor(property, root, key, depth + 1, budget)
      }
      return value
    }
    case "array": {
      const count = Math.min(Math.max(1, num(schema["minItems"]) ?? 1), MAX_ITEMS)
      const max = num(schema["maxItems"])
      const items = Array.isArray(schema["prefixItems"]) ? schema["prefixItems"] : undefined
      const length = max === undefined ? count : Math.min(count, max)
      return Array.from(
        { length: items?.length ?? length },
        (_, i) => valueFor(items?.[i] ?? schema["items"], root, name, depth + 1, budget)
      )
    }
    case "string":
      return stringFor(schema, name)
    case "integer":
      return numberFor(schema, true)
    case "number":
      return numberFor(schema, false)
    case "boolean":
      return true
    case "null":
      return null
    default:
      return schema["type"] === "null" || (Array.isArray(schema["type"]) && schema["type"].includes("null")) ? null : {}
  }
}

/** A value valid against `schema` (an object schema's value when the schema says nothing). */
export const exampleOf = (schema: unknown): unknown => {
  const root = isSchema(schema) ? schema : { type: "object" }
  return valueFor(root, root, "", 0, { values: 0 })
}
