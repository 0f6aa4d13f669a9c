import { execFile, spawn } from "node:child_process"
import { readdir, stat } from "node:fs/promises"
import { promisify } from "node:util"
import { Effect } from "effect"
import { CONFIG_VARIABLES, type Started, waitForHealth } from "./Start.js"

export interface CompiledService {
  readonly baseUrl: string
  /** Everything it printed so far, stdout and stderr. */
  readonly output: () => string
}

const ROOT = new URL("../../", import.meta.url)

const newestSource = async (): Promise<number> => {
  let newest = 0
  for (const dir of ["src", "migrations", "web/src"]) {
    for (const file of await readdir(new URL(dir, ROOT), { recursive: true })) {
      newest = Math.max(newest, (await stat(new URL(`${dir}/${file}`, ROOT))).mtimeMs)
    }
  }
  return newest
}

/** `npm run build` when `dist/main.js` is missing or older than a source it is compiled from. */
export const ensureBuilt = Effect.promise(async () => {
  const built = await stat(new URL("dist/main.js", ROOT)).then((s) => s.mtimeMs, () => 0)
  if (built > 0 && (await newestSource()) <= built) return
  await promisify(execFile)("npm", ["run", "build"], { cwd: ROOT, maxBuffer: 16 * 1024 * 1024 })
})

/**
 * The compiled service (`node dist/main.js`) as a child process with only
 * `env` configured (`PORT` among it); killed when the scope closes. Resolves
 * once `/healthz` answers.
 */
export const startCompiled = (env: Record<string, string>) =>
  Effect.acquireRelease(
    Effect.promise(async (): Promise<CompiledService & { readonly started: Started }> => {
      const childEnv: NodeJS.ProcessEnv = { ...process.env }
      for (const name of CONFIG_VARIABLES) delete childEnv[name]
      const child = spawn(process.execPath, ["dist/main.js"], { cwd: ROOT, env: { ...childEnv, ...env }, stdio: ["ignore", "pipe", "pipe"] })
      let output = ""
      child.stdout.on("data", (chunk) => (output += chunk))
      child.stderr.on("data", (chunk) => (output += chunk))
      const started: Started = {
        child,
        output: () => output,
        closed: new Promise((resolve) => child.once("close", (code) => resolve(code)))
      }
      const baseUrl = `http://127.0.0.1:${env["PORT"]}`
      await waitForHealth(baseUrl, started).catch((error: unknown) => {
        child.kill("SIGKILL")
        throw error
      })
      return { baseUrl, output: started.output, started }
    }),
    ({ started }) => Effect.sync(() => started.child.kill("SIGKILL"))
  )
