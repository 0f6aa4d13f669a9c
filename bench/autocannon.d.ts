/** The part of autocannon's programmatic API the benchmark uses (the package ships no types). */
declare module "autocannon" {
  import type { EventEmitter } from "node:events"

  export interface Options {
    readonly url: string
    readonly connections?: number
    readonly pipelining?: number
    /** Seconds. */
    readonly duration?: number
    readonly method?: string
    readonly headers?: Record<string, string>
    readonly body?: string
    /** Seconds before a request counts as timed out. */
    readonly timeout?: number
  }

  export interface Histogram {
    readonly average: number
    readonly mean: number
    readonly stddev: number
    readonly min: number
    readonly max: number
    readonly total: number
    readonly p50: number
    readonly p90: number
    readonly p99: number
  }

  export interface Result {
    readonly duration: number
    readonly errors: number
    readonly timeouts: number
    readonly non2xx: number
    readonly resets: number
    readonly statusCodeStats: Record<string, { readonly count: number }>
    /** Milliseconds. */
    readonly latency: Histogram & { readonly totalCount: number }
    /** Per second samples; `total` is the requests completed. */
    readonly requests: Histogram & { readonly sent: number }
    readonly throughput: Histogram
  }

  export interface Instance extends EventEmitter, PromiseLike<Result> {
    stop(): void
  }

  function autocannon(options: Options): Instance
  export default autocannon
}
