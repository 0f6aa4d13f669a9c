/**
 * Server-sent events as a client reads them: a body's events, each with its
 * `event` name (when it has one) and its `data` lines joined.
 */
export interface SseEvent {
  readonly event: string | undefined
  readonly data: string
}

/** The chat stream's last event. */
export const DONE = "[DONE]"

export const isDone = (event: SseEvent) => event.data === DONE

/** The events of a `text/event-stream` body; a block without data (a comment) is no event. */
export const parseSse = (text: string): Array<SseEvent> =>
  text.split(/\r?\n\r?\n/).flatMap((block) => {
    let event: string | undefined
    const data: Array<string> = []
    for (const line of block.split(/\r?\n/)) {
      if (line.startsWith("event:")) event = line.slice(6).trim()
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""))
    }
    return data.length === 0 ? [] : [{ event, data: data.join("\n") }]
  })

// arbitrary JSON: each test asserts the shape it expects
type Json = any

/** Each event's data parsed as JSON, except the `[DONE]` sentinel, kept as the string. */
export const sseJson = <A = Json>(events: ReadonlyArray<SseEvent>): Array<A | typeof DONE> =>
  events.map((e) => isDone(e) ? DONE : JSON.parse(e.data) as A)

/**
 * Reads a fetch response's stream to its end, or, with `until`, until the
 * complete events so far satisfy it: the body is then cancelled (the client
 * goes away mid-stream) and those events returned.
 */
export const readSse = async (
  response: Response,
  until?: (events: ReadonlyArray<SseEvent>) => boolean
): Promise<Array<SseEvent>> => {
  if (response.body === null) return []
  const reader = response.body.getReader()
  const decoder = new TextDecoder()
  let text = ""
  while (true) {
    const { done, value } = await reader.read()
    if (done) return parseSse(text)
    text += decoder.decode(value, { stream: true })
    if (until !== undefined) {
      const complete = parseSse(text.slice(0, Math.max(0, text.lastIndexOf("\n\n"))))
      if (until(complete)) {
        await reader.cancel().catch(() => undefined)
        return complete
      }
    }
  }
}
