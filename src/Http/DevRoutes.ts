import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import { Effect, Option } from "effect"
import ipaddr from "ipaddr.js"
import type { AppConfigShape } from "../AppConfig.js"
import { NotFound } from "../Domain/Errors.js"

/** The development routes: sign-in, its JWKS, the mailbox and the simulated checkout. */
export const isDevPath = (pathname: string): boolean => pathname === "/dev" || pathname.startsWith("/dev/")

/** `Forwarded` or any `X-Forwarded-*`: a proxy passed the request on, whoever sent it to the proxy. */
export const isForwarded = (headers: Readonly<Record<string, string | undefined>>): boolean =>
  Object.keys(headers).some((name) => {
    const lower = name.toLowerCase()
    return lower === "forwarded" || lower.startsWith("x-forwarded-")
  })

const isLoopbackPeer = (peer: string | undefined): boolean =>
  peer !== undefined && ipaddr.isValid(peer) && ipaddr.process(peer).range() === "loopback"

/**
 * Whether a development route may answer: to a loopback peer whose request no
 * proxy passed on (a reverse proxy on the same host is a loopback peer too,
 * for anyone on the internet), or anyone with `DEV_AUTH=1` outside production.
 */
export const devRouteAllowed = (
  request: { readonly peer: string | undefined; readonly headers: Readonly<Record<string, string | undefined>> },
  config: Pick<AppConfigShape, "devAuth" | "production">
): boolean =>
  (Option.contains(config.devAuth, true) && !config.production) ||
  (isLoopbackPeer(request.peer) && !isForwarded(request.headers))

/** The answer to a development route that may not answer: 404, as if it did not exist, saying why to whoever runs it. */
export const devRouteRefusal = new NotFound({
  message: "Development routes answer only to a request from this machine that no proxy forwarded " +
    "(no Forwarded or X-Forwarded-* header), or with DEV_AUTH=1."
})

/** Refuses the current request when it is for a development route that may not answer it. */
export const guardDevRoutes = (config: Pick<AppConfigShape, "devAuth" | "production">) =>
  Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) => {
    const pathname = request.url.split("?", 1)[0] ?? ""
    if (!isDevPath(pathname)) return Effect.void
    const peer = Option.getOrUndefined(request.remoteAddress)
    return devRouteAllowed({ peer, headers: request.headers }, config) ? Effect.void : Effect.fail(devRouteRefusal)
  })
