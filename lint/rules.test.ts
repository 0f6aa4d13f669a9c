import { Linter, RuleTester } from "eslint"
import tseslint from "typescript-eslint"
import { afterAll, describe, expect, it } from "vitest"
import nenas from "./plugin.mjs"

// RuleTester makes one vitest test per case.
RuleTester.afterAll = afterAll
RuleTester.describe = describe
RuleTester.it = it
RuleTester.itOnly = it.only

const tester = new RuleTester({
  languageOptions: { parser: tseslint.parser, ecmaVersion: "latest", sourceType: "module" }
})

tester.run("nenas/no-gen-in-arrow", nenas.rules["no-gen-in-arrow"], {
  valid: [
    // Module level: one generator function, made once.
    "const program = Effect.gen(function*() { yield* Effect.log(1) })",
    // Hoisted with `Effect.fnUntraced`.
    "const handle = Effect.fnUntraced(function*(n: number) { return n + 1 })",
    "export const f = (n: number) => handle(n)",
    // A layer's service, built once.
    "const live = (n: number) => Layer.effect(Tag, Effect.gen(function*() { return n }))",
    "const live = (n: number) => Layer.scoped(Tag, Effect.gen(function*() { return n }))",
    // A function declaration is not flagged.
    "function make() { return Effect.gen(function*() { return 1 }) }",
    // Other `gen`s.
    "const f = () => Stream.gen(function*() {})",
    "const f = () => Effect.genAll(1)"
  ],
  invalid: [
    {
      code: "const f = (n: number) => Effect.gen(function*() { return n })",
      errors: [{ messageId: "genInFunction" }]
    },
    {
      code: "const f = (n: number) => { return Effect.gen(function*() { return n }) }",
      errors: [{ messageId: "genInFunction" }]
    },
    {
      code: "const f = function(n: number) { return Effect.gen(function*() { return n }) }",
      errors: [{ messageId: "genInFunction" }]
    },
    {
      // The nearest function is the generator: it runs per call, so the inner one is made per call.
      code: "const f = Effect.fnUntraced(function*() { yield* Effect.gen(function*() {}) })",
      errors: [{ messageId: "genInFunction" }]
    },
    {
      code: "const service = { run: (n: number) => Effect.gen(function*() { return n }) }",
      errors: [{ messageId: "genInFunction" }]
    },
    {
      code: "class Lane { run(n: number) { return Effect.gen(this, function*() { return n }) } }",
      errors: [{ messageId: "genInFunction" }]
    },
    {
      // Inside a layer constructor's function, but not its direct argument.
      code: "const live = Layer.effect(Tag, Effect.map(x, (n) => Effect.gen(function*() { return n })))",
      errors: [{ messageId: "genInFunction" }]
    }
  ]
})

tester.run("nenas/no-spread-adding-field", nenas.rules["no-spread-adding-field"], {
  valid: [
    "const f = (a: object) => ({ ...a })",
    "const f = (a: object, b: object) => ({ ...a, ...b })",
    "const f = (a: object) => Object.assign({}, a, { b: 1 })",
    "const f = () => ({ a: 1, b: 2 })",
    // Destructuring with a rest element is not an object literal.
    "const f = ({ a, ...rest }: { a: number; b: number }) => rest",
    // Module level: built once.
    "const defaults = { a: 1 }\nconst options = { ...defaults, b: 2 }"
  ],
  invalid: [
    {
      code: "const f = (a: object) => ({ ...a, b: 1 })",
      errors: [{ messageId: "spreadAddingField" }]
    },
    {
      code: "const f = (a: object) => ({ b: 1, ...a })",
      errors: [{ messageId: "spreadAddingField" }]
    },
    {
      code: "const f = (a: object, c: number) => ({ ...a, c })",
      errors: [{ messageId: "spreadAddingField" }]
    },
    {
      // Each literal is checked: the inner one too.
      code: "const f = (a: { s: object }) => ({ ...a, s: { ...a.s, t: 1 } })",
      errors: [{ messageId: "spreadAddingField" }, { messageId: "spreadAddingField" }]
    },
    {
      code: "function f(a: object) { return { ...a, [\"b\"]: 1 } }",
      errors: [{ messageId: "spreadAddingField" }]
    }
  ]
})

// RuleTester names the rule under test its own way, so a disable comment naming `nenas/...` is tried on a linter
// configured as `eslint.config.mjs` does.
describe("nenas/no-spread-adding-field, disabled", () => {
  const linter = new Linter({ configType: "flat" })
  const config = {
    files: ["**/*.ts"],
    languageOptions: { parser: tseslint.parser },
    plugins: { nenas },
    rules: { "nenas/no-spread-adding-field": "error" as const }
  }

  it("is silenced by `eslint-disable-next-line` with a reason", () => {
    const code = "const f = (a: object) =>\n" +
      "  // eslint-disable-next-line nenas/no-spread-adding-field -- built once per connection\n" +
      "  ({ ...a, b: 1 })\n"
    expect(linter.verify(code, config, "call.ts")).toEqual([])
  })

  it("still reports the next literal", () => {
    const code = "const f = (a: object) =>\n" +
      "  // eslint-disable-next-line nenas/no-spread-adding-field -- built once per connection\n" +
      "  [{ ...a, b: 1 },\n" +
      "  { ...a, c: 1 }]\n"
    const messages = linter.verify(code, config, "call.ts")
    expect(messages.map((message) => [message.ruleId, message.line])).toEqual([["nenas/no-spread-adding-field", 4]])
  })
})

// On the call path the rule has types: a field the spread's type already has is a replacement, not an addition.
const typed = new RuleTester({
  languageOptions: {
    parser: tseslint.parser,
    // The cases' file is in no project (`lint/tsconfig.json` holds none), so the repository's own is not loaded.
    parserOptions: {
      projectService: { allowDefaultProject: ["*.ts"], defaultProject: "tsconfig.json" },
      tsconfigRootDir: import.meta.dirname
    }
  }
})

typed.run("nenas/no-spread-adding-field, with types", nenas.rules["no-spread-adding-field"], {
  valid: [
    {
      filename: `${import.meta.dirname}/typed.ts`,
      code:
        "interface P { readonly done: boolean; readonly n: number }\nexport const f = (p: P) => ({ ...p, done: true })"
    }
  ],
  invalid: [
    {
      filename: `${import.meta.dirname}/typed.ts`,
      code: "interface P { readonly n: number }\nexport const f = (p: P) => ({ ...p, done: true })",
      errors: [{ messageId: "spreadAddingField" }]
    },
    {
      filename: `${import.meta.dirname}/typed.ts`,
      code:
        "interface P { readonly done: boolean }\nexport const f = (p: P | { readonly n: number }) => ({ ...p, done: true })",
      errors: [{ messageId: "spreadAddingField" }]
    }
  ]
})
