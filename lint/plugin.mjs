/**
 * The project's own lint rules: the speed rules of the call path (the code a
 * model call runs through on every request). `eslint.config.mjs` turns them
 * on for those files only.
 *
 * - `nenas/no-gen-in-arrow`: no `Effect.gen` made inside an arrow function or
 *   function expression (one made at module level, or handed straight to a
 *   `Layer.*` constructor, runs once and is fine).
 * - `nenas/no-spread-adding-field`: no object literal inside a function that
 *   mixes a spread with other fields (module-level literals run once).
 */

/** True for `Effect.gen`, the callee of `Effect.gen(...)`. */
const isEffectGen = (callee) =>
  callee.type === "MemberExpression" &&
  !callee.computed &&
  callee.object.type === "Identifier" &&
  callee.object.name === "Effect" &&
  callee.property.type === "Identifier" &&
  callee.property.name === "gen"

/** True for a call `Layer.<anything>(...)`. */
const isLayerCall = (node) =>
  node.type === "CallExpression" &&
  node.callee.type === "MemberExpression" &&
  node.callee.object.type === "Identifier" &&
  node.callee.object.name === "Layer"

/** The nearest function around `node`, or null at module level. */
const enclosingFunction = (node) => {
  for (let at = node.parent; at; at = at.parent) {
    if (
      at.type === "ArrowFunctionExpression" ||
      at.type === "FunctionExpression" ||
      at.type === "FunctionDeclaration"
    ) {
      return at
    }
  }
  return null
}

/** @type {import("eslint").Rule.RuleModule} */
const noGenInArrow = {
  meta: {
    type: "problem",
    docs: {
      description: "Disallow `Effect.gen` inside an arrow function or function expression on the call path"
    },
    schema: [],
    messages: {
      genInFunction: "`Effect.gen` inside a function makes a new generator function on every call; V8 gives it a " +
        "map in old space that keeps its closure, and so the call's objects, past young-generation GCs until the " +
        "next major GC. Hoist it: `const f = Effect.fnUntraced(function*(...) { ... })`, made once at module " +
        "level. See docs/performance.md."
    }
  },
  create(context) {
    return {
      CallExpression(node) {
        if (!isEffectGen(node.callee)) return
        // `Layer.effect(Tag, Effect.gen(...))` builds the layer's service once, however it is nested.
        if (node.parent && isLayerCall(node.parent) && node.parent.arguments.includes(node)) return
        const fn = enclosingFunction(node)
        if (fn && (fn.type === "ArrowFunctionExpression" || fn.type === "FunctionExpression")) {
          context.report({ node, messageId: "genInFunction" })
        }
      }
    }
  }
}

/** @type {import("eslint").Rule.RuleModule} */
const noSpreadAddingField = {
  meta: {
    type: "problem",
    docs: {
      description: "Disallow object literals that mix a spread with other fields on the call path"
    },
    schema: [],
    messages: {
      spreadAddingField: "An object literal with a spread and other fields (`{ ...a, b: 1 }`) takes Node 20's " +
        "slow path when it adds a field: the copy gets a detached map, each added field a new map, and the copy " +
        "survives young-generation GCs (see docs/performance.md). List the fields, or copy with `Object.assign` " +
        "onto the new object: `Object.assign({}, a, { b: 1 })`. Where the spread is wanted, disable the line " +
        "with `// eslint-disable-next-line nenas/no-spread-adding-field -- <reason>`."
    }
  },
  create(context) {
    // With type information (the call path's files are linted with it), a field after a spread is an addition
    // only when a spread before it may lack it: `{ ...progress, settled: true }` over a `Progress` that has
    // `settled` replaces a value and keeps the copy's shape. Without it, every such field counts.
    const services = context.sourceCode.parserServices
    const checker = services?.program?.getTypeChecker()
    const has = (spread, name) => {
      const type = checker.getTypeAtLocation(services.esTreeNodeToTSNodeMap.get(spread.argument))
      const members = type.isUnion() ? type.types : [type]
      return members.every((member) => checker.getPropertyOfType(checker.getApparentType(member), name) !== undefined)
    }
    const keyName = (property) =>
      property.computed
        ? (property.key.type === "Literal" ? String(property.key.value) : undefined)
        : property.key.type === "Identifier"
        ? property.key.name
        : property.key.type === "Literal"
        ? String(property.key.value)
        : undefined
    const adds = (node) => {
      const spreads = []
      let fieldBefore = false
      for (const property of node.properties) {
        if (property.type === "SpreadElement") {
          if (fieldBefore) return true
          spreads.push(property)
        } else if (spreads.length === 0) fieldBefore = true
        else {
          const name = keyName(property)
          if (checker === undefined || name === undefined || !spreads.some((spread) => has(spread, name))) return true
        }
      }
      return false
    }
    return {
      ObjectExpression(node) {
        if (enclosingFunction(node) !== null && adds(node)) {
          context.report({ node, messageId: "spreadAddingField" })
        }
      }
    }
  }
}

const plugin = {
  meta: { name: "nenas" },
  rules: {
    "no-gen-in-arrow": noGenInArrow,
    "no-spread-adding-field": noSpreadAddingField
  }
}

export default plugin
