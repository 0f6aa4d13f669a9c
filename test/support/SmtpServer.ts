import { Context, Effect, Layer } from "effect"
import { createServer } from "node:net"
import type { AddressInfo } from "node:net"

export interface ReceivedMail {
  readonly from: string
  readonly to: ReadonlyArray<string>
  /** The message as sent: headers, a blank line, the body. */
  readonly data: string
}

/**
 * A minimal SMTP server on 127.0.0.1 (no TLS, no authentication), enough for
 * `nodemailer` to hand it a message: what an operator's `SMTP_URL` receives.
 */
export class SmtpServer extends Context.Tag("test/SmtpServer")<SmtpServer, {
  readonly url: string
  readonly received: () => ReadonlyArray<ReceivedMail>
}>() {}

export const SmtpServerLive = Layer.scoped(
  SmtpServer,
  Effect.gen(function*() {
    const received: Array<ReceivedMail> = []
    const server = createServer((socket) => {
      let buffer = ""
      let inData = false
      let from = ""
      let to: Array<string> = []
      socket.write("220 test ESMTP\r\n")
      socket.on("data", (chunk) => {
        buffer += chunk.toString("utf8")
        while (true) {
          if (inData) {
            const end = buffer.indexOf("\r\n.\r\n")
            if (end < 0) return
            received.push({ from, to, data: buffer.slice(0, end).replace(/\r\n\.\./g, "\r\n.") })
            buffer = buffer.slice(end + 5)
            inData = false
            socket.write("250 queued\r\n")
            continue
          }
          const line = buffer.indexOf("\r\n")
          if (line < 0) return
          const command = buffer.slice(0, line)
          buffer = buffer.slice(line + 2)
          const verb = command.slice(0, 4).toUpperCase()
          if (verb === "EHLO" || verb === "HELO") socket.write("250 test\r\n")
          else if (verb === "MAIL") {
            from = /<([^>]*)>/.exec(command)?.[1] ?? ""
            to = []
            socket.write("250 ok\r\n")
          } else if (verb === "RCPT") {
            to.push(/<([^>]*)>/.exec(command)?.[1] ?? "")
            socket.write("250 ok\r\n")
          } else if (verb === "DATA") {
            inData = true
            socket.write("354 go on\r\n")
          } else if (verb === "QUIT") socket.end("221 bye\r\n")
          else socket.write("250 ok\r\n")
        }
      })
      socket.on("error", () => undefined)
    })
    yield* Effect.acquireRelease(
      Effect.async<void>((resume) => {
        server.listen(0, "127.0.0.1", () => resume(Effect.void))
      }),
      () =>
        Effect.async<void>((resume) => {
          server.close(() => resume(Effect.void))
        })
    )
    return { url: `smtp://127.0.0.1:${(server.address() as AddressInfo).port}`, received: () => received }
  })
)
