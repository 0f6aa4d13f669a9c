import { Fragment, useState } from "react"
import { GUARDRAIL_OUTCOMES, LOG_STATUSES, download, type GuardrailOutcome, type LogEntry, type LogStatus } from "../api"
import { DateTime, Empty, Field, Load, Money, PageHeading, Pager } from "../components"
import { formatCount, formatMicroMyrExact, fromLocalInput } from "../format"
import { ExportButton } from "../ExportButton"
import { useApi } from "../session"

const PAGE_SIZE = 25
const ENDPOINTS = ["/v1/responses", "/v1/chat/completions", "/v1/messages"] as const

const ROUTING: Record<string, string> = {
  general: "general (the general model)",
  reasoning: "reasoning (the reasoning model)",
  search: "search (web search, then the model)"
}

/** The stored conversation up to this call's response (kept 30 days unless the call sent `store: false`). */
const Conversation = ({ requestId, responseId }: { requestId: string; responseId: string }) => {
  const [conversation, reload] = useApi("GET /dashboard/logs/{request_id}/conversation", { path: { request_id: requestId } })
  return (
    <section className="conversation" aria-label="Conversation">
      <h3>Conversation <code>{responseId}</code></h3>
      <Load value={conversation} what="the conversation" retry={reload}>
        {(data) => (
          <ol className="conversation-lines">
            {data.lines.map((line, index) => (
              <li key={index} className={`line-${line.role || "other"}`}>
                <strong>{line.kind === "message" || line.kind === "instructions" ? line.role : line.kind}</strong> <span>{line.text}</span>
              </li>
            ))}
          </ol>
        )}
      </Load>
    </section>
  )
}

/** How the response cache answered the call (docs/api/cache.md, "Hits"); null: the call did not ask. */
const CACHE: Record<NonNullable<LogEntry["cache"]>, { readonly badge: string; readonly detail: string }> = {
  hit: { badge: "HIT", detail: "hit: answered from the cache, free" },
  miss: { badge: "MISS", detail: "miss: answered by the model, and stored" },
  bypass: { badge: "BYPASS", detail: "bypass: a call the cache does not keep" }
}

const CacheBadge = ({ cache }: { cache: NonNullable<LogEntry["cache"]> }) => (
  <span className={`badge badge-cache badge-cache-${cache}`} title={`Response cache ${CACHE[cache].detail}`}>
    <span className="visually-hidden">cache </span>{CACHE[cache].badge}
  </span>
)

const DONE: Record<NonNullable<LogEntry["guardrails"]>["rules"][number]["action"], string> = {
  flag: "flagged",
  redact: "redacted",
  block: "blocked"
}

/** The rules that matched the call, each with its count: never the text matched. */
const GuardrailRules = ({ guardrails }: { guardrails: NonNullable<LogEntry["guardrails"]> }) => (
  <section className="log-guardrails" aria-label="Guardrail rules">
    <h3>Guardrail rules</h3>
    <ul className="guardrail-rules">
      {guardrails.rules.map((rule, index) => (
        <li key={index}>
          <code>{rule.rule === rule.type ? rule.rule : `${rule.rule} ${rule.type}`}</code> {DONE[rule.action]} on {rule.direction}:{" "}
          {formatCount(rule.count)} {rule.count === 1 ? "match" : "matches"}
        </li>
      ))}
    </ul>
  </section>
)

const Details = ({ log, keyName }: { log: LogEntry; keyName: string | undefined }) => (
  <>
  <dl className="details">
    <div><dt>Request id</dt><dd><code>{log.requestId}</code></dd></div>
    <div><dt>API key</dt><dd>{keyName ?? <>deleted key <code>{log.apiKeyId}</code></>}</dd></div>
    <div><dt>Model</dt><dd>{log.publicModel}</dd></div>
    <div><dt>Endpoint</dt><dd><code>{log.endpoint}</code>{log.stream ? " (streamed)" : ""}</dd></div>
    <div><dt>Status</dt><dd>{log.status}{log.status === "failed" ? " (nothing was charged)" : ""}</dd></div>
    <div><dt>Routing</dt><dd>{log.routingCategory === null ? "not routed" : ROUTING[log.routingCategory] ?? log.routingCategory}</dd></div>
    <div><dt>Error</dt><dd>{log.errorCode === null ? "none" : <code>{log.errorCode}</code>}</dd></div>
    <div><dt>Input tokens</dt><dd>{formatCount(log.inputTokens)}</dd></div>
    <div><dt>Cached input tokens</dt><dd>{formatCount(log.cachedTokens)}</dd></div>
    <div><dt>Output tokens</dt><dd>{formatCount(log.outputTokens)}</dd></div>
    <div><dt>Reasoning tokens</dt><dd>{formatCount(log.reasoningTokens)}</dd></div>
    <div><dt>Usage counted by</dt><dd>{log.usageSource === "provider" ? "the provider" : "estimate (the provider reported none)"}</dd></div>
    <div><dt>Web searches</dt><dd>{formatCount(log.searchCount)}</dd></div>
    <div><dt>Pages read</dt><dd>{formatCount(log.contentPages)}</dd></div>
    <div><dt>Cost</dt><dd>{formatMicroMyrExact(log.costMicroMyr)}</dd></div>
    <div><dt>Latency</dt><dd>{formatCount(log.latencyMs)} ms</dd></div>
    <div><dt>Time</dt><dd><DateTime iso={log.createdAt} /></dd></div>
    <div><dt>Stored response</dt><dd>{log.storedResponseId === null ? "none" : <code>{log.storedResponseId}</code>}</dd></div>
    <div><dt>Guardrails</dt><dd>{log.guardrails === null ? "none ran" : log.guardrails.outcome}</dd></div>
    <div><dt>Response cache</dt><dd>{log.cache === null ? "not asked" : CACHE[log.cache].detail}</dd></div>
    {log.cacheSourceRequestId === null
      ? null
      : <div><dt>Cached from request</dt><dd><code>{log.cacheSourceRequestId}</code></dd></div>}
    {log.cache === "hit"
      ? <div><dt>Saved by the cache</dt><dd>{formatMicroMyrExact(log.cacheSavedMicroMyr)}</dd></div>
      : null}
    {log.providerKeyId === null
      ? null
      : <div><dt>Answered on your provider key</dt><dd><code>{log.providerKeyId}</code>, fee {formatMicroMyrExact(log.byokFeeMicroMyr)}</dd></div>}
  </dl>
  {log.guardrails === null || log.guardrails.rules.length === 0 ? null : <GuardrailRules guardrails={log.guardrails} />}
  {log.storedResponseId === null ? null : <Conversation requestId={log.requestId} responseId={log.storedResponseId} />}
  </>
)

export const LogsPage = () => {
  const [status, setStatus] = useState<LogStatus | "">("")
  const [keyId, setKeyId] = useState("")
  const [endpoint, setEndpoint] = useState("")
  const [guardrail, setGuardrail] = useState<GuardrailOutcome | "">("")
  const [from, setFrom] = useState("")
  const [to, setTo] = useState("")
  const [page, setPage] = useState(1)
  const [open, setOpen] = useState<string | null>(null)
  const [keys] = useApi("GET /dashboard/api-keys")
  const filters = {
    status: status === "" ? undefined : status,
    api_key_id: keyId === "" ? undefined : keyId,
    endpoint: endpoint === "" ? undefined : endpoint,
    guardrail: guardrail === "" ? undefined : guardrail,
    from: fromLocalInput(from),
    to: fromLocalInput(to)
  }
  const [logs, reload] = useApi("GET /dashboard/logs", { query: { page: String(page), limit: String(PAGE_SIZE), ...filters } })
  // Every filter change starts again at the first page.
  const filter = <A,>(set: (value: A) => void) => (value: A) => {
    set(value)
    setPage(1)
  }
  const filtered = status !== "" || keyId !== "" || endpoint !== "" || guardrail !== "" || from !== "" || to !== ""

  return (
    <>
      <PageHeading title="Logs">
        <button type="button" className="quiet" onClick={reload}>Refresh</button>
        <ExportButton save={(caller) => download("GET /dashboard/logs/export", { caller, query: { ...filters, format: "csv" } }, "nenas-logs.csv")} />
      </PageHeading>
      <form className="filters" aria-label="Filter the logs" onSubmit={(e) => e.preventDefault()}>
        <Field label="Status">
          {(props) => (
            <select {...props} value={status} onChange={(e) => filter(setStatus)(e.target.value as LogStatus | "")}>
              <option value="">Any</option>
              {LOG_STATUSES.map((s) => <option key={s} value={s}>{s}</option>)}
            </select>
          )}
        </Field>
        <Field label="API key">
          {(props) => (
            <select {...props} value={keyId} onChange={(e) => filter(setKeyId)(e.target.value)}>
              <option value="">Any key</option>
              {(keys.data?.keys ?? []).map((key) => <option key={key.id} value={key.id}>{key.name} ({key.prefix}…)</option>)}
            </select>
          )}
        </Field>
        <Field label="Endpoint">
          {(props) => (
            <select {...props} value={endpoint} onChange={(e) => filter(setEndpoint)(e.target.value)}>
              <option value="">Any</option>
              {ENDPOINTS.map((path) => <option key={path} value={path}>{path}</option>)}
            </select>
          )}
        </Field>
        <Field label="Guardrail">
          {(props) => (
            <select {...props} value={guardrail} onChange={(e) => filter(setGuardrail)(GUARDRAIL_OUTCOMES.find((one) => one === e.target.value) ?? "")}>
              <option value="">Any</option>
              {GUARDRAIL_OUTCOMES.map((outcome) => <option key={outcome} value={outcome}>{outcome}</option>)}
            </select>
          )}
        </Field>
        <Field label="From" hint="Your time zone">
          {(props) => <input {...props} type="datetime-local" value={from} onChange={(e) => filter(setFrom)(e.target.value)} />}
        </Field>
        <Field label="To" hint="Your time zone">
          {(props) => <input {...props} type="datetime-local" value={to} onChange={(e) => filter(setTo)(e.target.value)} />}
        </Field>
      </form>
      <Load value={logs} what="the logs" retry={reload}>
        {(data) => (
          <>
            {data.logs.length === 0
              ? <Empty>{filtered ? "No calls match these filters." : page > 1 ? "No more calls." : "No model calls yet. Calls made with your API keys show here."}</Empty>
              : (
                <div className="table-wrap">
                  <table className="logs stack">
                    <thead>
                      <tr>
                        <th scope="col">Time</th><th scope="col">Endpoint</th><th scope="col">Status</th>
                        <th scope="col" className="num">Tokens in / out</th><th scope="col" className="num">Cost</th><th scope="col" className="num">Latency</th>
                      </tr>
                    </thead>
                    <tbody>
                      {data.logs.map((log) => (
                        <Fragment key={log.requestId}>
                          <tr className={open === log.requestId ? "open" : undefined}>
                            <td data-label="Time">
                              <button type="button" className="link" aria-expanded={open === log.requestId}
                                aria-controls={`details-${log.requestId}`}
                                onClick={() => setOpen(open === log.requestId ? null : log.requestId)}>
                                <DateTime iso={log.createdAt} />
                              </button>
                            </td>
                            <td data-label="Endpoint"><code>{log.endpoint}</code></td>
                            <td data-label="Status">
                              <span className="badges">
                                <span className={`badge badge-${log.status}`}>{log.status}</span>
                                {log.cache === null ? null : <CacheBadge cache={log.cache} />}
                              </span>
                            </td>
                            <td className="num" data-label="Tokens in / out">{formatCount(log.inputTokens)} / {formatCount(log.outputTokens)}</td>
                            <td className="num" data-label="Cost"><Money micro={log.costMicroMyr} /></td>
                            <td className="num" data-label="Latency">{formatCount(log.latencyMs)} ms</td>
                          </tr>
                          {open === log.requestId
                            ? <tr id={`details-${log.requestId}`} className="details-row"><td colSpan={6}><Details log={log} keyName={keys.data?.keys.find((key) => key.id === log.apiKeyId)?.name} /></td></tr>
                            : null}
                        </Fragment>
                      ))}
                    </tbody>
                  </table>
                </div>
              )}
            <Pager page={page} hasMore={data.has_more} onPage={setPage} summary={`${formatCount(data.total)} calls`} />
          </>
        )}
      </Load>
    </>
  )
}
