import { Readability } from "@mozilla/readability"
import { parseHTML } from "linkedom"

/** Elements after which a reader sees a line break; `textContent` alone runs paragraphs together. */
const BLOCKS = "p,div,section,article,header,footer,aside,main,blockquote,pre,li,dt,dd,tr,table,ul,ol,h1,h2,h3,h4,h5,h6,br,hr,figcaption"

/** Text with each block on its own line, spaces collapsed, blank lines dropped. */
const blockText = (root: { querySelectorAll: (selector: string) => Iterable<{ after: (text: string) => void }>; textContent: string | null }) => {
  for (const element of root.querySelectorAll(BLOCKS)) element.after("\n")
  return (root.textContent ?? "")
    .split("\n")
    .map((line) => line.replace(/\s+/g, " ").trim())
    .filter((line) => line.length > 0)
    .join("\n")
}

/**
 * A page's main text: Mozilla's Readability (Firefox's Reader View) picks the
 * article out of the page, dropping navigation, ads and boilerplate, on
 * linkedom's DOM, which parses HTML without running scripts or loading
 * anything. A page Readability finds no article in (short or unusual pages)
 * gives its body's text without scripts, styles and templates.
 */
export const mainText = (html: string): string => {
  const article = new Readability(parseHTML(html).document, { charThreshold: 200 }).parse()
  if (article?.content) {
    const text = blockText(parseHTML(`<!doctype html><html><body>${article.content}</body></html>`).document.body)
    if (text.length > 0) return article.title ? `${article.title.trim()}\n${text}` : text
  }
  const { document } = parseHTML(html)
  for (const element of document.querySelectorAll("script,style,noscript,template,svg,iframe")) element.remove()
  return blockText(document.body ?? document.documentElement)
}

/** Plain text with spaces collapsed and blank lines dropped. */
export const plainText = (text: string): string =>
  text.split(/\r?\n/).map((line) => line.replace(/\s+/g, " ").trim()).filter((line) => line.length > 0).join("\n")
