import { Context, Effect, Layer } from "effect"
import { createServer, type IncomingMessage, type ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"

/** A span as an OTLP/HTTP JSON export carries it, its attributes read back to plain values. */
export interface ReceivedSpan {
  readonly name: string
  readonly traceId: string
  readonly spanId: string
  readonly parentSpanId: string | undefined
  readonly kind: number
  readonly attributes: Readonly<Record<string, unknown>>
}

type AnyValue = {
  readonly stringValue?: string
  readonly boolValue?: boolean
  readonly intValue?: string | number
  readonly doubleValue?: number
  readonly arrayValue?: { readonly values?: ReadonlyArray<AnyValue> }
}

const valueOf = (value: AnyValue): unknown =>
  value.stringValue ?? value.boolValue ?? (value.intValue !== undefined ? Number(value.intValue) : undefined) ??
    value.doubleValue ?? value.arrayValue?.values?.map(valueOf)

interface Export {
  readonly resourceSpans?: ReadonlyArray<{
    readonly scopeSpans?: ReadonlyArray<{
      readonly spans?: ReadonlyArray<{
        readonly name: string
        readonly traceId: string
        readonly spanId: string
        readonly parentSpanId?: string
        readonly kind: number
        readonly attributes?: ReadonlyArray<{ readonly key: string; readonly value: AnyValue }>
      }>
    }>
  }>
}

const spansOf = (body: Export): ReadonlyArray<ReceivedSpan> =>
  (body.resourceSpans ?? []).flatMap((resource) =>
    (resource.scopeSpans ?? []).flatMap((scope) =>
      (scope.spans ?? []).map((span) => ({
        name: span.name,
        traceId: span.traceId,
        spanId: span.spanId,
        parentSpanId: span.parentSpanId === "" ? undefined : span.parentSpanId,
        kind: span.kind,
        attributes: Object.fromEntries((span.attributes ?? []).map(({ key, value }) => [key, valueOf(value)]))
      }))
    )
  )

export interface OtlpReceiverShape {
  /** What `OTEL_EXPORTER_OTLP_ENDPOINT` names: the exporter appends `/v1/traces`. */
  readonly endpoint: string
  /** Every span received so far. */
  readonly spans: ReadonlyArray<ReceivedSpan>
  /** The raw bodies received, for checks on everything exported. */
  readonly bodies: ReadonlyArray<string>
}

/**
 * An OpenTelemetry collector's OTLP/HTTP traces endpoint, on loopback: the
 * stand-in for Langfuse, Phoenix or Datadog's agent. It keeps every span it
 * is sent, in memory.
 */
export class OtlpReceiver extends Context.Tag("test/OtlpReceiver")<OtlpReceiver, OtlpReceiverShape>() {
  static readonly layer: Layer.Layer<OtlpReceiver> = Layer.scoped(
    OtlpReceiver,
    Effect.acquireRelease(
      Effect.async<{ readonly receiver: OtlpReceiverShape; readonly close: () => Promise<void> }>((resume) => {
        const spans: Array<ReceivedSpan> = []
        const bodies: Array<string> = []
        const server = createServer((request: IncomingMessage, response: ServerResponse) => {
          const chunks: Array<Buffer> = []
          request.on("data", (chunk: Buffer) => chunks.push(chunk))
          request.on("end", () => {
            const text = Buffer.concat(chunks).toString("utf8")
            if (request.method === "POST" && request.url === "/v1/traces") {
              bodies.push(text)
              spans.push(...spansOf(JSON.parse(text) as Export))
            }
            response.writeHead(200, { "content-type": "application/json" }).end("{}")
          })
        })
        server.listen(0, "127.0.0.1", () => {
          const { port } = server.address() as AddressInfo
          resume(Effect.succeed({
            receiver: { endpoint: `http://127.0.0.1:${port}`, spans, bodies },
            close: () => new Promise<void>((done) => server.close(() => done()))
          }))
        })
      }),
      ({ close }) => Effect.promise(close)
    ).pipe(Effect.map(({ receiver }) => receiver))
  )
}
