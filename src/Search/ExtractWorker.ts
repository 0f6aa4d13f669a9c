import { parentPort, workerData } from "node:worker_threads"
import { mainText, plainText } from "./Extract.js"

/** Reads one page off the main thread (see `Search.readable`): the page in `workerData`, its text posted back. */
const page = workerData as { readonly kind: "html" | "text"; readonly body: string }
parentPort?.postMessage(page.kind === "html" ? mainText(page.body) : plainText(page.body))
