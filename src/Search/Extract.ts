import { Readability } from "@mozilla/readability"
import { parseHTML } from "linkedom"

/** Elements that end a line for a reader; text nodes alone would run paragraphs together. */
const BLOCKS = new Set([
  "p",
  "div",
  "section",
  "article",
  "header",
  "footer",
  "aside",
  "main",
  "nav",
  "blockquote",
  "pre",
  "li",
  "dt",
  "dd",
  "tr",
  "table",
  "ul",
  "ol",
  "h1",
  "h2",
  "h3",
  "h4",
  "h5",
  "h6",
  "br",
  "hr",
  "figcaption",
  "form"
])
/** Elements whose content is never page text. */
const SKIPPED = new Set(["script", "style", "noscript", "template", "svg", "iframe", "object", "canvas", "head"])

/**
 * Readability scores every element, which grows faster than the page: a page
 * with more elements than this is read as plain body text instead, so that a
 * hostile page cannot hold the event loop for long.
 */
const READABILITY_MAX_ELEMENTS = 8_000

interface TextNode {
  readonly nodeType: number
  readonly nodeName: string
  readonly nodeValue: string | null
  readonly childNodes: ArrayLike<TextNode>
}

/** The text under `root`, each block on its own line, spaces collapsed, blank lines dropped: one pass, no recursion. */
const blockText = (root: TextNode): string => {
  const parts: Array<string> = []
  const stack: Array<TextNode | "\n"> = [root]
  while (stack.length > 0) {
    const node = stack.pop()
    if (node === undefined) break
    if (node === "\n") {
      parts.push("\n")
      continue
    }
    if (node.nodeType === 3) {
      parts.push(node.nodeValue ?? "")
      continue
    }
    if (node.nodeType !== 1 && node.nodeType !== 9 && node.nodeType !== 11) continue
    const name = node.nodeName.toLowerCase()
    if (SKIPPED.has(name)) continue
    const block = BLOCKS.has(name)
    if (block) stack.push("\n")
    for (let i = node.childNodes.length - 1; i >= 0; i--) {
      const child = node.childNodes[i]
      if (child !== undefined) stack.push(child)
    }
    if (block) stack.push("\n")
  }
  return parts.join("")
    .split("\n")
    .map((line) => line.replace(/\s+/g, " ").trim())
    .filter((line) => line.length > 0)
    .join("\n")
}

const readability = (html: string): string | undefined => {
  try {
    const article = new Readability(parseHTML(html).document, {
      maxElemsToParse: READABILITY_MAX_ELEMENTS,
      charThreshold: 200
    }).parse()
    if (!article?.content) return undefined
    const text = blockText(
      parseHTML(`<!doctype html><html><body>${article.content}</body></html>`).document.body as unknown as TextNode
    )
    if (text.length === 0) return undefined
    return article.title ? `${article.title.trim()}\n${text}` : text
  } catch {
    // Too many elements (Readability's own limit), or a page it cannot handle: read the body instead.
    return undefined
  }
}

/**
 * A page's main text: Mozilla's Readability (Firefox's Reader View) picks the
 * article out of the page, dropping navigation, ads and boilerplate, on
 * linkedom's DOM, which parses HTML without running scripts or loading
 * anything. A page Readability finds no article in (short, unusual or very
 * large pages) gives its body's text without scripts, styles and the like.
 */
export const mainText = (html: string): string => {
  const article = readability(html)
  if (article !== undefined) return article
  const { document } = parseHTML(html)
  return blockText((document.body ?? document.documentElement) as unknown as TextNode)
}

/** Plain text with spaces collapsed and blank lines dropped. */
export const plainText = (text: string): string =>
  text.split(/\r?\n/).map((line) => line.replace(/\s+/g, " ").trim()).filter((line) => line.length > 0).join("\n")
