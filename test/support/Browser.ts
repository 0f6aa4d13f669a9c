import { Effect } from "effect"
import { existsSync, statSync } from "node:fs"
import { mkdir, mkdtemp, readdir, rm, stat } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { type BrowserContext, chromium, type Page } from "playwright-core"
import { DASHBOARD_DIST } from "../../src/Http/Dashboard.js"

/** Debian's `chromium` package; `.ci/run` installs it. Playwright never downloads a browser here. */
export const CHROMIUM = "/usr/bin/chromium"

const WEB = fileURLToPath(new URL("../../web", import.meta.url))

const newestSource = async (dir: string): Promise<number> => {
  let newest = 0
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name)
    newest = Math.max(newest, entry.isDirectory() ? await newestSource(path) : (await stat(path)).mtimeMs)
  }
  return newest
}

/** Builds web/ (as `npm run build:web` does) when its build is missing or older than its sources. */
export const ensureDashboardBuilt = async (): Promise<void> => {
  const index = join(DASHBOARD_DIST, "index.html")
  const sources = Math.max(
    await newestSource(join(WEB, "src")),
    statSync(join(WEB, "index.html")).mtimeMs,
    statSync(join(WEB, "vite.config.ts")).mtimeMs
  )
  if (existsSync(index) && statSync(index).mtimeMs >= sources) return
  const vite = await import("vite")
  await vite.build({ root: WEB, configFile: join(WEB, "vite.config.ts"), logLevel: "warn" })
}

/** Headless Chromium with a fresh profile, removed again by `close`. */
export const launchBrowser = async (): Promise<{ context: BrowserContext; close: () => Promise<void> }> => {
  if (!existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} is missing: apt-get install -y chromium (.ci/run does it)`)
  const profile = await mkdtemp(join(tmpdir(), "nenas-chromium-"))
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync"
    ],
    viewport: { width: 1280, height: 800 },
    // The simulated model's answers do not depend on it, but dates do: a zone other than the business one.
    timezoneId: "Europe/Berlin",
    locale: "en-GB"
  })
  return {
    context,
    close: async () => {
      await context.close()
      await rm(profile, { recursive: true, force: true })
    }
  }
}

/** The page's title (its one `h1`). */
export const heading = (page: Page, name: string) => page.getByRole("heading", { level: 1, name })

/** Signs in through the development identity provider's form, and waits for the overview. */
export const signIn = async (page: Page, baseUrl: string, email: string) => {
  await page.goto(`${baseUrl}/app/`)
  await page.getByLabel("Email").fill(email)
  await page.getByRole("button", { name: "Sign in", exact: true }).click()
  await heading(page, "Overview").waitFor()
}

/** Where the dashboard tests put their screenshots, and the two widths they take them at. */
export const SHOTS = "test-results/dashboard"
export const DESKTOP = { width: 1280, height: 800 }
export const PHONE = { width: 390, height: 844 }

/** The page at both widths, whole: `<name>-desktop.png` and `<name>-phone.png` in `SHOTS`. */
export const screenshots = async (page: Page, name: string) => {
  for (const [size, viewport] of [["desktop", DESKTOP], ["phone", PHONE]] as const) {
    await page.setViewportSize(viewport)
    // Charts measure their box after a resize.
    await page.waitForTimeout(300)
    await page.screenshot({ path: `${SHOTS}/${name}-${size}.png`, fullPage: true })
  }
  await page.setViewportSize(DESKTOP)
}

/** Runs `use` with a fresh browser (`launchBrowser`), closed afterwards whatever `use` does. */
export const inBrowser = (use: (context: BrowserContext) => Promise<void>) =>
  Effect.acquireUseRelease(
    Effect.promise(launchBrowser),
    ({ context }) =>
      Effect.promise(() =>
        use(context).catch(async (error: unknown) => Promise.reject(await withScreens(context, error)))
      ),
    ({ close }) => Effect.promise(close)
  )

/** A new page whose uncaught errors are collected in `problems` (a test expects none), with the screenshots' folder made. */
export const watchedPage = async (context: BrowserContext) => {
  await mkdir(SHOTS, { recursive: true })
  const problems: Array<string> = []
  const page = await context.newPage()
  page.on("pageerror", (error) => problems.push(`pageerror: ${error.message}`))
  return { page, problems }
}

/** A failure with what each open page showed when it failed (its URL and text), so that a failure says what was on screen. */
const withScreens = async (context: BrowserContext, error: unknown): Promise<unknown> => {
  if (!(error instanceof Error)) return error
  const screens = await Promise.all(
    context.pages().map(async (page) => {
      const text = await page.locator("body").innerText({ timeout: 2_000 }).catch(() => "(unreadable)")
      return `${page.url()}\n${text.slice(0, 1_500)}`
    })
  )
  error.message = `${error.message}\n\nOpen pages when it failed:\n${screens.join("\n---\n")}`
  return error
}

/**
 * A watched page whose console errors and warnings (React's among them, and Chromium's line for each failed
 * load, with the path it names) are collected with its uncaught errors; `failed` lists its failed responses.
 */
export const strictPage = async (context: BrowserContext) => {
  const watched = await watchedPage(context)
  watched.page.on("console", (message) => {
    if (message.type() === "error" || message.type() === "warning") {
      watched.problems.push(`${message.type()}: ${message.text()} ${new URL(message.location().url).pathname}`)
    }
  })
  const failed: Array<string> = []
  watched.page.on("response", (response) => {
    if (response.status() >= 400) failed.push(`${response.status()} ${new URL(response.url()).pathname}`)
  })
  return { ...watched, failed }
}

/** Follows the dashboard's navigation link `link` and waits for the page's heading. */
export const goTo = async (page: Page, link: string, title: string = link) => {
  await page.getByRole("navigation", { name: "Dashboard" }).getByRole("link", { name: link, exact: true }).click()
  await heading(page, title).waitFor()
}

/** How far the page is wider than a phone's screen (0: nothing to scroll sideways), measured at phone width. */
export const overflowAtPhoneWidth = async (page: Page): Promise<number> => {
  await page.setViewportSize(PHONE)
  await page.waitForTimeout(200)
  const overflow = await page.evaluate<number>("document.documentElement.scrollWidth - window.innerWidth")
  await page.setViewportSize(DESKTOP)
  return overflow
}
