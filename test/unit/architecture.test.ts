import { existsSync, readdirSync, readFileSync, statSync } from "node:fs"
import { basename, dirname, join, relative, resolve } from "node:path"
import { describe, expect, it } from "vitest"

/** Every area's contract (`Api.ts`, `…Api.ts`) and the composed one (`src/Api.ts`): Schemas and endpoints only. */
export const CONTRACTS = "(contracts)"
/** Every area's handlers (`X/Http.ts`): they implement the contract's groups with the cores below them. */
export const HANDLERS = "(handlers)"

/**
 * The layer order of `src/`, lowest first, written down once. A folder is an
 * area a user would name: its contract, its handlers, and its core (every other
 * file). Cores are layered by folder: a core file may import its own folder,
 * or a folder of an earlier layer; folders of one layer do not import each
 * other. Contracts sit just above `Domain`: any core may read their Schemas,
 * and a contract reads only `Domain` and other contracts. Handlers sit above
 * every core: they may use any of them, and only the server imports them.
 */
export const LAYERS: ReadonlyArray<ReadonlyArray<string>> = [
  ["Request"],
  ["Domain"],
  [CONTRACTS],
  ["AppConfig", "Lane/Wire"],
  ["Observability", "Addresses", "Database"],
  ["Routing", "Search", "Responses", "Guardrails", "EInvoicing"],
  ["ProviderKeys"],
  ["Providers"],
  ["Logs", "Outbox", "Cache"],
  ["Wallet", "Webhooks", "Audit", "Members", "Invoices"],
  ["Accounts"],
  ["Auth"],
  ["Keys"],
  ["Billing", "Usage", "Health"],
  ["Alerts"],
  ["Models"],
  [HANDLERS],
  ["Lane"],
  ["Http"],
  ["main"]
]

/** Base names every area may have, since their folder says what they hold. */
export const ROLE_NAMES: ReadonlyArray<string> = ["Api.ts", "Http.ts", "Repo.ts"]

const ROOT = resolve(import.meta.dirname, "../..")
const SRC = join(ROOT, "src")

const sourceFiles = (dir: string): ReadonlyArray<string> =>
  readdirSync(dir).flatMap((name) => {
    const path = join(dir, name)
    if (statSync(path).isDirectory()) return sourceFiles(path)
    return path.endsWith(".ts") ? [path] : []
  })

/**
 * A file's folder under `src/` (or the sub-folder, when `LAYERS` names one on
 * its own, as `Lane/Wire`), or its own name for a top-level file.
 */
const folderOf = (file: string): string => {
  const [first = "", second, ...rest] = relative(SRC, file).split("/")
  if (second === undefined) return first.replace(/\.ts$/, "")
  return rest.length > 0 && LAYERS.some((units) => units.includes(`${first}/${second}`)) ? `${first}/${second}` : first
}

const isContract = (file: string): boolean => /Api\.ts$/.test(basename(file))
const isHandlers = (file: string): boolean => basename(file) === "Http.ts" && folderOf(file) !== "Http"

/** What a file is layered as: the contracts, its own handlers file, or its folder's core. */
const unitOf = (file: string): string =>
  isContract(file) ? CONTRACTS : isHandlers(file) ? relative(SRC, file) : folderOf(file)

const layerOf = (file: string): number => {
  const unit = isContract(file) ? CONTRACTS : isHandlers(file) ? HANDLERS : folderOf(file)
  return LAYERS.findIndex((units) => units.includes(unit))
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

/** The circles of files that import each other (Tarjan's strongly connected components of more than one file). */
export const fileCycles = (arrows: ReadonlyArray<Arrow>): ReadonlyArray<ReadonlyArray<string>> => {
  const next = new Map<string, Array<string>>()
  for (const { from, to } of arrows) next.set(from, [...(next.get(from) ?? []), to])
  const index = new Map<string, number>()
  const low = new Map<string, number>()
  const stack: Array<string> = []
  const onStack = new Set<string>()
  const cycles: Array<Array<string>> = []
  const visit = (file: string): void => {
    index.set(file, index.size)
    low.set(file, index.get(file)!)
    stack.push(file)
    onStack.add(file)
    for (const to of next.get(file) ?? []) {
      if (!index.has(to)) {
        visit(to)
        low.set(file, Math.min(low.get(file)!, low.get(to)!))
      } else if (onStack.has(to)) low.set(file, Math.min(low.get(file)!, index.get(to)!))
    }
    if (low.get(file) !== index.get(file)) return
    const cycle: Array<string> = []
    for (let member = stack.pop(); member !== undefined; member = member === file ? undefined : stack.pop()) {
      onStack.delete(member)
      cycle.push(relative(SRC, member))
    }
    if (cycle.length > 1) cycles.push(cycle.sort())
  }
  for (const file of next.keys()) if (!index.has(file)) visit(file)
  return cycles
}

/**
 * Names a newcomer confuses: two files whose names differ only by a plural
 * (`Call.ts`, `Calls.ts`), or one base name in two folders when it is not a
 * role name whose folder says what it holds.
 */
export const confusableNames = (files: ReadonlyArray<string>): ReadonlyArray<string> => {
  const names = files.map((file) => relative(SRC, file))
  const stem = (name: string) => basename(name, ".ts").toLowerCase()
  const plurals = names.flatMap((a) =>
    names.filter((b) => stem(b) === `${stem(a)}s` || stem(b) === `${stem(a)}es`).map((b) => `${a} ~ ${b}`)
  )
  const byBase = new Map<string, Array<string>>()
  for (const name of names) byBase.set(basename(name), [...(byBase.get(basename(name)) ?? []), name])
  const shared = [...byBase].filter(([base, all]) => all.length > 1 && !ROLE_NAMES.includes(base)).map(([, all]) =>
    all.join(" ~ ")
  )
  return [...plurals, ...shared]
}

const COMMENT = /\/\/[^\n]*|\/\*[\s\S]*?\*\//g
const FILE_NAME = /(?<![\w./-])((?:[\w.-]+\/)*[\w-]+\.(?:ts|tsx|md))\b/g
const DOC_SECTION = /(docs\/[\w/-]+\.md), "([^"]+)"/g

/** The headings of a page under `docs/`, as a comment quotes them. */
const headingsOf = (page: string): ReadonlySet<string> =>
  new Set(
    readFileSync(join(ROOT, page), "utf8").split("\n").flatMap((line) => {
      const heading = /^#{1,6}\s+(.*?)\s*$/.exec(line)?.[1]
      return heading === undefined ? [] : [heading.replace(/`/g, "")]
    })
  )

/**
 * What the comments of `file` name that is not there: a file (looked up beside
 * `file`, under its area's folder, under `src/` and from the repository's
 * root) or a section of a page under `docs/` (`docs/money.md, "Batched settlement"`).
 */
export const missingNames = (file: string, text: string = readFileSync(file, "utf8")): ReadonlyArray<string> => {
  const area = file.startsWith(SRC + "/") ? join(SRC, relative(SRC, file).split("/")[0] ?? "") : join(ROOT, "test")
  const bases = [dirname(file), area, SRC, ROOT]
  return [...text.matchAll(COMMENT)].flatMap(([comment]) => [
    ...[...comment.matchAll(FILE_NAME)]
      .map((match) => match[1] ?? "")
      .filter((name) => !bases.some((base) => existsSync(join(base, name))))
      .map((name) => `${relative(SRC, file)}: ${name}`),
    ...[...comment.replace(/\s*\n\s*(?:\*|\/\/)?\s*/g, " ").matchAll(DOC_SECTION)]
      .filter(([, page = "", heading = ""]) => existsSync(join(ROOT, page)) && !headingsOf(page).has(heading))
      .map(([, page, heading]) => `${relative(SRC, file)}: ${page}, "${heading}"`)
  ])
}

describe("the dependency rule of src/", () => {
  const files = sourceFiles(SRC)
  /** Whose comments are checked: src/ and test/, but this file, whose examples name what is missing on purpose. */
  const commented = [...files, ...sourceFiles(join(ROOT, "test")).filter((file) => file !== import.meta.filename)]
  const arrows = arrowsOf()
  const between = arrows.filter((arrow) => unitOf(arrow.from) !== unitOf(arrow.to))

  it("names every folder in exactly one layer", () => {
    for (const file of files) expect(layerOf(file), `${relative(SRC, file)} is in no layer`).toBeGreaterThanOrEqual(0)
    expect(LAYERS.flat().length).toBe(new Set(LAYERS.flat()).size)
  })

  it("has no import that runs up or sideways", () => {
    const upward = between
      .filter((arrow) => layerOf(arrow.to) >= layerOf(arrow.from))
      .map((arrow) => `${relative(SRC, arrow.from)} -> ${relative(SRC, arrow.to)}`)
    expect(upward).toEqual([])
  })

  it("has no pair of folders that import each other", () => {
    const pairs = new Set(between.map((arrow) => `${unitOf(arrow.from)}>${unitOf(arrow.to)}`))
    const twoWay = [...pairs].filter((pair) => {
      const [a, b] = pair.split(">")
      return a !== undefined && b !== undefined && a < b && pairs.has(`${b}>${a}`)
    })
    expect(twoWay).toEqual([])
  })

  it("has no circle of files", () => {
    expect(fileCycles(arrows)).toEqual([])
  })

  it("has no two names a newcomer confuses", () => {
    expect(confusableNames(files)).toEqual([])
  })

  it("has no comment, in src/ or test/, that names a file or a docs section that is not there", () => {
    expect(commented.flatMap((file) => missingNames(file))).toEqual([])
  })

  it("has no comment, in src/ or test/, that sends a reader to an issue", () => {
    const cited = commented.flatMap((file) =>
      [...readFileSync(file, "utf8").matchAll(COMMENT)].flatMap(([comment]) =>
        /\b[Ii]ssues? #?\d+/.test(comment) ? [`${relative(SRC, file)}: ${comment.slice(0, 80)}`] : []
      )
    )
    expect(cited).toEqual([])
  })

  it("has every folder of src/ said in the folder map of docs/architecture.md", () => {
    const map = readFileSync(join(ROOT, "docs/architecture.md"), "utf8")
    const folders = [...new Set(files.map((file) => dirname(relative(SRC, file))).filter((dir) => dir !== "."))]
    const said = (dir: string) => {
      const [area, sub] = dir.split("/")
      return sub === undefined
        ? new RegExp(`^  ${area}/ `, "m").test(map)
        : new RegExp(`^  ${dir}/ `, "m").test(map) || new RegExp(`^    ${sub}/ `, "m").test(map)
    }
    expect(folders.filter((dir) => !said(dir))).toEqual([])
  })
})

describe("the checks themselves", () => {
  const at = (name: string) => join(SRC, name)

  it("finds a circle of three files, and none in a chain", () => {
    const arrow = (from: string, to: string): Arrow => ({ from: at(from), to: at(to) })
    expect(fileCycles([arrow("A/a.ts", "A/b.ts"), arrow("A/b.ts", "B/c.ts"), arrow("B/c.ts", "A/a.ts")]))
      .toEqual([["A/a.ts", "A/b.ts", "B/c.ts"]])
    expect(fileCycles([arrow("A/a.ts", "A/b.ts"), arrow("A/b.ts", "B/c.ts")])).toEqual([])
  })

  it("finds a comment's missing file and missing docs section, not the ones that are there", () => {
    const file = at("Wallet/Repo.ts")
    expect(missingNames(file, "// See `Settlement/Settle.ts`, `Domain/Money.ts` and `test/architecture.test.ts`."))
      .toEqual([])
    expect(missingNames(file, "/** See `Lane.ts`\n * and `Post.ts`. */ const x = \"Gone.ts\"")).toEqual([
      "Wallet/Repo.ts: Lane.ts",
      "Wallet/Repo.ts: Post.ts"
    ])
    expect(missingNames(file, "// docs/architecture.md, \"No such heading\"")).toEqual([
      "Wallet/Repo.ts: docs/architecture.md, \"No such heading\""
    ])
  })

  it("finds plurals and shared base names, but not role names", () => {
    expect(confusableNames(["Models/Call.ts", "Models/Calls.ts", "Keys/Api.ts", "Logs/Api.ts"].map(at)))
      .toEqual(["Models/Call.ts ~ Models/Calls.ts"])
    expect(confusableNames(["Outbox/Post.ts", "Providers/Post.ts"].map(at))).toEqual([
      "Outbox/Post.ts ~ Providers/Post.ts"
    ])
  })
})
