import type { ESLint } from "eslint"

/** The project's own lint rules (`plugin.mjs`). */
declare const plugin: ESLint.Plugin
export default plugin
