import type { Direction, Found, Scanner, Tally } from "./Policy.js"
import { changesText, redactFound, scanWith } from "./Policy.js"

/**
 * The most units kept before the text not yet shown. Phone, MyKad and card numbers are read off runs of
 * digit groups from the run's start (docs/api/guardrails.md, "Detectors"), so the context reaches back to
 * the start of the run it falls in, up to this far.
 */
const MAX_CONTEXT = 4_096

const isDigit = (code: number) => code >= 48 && code <= 57

/** Where the run of digit groups (single spaces or dashes between them) around `from` starts, not before `floor`. */
const digitRunStart = (text: string, from: number, floor: number): number => {
  let at = from
  while (at > floor) {
    const before = text.charCodeAt(at - 1)
    if (isDigit(before)) at--
    else if ((before === 32 || before === 45) && at - 2 >= floor && isDigit(text.charCodeAt(at - 2))) at--
    else break
  }
  return at
}

/**
 * A streamed text under a policy (docs/api/guardrails.md, "Streamed output"): pieces go in as the
 * upstream sends them; what comes out is the text redacted, held back by no more than the scanner's
 * reach, so that a match split across pieces is still whole when it is judged.
 *
 * Each release scans the text not yet shown, after the last `reach` units shown (their context: a
 * digit before a number, an email's local part). A finding that starts more than `reach` units before
 * the end is settled: nothing after the end can change it. The text is shown up to `reach` units before
 * the end, or up to the start of a finding that straddles that point. A `block` finding stops the text
 * at its start. A policy that only flags shows each piece at once and still counts what it finds.
 */
export class Holdback {
  /** The last units shown, as the upstream sent them: what the next scan reads before the new text. */
  private context = ""
  /** What the upstream sent that is not shown yet. */
  private pending = ""
  /** Shown redacted, in all: a whole answer's text as the caller got it. */
  private shownText = ""
  private blockedBy: Found | undefined
  /** Whether anything is held at all: a policy that only flags shows every piece as it comes. */
  private readonly holds: boolean

  constructor(
    private readonly scanner: Scanner,
    private readonly direction: Direction,
    private readonly tally: Tally
  ) {
    this.holds = changesText(scanner)
  }

  /** The finding that blocked the text, once one did: nothing more is shown. */
  get blocked(): Found | undefined {
    return this.blockedBy
  }

  /** Everything shown so far, redacted. */
  get shown(): string {
    return this.shownText
  }

  /** Takes the next piece; answers what may be shown now. */
  push(piece: string): string {
    if (this.blockedBy !== undefined || piece.length === 0) return ""
    this.pending += piece
    const released = this.pending.length > this.scanner.reach ? this.release(false) : ""
    if (this.holds) return released
    this.shownText += piece
    return piece
  }

  /** The text is whole: answers the rest, judged to its end. */
  end(): string {
    if (this.blockedBy !== undefined) return ""
    const released = this.release(true)
    return this.holds ? released : ""
  }

  private release(final: boolean): string {
    const offset = this.context.length
    const text = this.context + this.pending
    const found = scanWith(this.scanner, text).filter((finding) => finding.start >= offset)
    let cut = final ? text.length : text.length - this.scanner.reach
    // Latest first, so that moving the cut back to one finding's start is checked against those before it.
    for (let i = found.length - 1; i >= 0; i--) {
      const finding = found[i]!
      if (finding.start < cut && finding.end > cut) cut = finding.start
    }
    const settled = found.filter((finding) => finding.end <= cut)
    const block = settled.find((finding) => finding.action === "block")
    if (block !== undefined) cut = block.start
    const shown = settled.filter((finding) => finding.end <= cut)
    this.tally.add(this.direction, block === undefined ? shown : [...shown, block])
    const piece = redactFound(
      text.slice(offset, cut),
      shown.map((finding) => Object.assign({}, finding, { start: finding.start - offset, end: finding.end - offset }))
    )
    this.blockedBy = block
    const reachBack = Math.max(0, cut - this.scanner.reach)
    this.context = text.slice(digitRunStart(text, reachBack, Math.max(0, cut - MAX_CONTEXT)), cut)
    this.pending = text.slice(cut)
    if (this.holds) this.shownText += piece
    return piece
  }
}
