/**
 * PostgreSQL's work per call: transactions of the service's database
 * (pg_stat_database) and WAL bytes (pg_current_wal_lsn) around each window in
 * which peers.mjs drives the service, divided by the calls that reached the
 * fake upstream in that window.
 */
import { readFile } from "node:fs/promises"
import { join } from "node:path"
import pg from "pg"
import { embeddedClusterLocation } from "../src/Database/EmbeddedPostgres.js"
import { log, sleep } from "./processes.js"

/**
 * A backend flushes its statistics at most once a second and, when it goes idle
 * within a second of its last flush, holds them up to PGSTAT_IDLE_INTERVAL
 * (10 s): transaction counts are read once that has passed.
 */
const STATS_SETTLE_MS = 11_000
/** Captures and logs may be written in batches after the response: the WAL is read this long after a window. */
const WRITE_SETTLE_MS = 200

export interface Counters {
  /** Date.now() of the reading. */
  readonly at: number
  readonly transactions: number
  readonly walBytes: number
  /** Chat calls the fake upstream has answered since it started. */
  readonly upstreamCalls: number
}

export class DatabaseCounters {
  private constructor(
    private readonly client: pg.Client,
    private readonly database: string,
    private readonly upstream: string
  ) {}

  /** A client of our own in the `postgres` database, so that its queries are not counted as the service's. */
  static async connect(config: pg.ClientConfig, database: string, upstream: string) {
    const client = new pg.Client({ ...config, application_name: "nenas-bench" })
    // A PostgreSQL that goes away under the bench fails the next reading (reported), not the whole process and its clean-up.
    client.on("error", (error) => log(`PostgreSQL readings' connection failed: ${error.message}`))
    await client.connect()
    const counters = new DatabaseCounters(client, database, upstream)
    await counters.read()
    return counters
  }

  /** The embedded cluster of a service started with `DATA_DIR=dataDir`, from what it keeps there. */
  static async embedded(dataDir: string, upstream: string) {
    const credentials = JSON.parse(await readFile(join(dataDir, "pg-credentials.json"), "utf8")) as {
      readonly user: string
      readonly password: string
    }
    const { clusterDir } = await embeddedClusterLocation(dataDir)
    const port = Number((await readFile(join(clusterDir, "postmaster.pid"), "utf8")).split("\n")[3])
    return DatabaseCounters.connect(
      { host: "127.0.0.1", port, user: credentials.user, password: credentials.password, database: "postgres" },
      "nenas",
      upstream
    )
  }

  async read(): Promise<Counters> {
    const [{ rows }, upstreamCalls] = await Promise.all([
      this.client.query<{ transactions: string | null; wal: string }>(
        `SELECT (SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1) AS transactions,
                pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS wal`,
        [this.database]
      ),
      fetch(`${this.upstream}/healthz`).then((reply) => reply.json() as Promise<{ requests: number }>)
    ])
    const row = rows[0]
    if (row?.transactions === null || row === undefined) throw new Error(`no pg_stat_database row for ${this.database}`)
    return {
      at: Date.now(),
      transactions: Number(row.transactions),
      walBytes: Number(row.wal),
      upstreamCalls: upstreamCalls.requests
    }
  }

  end() {
    return this.client.end()
  }
}

/** One window: from the start of the service's warm-up to the end of its measured seconds. */
interface Window {
  readonly before: Counters
  readonly after: Counters
  /** When the transaction count is complete: STATS_SETTLE_MS after the window, or the next window's start. */
  settled?: Counters
  readonly settleAt: number
}

/** The transactions the service makes on its own (sweeps, heartbeats), per second. */
export interface Background {
  readonly transactionsPerSecond: number
}

export interface WindowTotals {
  readonly windows: number
  readonly calls: number
  /** Net of the background over the seconds each window's count spans (to its settled reading). */
  readonly transactions: number
  /** As read WRITE_SETTLE_MS after each window (the idle WAL rate swings with autovacuum: it is not subtracted). */
  readonly walBytes: number
  /** As read, background included. */
  readonly rawTransactions: number
  /** Transactions visible WRITE_SETTLE_MS after the windows, background included (backends still held the rest). */
  readonly transactionsSeenEarly: number
  readonly background: Background
}

/**
 * Readings around each window of one peers.mjs run; the span from `begin`
 * to the first window (the peers' own targets run, the service idles) gives
 * the background. Events are handled in order; `finish` waits for the last
 * settled reading.
 */
export class WindowTracker {
  private readonly windows: Array<Window> = []
  private idleFrom: Counters | undefined
  private background: Background | undefined
  private open: Counters | undefined
  private queue: Promise<void> = Promise.resolve()
  private failure: unknown
  private readonly timers: Array<NodeJS.Timeout> = []

  constructor(private readonly counters: DatabaseCounters) {}

  private enqueue(step: () => Promise<void>) {
    this.queue = this.queue.then(step).catch((error: unknown) => {
      this.failure ??= error
    })
  }

  /** Before peers.mjs starts, with the service idle and its last window's statistics flushed. */
  async begin() {
    this.idleFrom = await this.counters.read()
  }

  /** The service's warm-up began. */
  started() {
    this.enqueue(async () => {
      const now = await this.counters.read()
      if (this.background === undefined && this.idleFrom !== undefined) {
        const seconds = Math.max(1, now.at - this.idleFrom.at) / 1000
        this.background = { transactionsPerSecond: (now.transactions - this.idleFrom.transactions) / seconds }
      }
      // The previous window's transactions are as complete as they get before this one adds to them.
      for (const window of this.windows) window.settled ??= now
      this.open = now
    })
  }

  /** The service's measured seconds ended. */
  ended() {
    this.enqueue(async () => {
      const before = this.open
      if (before === undefined) return
      this.open = undefined
      await sleep(WRITE_SETTLE_MS)
      const after = await this.counters.read()
      const window: Window = { before, after, settleAt: after.at + STATS_SETTLE_MS - WRITE_SETTLE_MS }
      this.windows.push(window)
      this.timers.push(setTimeout(() => this.enqueue(() => this.settle(window)), window.settleAt - Date.now()))
    })
  }

  private async settle(window: Window) {
    if (window.settled === undefined) window.settled = await this.counters.read()
  }

  async finish(): Promise<WindowTotals> {
    await this.queue
    if (this.failure !== undefined) throw this.failure
    for (const timer of this.timers) clearTimeout(timer)
    for (const window of this.windows) {
      if (window.settled !== undefined) continue
      await sleep(window.settleAt - Date.now())
      await this.settle(window)
    }
    const background = this.background ?? { transactionsPerSecond: NaN }
    const sum = (pick: (window: Window) => number) => this.windows.reduce((total, window) => total + pick(window), 0)
    const settled = (w: Window) => w.settled ?? w.after
    const rawTransactions = sum((w) => settled(w).transactions - w.before.transactions)
    return {
      windows: this.windows.length,
      calls: sum((w) => w.after.upstreamCalls - w.before.upstreamCalls),
      transactions: rawTransactions -
        background.transactionsPerSecond * sum((w) => (settled(w).at - w.before.at) / 1000),
      walBytes: sum((w) => w.after.walBytes - w.before.walBytes),
      rawTransactions,
      transactionsSeenEarly: sum((w) => w.after.transactions - w.before.transactions),
      background
    }
  }
}
