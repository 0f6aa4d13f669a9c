// `npm start`: build the dashboard (web/dist) when it is missing, so a fresh clone serves /app/.
import { existsSync } from "node:fs"
import { fileURLToPath } from "node:url"

const web = fileURLToPath(new URL(".", import.meta.url))
if (!existsSync(new URL("dist/index.html", import.meta.url))) {
  let vite
  try {
    vite = await import("vite")
  } catch {
    // Installed without dev dependencies: the API still runs; /app/ answers that the dashboard is not built.
    console.warn("web/dist is missing and Vite is not installed: the dashboard at /app/ is not served. Run `npm install && npm run build:web`.")
    process.exit(0)
  }
  console.log("Building the dashboard (web/dist)…")
  await vite.build({ root: web, configFile: fileURLToPath(new URL("vite.config.ts", import.meta.url)), logLevel: "warn" })
}
