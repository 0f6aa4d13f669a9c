/**
 * The statements that keep `usage_rollups` (created in 0011, widened in 0027 and 0029): each counter of a rollup row
 * is a sum over request logs. A statement that writes logs stages its net change (new rows minus old rows,
 * signed by `s`) in `usage_rollup_deltas`; one deferred statement folds a transaction's deltas in at commit.
 */

/** One counter: its column, and its value for one log row signed by `s` (+1 a row that is there now, -1 one that was). */
export interface RollupCounter {
  readonly name: string
  readonly of: (s: string) => string
}

/** The counters 0011 made. */
export const FIRST_COUNTERS: ReadonlyArray<RollupCounter> = [
  { name: "requests", of: (s) => s },
  { name: "pending", of: (s) => `${s} * (status = 'pending')::int` },
  { name: "succeeded", of: (s) => `${s} * (status = 'succeeded')::int` },
  { name: "failed", of: (s) => `${s} * (status = 'failed')::int` },
  { name: "billed", of: (s) => `${s} * (status = 'billed')::int` },
  { name: "input_tokens", of: (s) => `${s} * input_tokens::bigint` },
  { name: "output_tokens", of: (s) => `${s} * output_tokens::bigint` },
  { name: "reasoning_tokens", of: (s) => `${s} * reasoning_tokens::bigint` },
  { name: "cached_tokens", of: (s) => `${s} * cached_tokens::bigint` },
  { name: "search_count", of: (s) => `${s} * search_count::bigint` },
  { name: "content_pages", of: (s) => `${s} * content_pages::bigint` },
  { name: "cost_micro_myr", of: (s) => `${s} * cost_micro_myr` }
]

/** The counters 0027 added: cache hits, and what they saved. */
export const CACHE_COUNTERS: ReadonlyArray<RollupCounter> = [
  { name: "cache_hits", of: (s) => `${s} * (cache IS NOT DISTINCT FROM 'hit')::int` },
  { name: "cache_saved_micro_myr", of: (s) => `${s} * cache_saved_micro_myr` }
]

/** The counters 0029 added: calls answered on a team's own provider key, and their fees. */
export const OWN_KEY_COUNTERS: ReadonlyArray<RollupCounter> = [
  { name: "byok_calls", of: (s) => `${s} * (provider_key_id IS NOT NULL)::int` },
  { name: "byok_fee_micro_myr", of: (s) => `${s} * byok_fee_micro_myr` }
]

export const ROLLUP_KEY = "account_id, bucket, api_key_id, environment, endpoint"
const BUCKET = "date_bin('30 minutes', created_at, timestamptz '1970-01-01 00:00:00+00')"

/** Rows `(s, …log columns)` of a transition table, summed per rollup key, all-zero groups left out. */
export const rollupDeltas = (counters: ReadonlyArray<RollupCounter>, rows: string) => `
  SELECT account_id, ${BUCKET} AS bucket, api_key_id, environment, endpoint,
    ${counters.map((c) => `sum(${c.of("s")})::bigint AS ${c.name}`).join(", ")}
  FROM (${rows}) r
  GROUP BY account_id, ${BUCKET}, api_key_id, environment, endpoint
  HAVING ${counters.map((c) => `sum(${c.of("s")}) <> 0`).join(" OR ")}`

const names = (counters: ReadonlyArray<RollupCounter>) => counters.map((c) => c.name).join(", ")

const stage = (counters: ReadonlyArray<RollupCounter>, create: string, name: string, rows: string) => `
${create} FUNCTION ${name}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO usage_rollup_deltas (${ROLLUP_KEY}, ${names(counters)}) ${rollupDeltas(counters, rows)};
  RETURN NULL;
END $$;`

/** The three staging functions and the fold, for `counters`; `create` is `CREATE` or `CREATE OR REPLACE`. */
export const rollupFunctions = (counters: ReadonlyArray<RollupCounter>, create: string) => `
${stage(counters, create, "usage_rollups_stage_insert", "SELECT 1 AS s, * FROM new_rows")}
${
  stage(
    counters,
    create,
    "usage_rollups_stage_update",
    "SELECT 1 AS s, * FROM new_rows UNION ALL SELECT -1, * FROM old_rows"
  )
}
${stage(counters, create, "usage_rollups_stage_delete", "SELECT -1 AS s, * FROM old_rows")}

-- The first firing at commit folds every delta of the transaction; later firings find none.
${create} FUNCTION usage_rollups_fold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  WITH mine AS (DELETE FROM usage_rollup_deltas WHERE txid = pg_current_xact_id() RETURNING *)
  INSERT INTO usage_rollups (${ROLLUP_KEY}, ${names(counters)})
  SELECT ${ROLLUP_KEY}, ${counters.map((c) => `sum(${c.name})`).join(", ")}
  FROM mine GROUP BY ${ROLLUP_KEY} ORDER BY ${ROLLUP_KEY}
  ON CONFLICT (${ROLLUP_KEY}) DO UPDATE SET
    ${counters.map((c) => `${c.name} = usage_rollups.${c.name} + EXCLUDED.${c.name}`).join(",\n    ")};
  RETURN NULL;
END $$;`
