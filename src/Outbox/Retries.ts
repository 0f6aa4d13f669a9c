/** How webhook deliveries and emails are retried: the same schedule for both. */

/** A delivery is retried this long after its event; an endpoint failing this long is disabled. */
export const RETRY_WINDOW_MS = 3 * 24 * 60 * 60 * 1000
const FIRST_RETRY_MS = 5_000
const LONGEST_WAIT_MS = 6 * 60 * 60 * 1000

/** The wait after failed attempt `attempt` (1-based): 5 s doubling to 6 h, plus up to a tenth more so retries spread. */
export const backoffMs = (attempt: number, jitter: number = Math.random()): number => {
  const base = Math.min(FIRST_RETRY_MS * 2 ** Math.min(attempt - 1, 30), LONGEST_WAIT_MS)
  return Math.round(base * (1 + 0.1 * jitter))
}
