/**
 * `npm run bench:spreads`: what an object spread costs on the running Node
 * (docs/performance.md, "What kept a request's objects through young collections").
 * Node 20's V8 builds a spread that adds a field its source lacks
 * (`{ ...log, billedAt }`) on a slow path; Node 22's does not. A call's log row, its
 * settlement and some of Effect's own values are built so. Each shape is timed
 * over a million objects, twice, from a 3-field and a 20-field source; run it
 * with each Node to compare (`PATH=<node 22>/bin:$PATH npm run bench:spreads`).
 */
const small = { requestId: "req_1", accountId: "acc_1", costMicroMyr: 0 }
const large = {
  requestId: "req_1",
  accountId: "acc_1",
  apiKeyId: "key_1",
  memberId: null,
  endpoint: "/v1/chat/completions",
  publicModel: "svc/nenas-flash",
  upstreamModel: "gpt-4.1-mini",
  inputTokens: 10,
  cachedTokens: 0,
  outputTokens: 16,
  reasoningTokens: 0,
  searchQueries: 0,
  contentPages: 0,
  costMicroMyr: 0,
  latencyMs: 12,
  status: "pending",
  errorCode: null,
  reservationId: null,
  createdAt: new Date(0),
  completedAt: null
}

type Source = typeof small | typeof large

const SHAPES: ReadonlyArray<readonly [string, (source: Source, n: number) => { readonly costMicroMyr: number }]> = [
  ["{ ...source }", (source) => ({ ...source })],
  ["{ ...source, costMicroMyr } (a field it has)", (source, n) => ({ ...source, costMicroMyr: n })],
  ["{ ...source, billedAt } (a field it lacks)", (source, n) => ({ ...source, billedAt: n, costMicroMyr: n })],
  ["{ ...source, ...{ billedAt } }", (source, n) => ({ ...source, ...{ billedAt: n, costMicroMyr: n } })],
  [
    "Object.assign({}, source, { billedAt })",
    (source, n) => Object.assign({}, source, { billedAt: n, costMicroMyr: n })
  ]
]

const COUNT = 1_000_000

const timeOf = (shape: (source: Source, n: number) => { readonly costMicroMyr: number }, source: Source): number => {
  let sink = 0
  const started = performance.now()
  for (let n = 0; n < COUNT; n++) sink += shape(source, n).costMicroMyr
  const elapsed = performance.now() - started
  // Read, so that the loop is not optimised away.
  if (sink < 0) console.log(sink)
  return (elapsed * 1000) / COUNT
}

console.log(`Node ${process.version}: µs an object (best of two runs of ${COUNT.toLocaleString("en")})`)
console.log(`${"shape".padEnd(46)} ${"3 fields".padStart(9)} ${"20 fields".padStart(10)}`)
for (const [name, shape] of SHAPES) {
  const [few, many] = [small, large].map((source) => Math.min(timeOf(shape, source), timeOf(shape, source)))
  console.log(`${name.padEnd(46)} ${few!.toFixed(3).padStart(9)} ${many!.toFixed(3).padStart(10)}`)
}
