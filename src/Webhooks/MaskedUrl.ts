/** A URL's origin alone (`https://hooks.example.com/…`): its path and query often carry the receiver's token. */
export const maskedUrl = (raw: string): string => {
  try {
    const url = new URL(raw)
    return `${url.protocol}//${url.host}/…`
  } catch {
    return "…"
  }
}
