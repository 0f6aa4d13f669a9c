import { readdirSync, readFileSync, statSync } from "node:fs"
import { dirname, join, relative, resolve } from "node:path"
import { describe, expect, it } from "vitest"

/**
 * The layer order of `src/`, lowest first, written down once: a module may import
 * from its own room or from a room in an earlier layer. Rooms in one layer do not
 * import each other. The only import that runs up is an area's `Http.ts` (its
 * handlers) reading the composed contract in `src/Api.ts`.
 */
export const LAYERS: ReadonlyArray<ReadonlyArray<string>> = [
  ["Domain"],
  ["AppConfig"],
  ["Observability", "Request", "Database"],
  ["Routing", "Search", "Responses"],
  ["Providers"],
  ["Logs", "Outbox"],
  ["Wallet"],
  ["Accounts"],
  ["Auth"],
  ["Keys"],
  ["Billing", "Usage", "Health"],
  ["Alerts"],
  ["Models"],
  ["Api"],
  ["Http"],
  ["main"]
]

const SRC = resolve(import.meta.dirname, "../src")

const sourceFiles = (dir: string): ReadonlyArray<string> =>
  readdirSync(dir).flatMap((name) => {
    const path = join(dir, name)
    if (statSync(path).isDirectory()) return sourceFiles(path)
    return path.endsWith(".ts") ? [path] : []
  })

/** A file's room: its folder under `src/`, or its own name for a top-level file. */
const roomOf = (file: string): string => {
  const [first = "", ...rest] = relative(SRC, file).split("/")
  return rest.length === 0 ? first.replace(/\.ts$/, "") : first
}

const IMPORT = /(?:from|import)\s*\(?\s*"(\.{1,2}\/[^"]+)"/g

interface Arrow {
  readonly from: string
  readonly to: string
}

export const arrowsOf = (): ReadonlyArray<Arrow> =>
  sourceFiles(SRC).flatMap((file) =>
    [...readFileSync(file, "utf8").matchAll(IMPORT)].flatMap((match) => {
      const target = resolve(dirname(file), (match[1] ?? "").replace(/\.js$/, ".ts"))
      return target.startsWith(SRC + "/") ? [{ from: file, to: target }] : []
    })
  )

const layerOf = (room: string): number => LAYERS.findIndex((rooms) => rooms.includes(room))

/** The composition an area's handlers need: `X/Http.ts` implements the groups of `src/Api.ts`. */
const isHandlerComposition = (arrow: Arrow): boolean =>
  arrow.from.endsWith("/Http.ts") && relative(SRC, arrow.to) === "Api.ts"

describe("the dependency rule of src/", () => {
  const arrows = arrowsOf()
  const between = arrows.filter((arrow) => roomOf(arrow.from) !== roomOf(arrow.to) && !isHandlerComposition(arrow))

  it("names every room in exactly one layer", () => {
    const rooms = new Set(sourceFiles(SRC).map(roomOf))
    for (const room of rooms) expect(layerOf(room), `room ${room} is in no layer`).toBeGreaterThanOrEqual(0)
    expect(LAYERS.flat().length).toBe(new Set(LAYERS.flat()).size)
  })

  it("has no import that runs up or sideways, other than handlers reading the composed contract", () => {
    const upward = between
      .filter((arrow) => layerOf(roomOf(arrow.to)) >= layerOf(roomOf(arrow.from)))
      .map((arrow) => `${relative(SRC, arrow.from)} -> ${relative(SRC, arrow.to)}`)
    expect(upward).toEqual([])
  })

  it("has no pair of rooms that import each other", () => {
    const pairs = new Set(between.map((arrow) => `${roomOf(arrow.from)}>${roomOf(arrow.to)}`))
    const twoWay = [...pairs].filter((pair) => {
      const [a, b] = pair.split(">")
      return a !== undefined && b !== undefined && a < b && pairs.has(`${b}>${a}`)
    })
    expect(twoWay).toEqual([])
  })

  it("keeps every file in src/ at 400 lines or fewer", () => {
    const long = sourceFiles(SRC)
      .map((file) => ({ file: relative(SRC, file), lines: readFileSync(file, "utf8").split("\n").length }))
      .filter(({ lines }) => lines > 400)
    expect(long).toEqual([])
  })
})
