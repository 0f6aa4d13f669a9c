import type { MailRow } from "../Outbox/Mail.js"

const escape = (text: string) =>
  text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;", "'": "&#39;" })[c] ?? c)

/** The development mailbox as a page: newest first, each email whole, as it would have been sent. */
export const mailboxPage = (messages: ReadonlyArray<MailRow>): string =>
  `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Development mailbox · nenas</title>
<style>body{font:15px/1.5 system-ui,sans-serif;max-width:760px;margin:2rem auto;padding:0 1rem;color:#1b1f24}
article{border:1px solid #d0d7de;border-radius:8px;padding:1rem;margin:1rem 0}h2{font-size:1.05rem;margin:0 0 .25rem}
.meta{color:#57606a;font-size:.85rem}pre{white-space:pre-wrap;font:inherit}</style></head>
<body><h1>Development mailbox</h1>
<p class="meta">SMTP_URL is not set: alert emails are kept here instead of being sent.</p>
${
    messages.length === 0 ? "<p>No emails yet.</p>" : messages.map((m) =>
      `<article>
<h2>${escape(m.subject)}</h2>
<div class="meta">To ${escape(m.toAddress)} · ${m.createdAt.toISOString()}</div>
<pre>${escape(m.body)}</pre></article>`
    ).join("\n")
  }
</body></html>`
