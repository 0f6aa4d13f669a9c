import { Effect } from "effect"
import { Counter, Gauge, Histogram, Registry } from "prom-client"

const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120]

/**
 * How one attempt at an upstream target ended, as `nenas_upstream_attempts_total` counts it:
 * answered (`ok`), refused the request itself (`refused`, a 4xx but 429), 429 (`rate_limited`), 5xx
 * (`server_error`), no connection (`connection_error`), no first byte in time (`first_byte_timeout`),
 * stopped mid-answer (`cut_short`), or skipped without a request because its breaker is open (`breaker_open`).
 */
export const UPSTREAM_ATTEMPT_OUTCOMES = [
  "ok",
  "refused",
  "rate_limited",
  "server_error",
  "connection_error",
  "first_byte_timeout",
  "cut_short",
  "breaker_open"
] as const
export type UpstreamAttemptOutcome = typeof UPSTREAM_ATTEMPT_OUTCOMES[number]

/** A circuit breaker's state as the gauge shows it. */
export const BREAKER_GAUGE = { closed: 0, half_open: 1, open: 2 } as const

/**
 * The service's Prometheus metrics, one registry per running service (tests
 * run several in one process). Recording is a synchronous increment: nothing
 * on a request's path waits for it.
 */
export class Metrics extends Effect.Service<Metrics>()("nenas/Metrics", {
  sync: () => {
    const registry = new Registry()
    const registers = [registry]
    return {
      registry,
      requests: new Counter({
        name: "nenas_http_requests_total",
        help: "HTTP requests answered, by route pattern, method and status.",
        labelNames: ["route", "method", "status"] as const,
        registers
      }),
      requestDuration: new Histogram({
        name: "nenas_http_request_duration_seconds",
        help: "Time to answer an HTTP request (to the end of a streamed body), by route pattern.",
        labelNames: ["route"] as const,
        buckets: LATENCY_BUCKETS,
        registers
      }),
      upstreamLatency: new Histogram({
        name: "nenas_upstream_latency_seconds",
        help: "Upstream model latency: to the answer (complete) or to the stream's opening (first_byte).",
        labelNames: ["phase", "outcome"] as const,
        buckets: LATENCY_BUCKETS,
        registers
      }),
      upstreamAttempts: new Counter<"target" | "outcome">({
        name: "nenas_upstream_attempts_total",
        help:
          "Attempts at an upstream target (`upstream/model`), by outcome (ok, refused, rate_limited, server_error, connection_error, first_byte_timeout, cut_short, breaker_open).",
        labelNames: ["target", "outcome"] as const,
        registers
      }),
      upstreamAttemptLatency: new Histogram<"target" | "outcome">({
        name: "nenas_upstream_attempt_duration_seconds",
        help: "Time from an attempt's request to its first byte or its failure, by target and outcome.",
        labelNames: ["target", "outcome"] as const,
        buckets: LATENCY_BUCKETS,
        registers
      }),
      upstreamBreakerState: new Gauge<"target">({
        name: "nenas_upstream_breaker_state",
        help:
          "Each target's circuit breaker: 0 closed, 1 half-open, 2 open (shared through Redis when REDIS_URL is set).",
        labelNames: ["target"] as const,
        registers
      }),
      webhookEvents: new Counter({
        name: "nenas_webhook_events_total",
        help: "Stripe webhook events received, by event type and result (processed, ignored, rejected, failed).",
        labelNames: ["type", "result"] as const,
        registers
      }),
      settlementQueueDepth: new Gauge({
        name: "nenas_settlement_queue_depth",
        help: "Settlements (captures, releases, grant charges, log rows) queued on this instance, not yet written.",
        registers
      }),
      settlementFlushDuration: new Histogram({
        name: "nenas_settlement_flush_duration_seconds",
        help: "Time to write one batch of settlements (one transaction), by outcome (ok, error).",
        labelNames: ["outcome"] as const,
        buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5],
        registers
      }),
      settlementParked: new Counter({
        name: "nenas_settlement_parked_total",
        help:
          "Settlements the database kept refusing, parked in settlement_parked for `npm run settlement:replay`, by kind (dropped: not even parking was taken).",
        labelNames: ["kind"] as const,
        registers
      }),
      settlementClamped: new Counter({
        name: "nenas_settlement_clamped_total",
        help:
          "Settlement values out of their column's range (e.g. tokens over 2^31 - 1), clamped before writing, by field.",
        labelNames: ["field"] as const,
        registers
      }),
      grantsHeld: new Gauge({
        name: "nenas_credit_grants_held_micro_myr",
        help: "Credit this instance holds in grants and has not lent to a call (micro-MYR).",
        registers
      }),
      listenConnected: new Gauge({
        name: "nenas_listen_connected",
        help:
          "1 while this instance's LISTEN connection hears the database's announcements (key changes, grant requests), else 0.",
        registers
      }),
      listenReconnects: new Counter({
        name: "nenas_listen_reconnects_total",
        help: "Times this instance's LISTEN connection was lost and made again.",
        registers
      }),
      keyLookups: new Counter({
        name: "nenas_key_lookups_total",
        help: "API key lookups, by where they were answered (memory, database).",
        labelNames: ["source"] as const,
        registers
      }),
      billingShortfall: new Counter({
        name: "nenas_billing_shortfall_micro_myr_total",
        help:
          "Cost of answers given that the wallet could not pay (micro-MYR): a stream whose hold was taken back while this instance stalled.",
        registers
      }),
      eInvoicesOverdue: new Gauge({
        name: "nenas_e_invoices_overdue",
        help: "E-invoices not valid 24 hours after their issue (pending, submitted or invalid), read at scrape time.",
        registers
      }),
      walletHoldsOpen: new Gauge({
        name: "nenas_wallet_holds_open",
        help: "Open wallet reservations (calls in flight across every instance), read at scrape time.",
        registers
      })
    }
  }
}) {}

/** The Prometheus text exposition of every metric, with gauges read now: open holds, and breakers not closed (every other target shown closed). */
export const renderMetrics = (
  readHoldsOpen: Effect.Effect<number, unknown>,
  readBreakers: Effect.Effect<ReadonlyArray<{ readonly target: string; readonly state: keyof typeof BREAKER_GAUGE }>> =
    Effect.succeed([])
) =>
  Effect.gen(function*() {
    const metrics = yield* Metrics
    const holds = yield* Effect.either(readHoldsOpen)
    if (holds._tag === "Right") metrics.walletHoldsOpen.set(holds.right)
    const breakers = yield* readBreakers
    const shown = yield* Effect.promise(() => metrics.upstreamBreakerState.get())
    for (const { labels } of shown.values) {
      if (labels.target !== undefined) metrics.upstreamBreakerState.set({ target: labels.target }, 0)
    }
    for (const { state, target } of breakers) metrics.upstreamBreakerState.set({ target }, BREAKER_GAUGE[state])
    return yield* Effect.promise(() => metrics.registry.metrics())
  })
