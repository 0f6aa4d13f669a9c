import react from "@vitejs/plugin-react"
import { fileURLToPath } from "node:url"
import { defineConfig } from "vite"

const api = process.env.NENAS_URL ?? "http://127.0.0.1:8080"

// Built into web/dist and served by the service at /app/ (src/Http/Dashboard.ts).
export default defineConfig({
  root: fileURLToPath(new URL(".", import.meta.url)),
  base: "/app/",
  plugins: [react()],
  build: {
    outDir: "dist",
    emptyOutDir: true,
    // No source maps: they would hand out the dashboard's sources under /app/assets (`npx vite web` still has them).
    sourcemap: false,
    // The charting library is most of the weight; its own chunk stays cached across app releases.
    rollupOptions: {
      output: { manualChunks: { react: ["react", "react-dom", "react-router"], charts: ["recharts"] } }
    },
    chunkSizeWarningLimit: 600
  },
  // `npx vite web` during development: the API stays on the running service.
  server: {
    proxy: Object.fromEntries(["/dashboard", "/dev", "/v1", "/app/config.json"].map((path) => [path, api]))
  }
})
