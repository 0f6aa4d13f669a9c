import { Effect, Either, Schema } from "effect"
import { describe, expect, it } from "vitest"
import type { ApiError } from "../../src/Domain/Errors.js"
import { AnthropicCountTokensRequest, AnthropicMessagesRequest } from "../../src/Models/Anthropic/AnthropicApi.js"
import { anthropicCallInput, anthropicConversation } from "../../src/Models/Anthropic/AnthropicInput.js"
import { anthropicTokenCount } from "../../src/Models/Anthropic/AnthropicWire.js"
import { countInput } from "../../src/Models/Call/Estimate.js"

/**
 * Anthropic's Messages API translated, without a database or a server: request bodies to the
 * upstream's chat conversation and the call's fields (answers: anthropicAnswers.test.ts).
 */

const MODEL = "svc/nenas-flash"
const decode = Schema.decodeUnknownSync(AnthropicMessagesRequest)
const PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
const WEATHER = { type: "object", properties: { city: { type: "string" } }, required: ["city"] }
const weatherTool = { name: "get_weather", description: "Weather in a city", input_schema: WEATHER }
const weatherFunction = {
  type: "function",
  function: { name: "get_weather", description: "Weather in a city", parameters: WEATHER }
}

const withTools = (toolChoice: unknown) => ({ tools: [weatherTool], tool_choice: toolChoice })
const chosen = (toolChoice: unknown) => ({ capabilities: { tools: [weatherFunction], toolChoice } })
const userBlocks = (...blocks: ReadonlyArray<unknown>) => ({ messages: [{ role: "user", content: blocks }] })

const body = (fields: Record<string, unknown>) =>
  decode({ model: MODEL, max_tokens: 1024, messages: [{ role: "user", content: "Hi" }], ...fields })

/** The call a body becomes, or its error. */
const translate = (fields: Record<string, unknown>) => Effect.runSync(Effect.either(anthropicCallInput(body(fields))))
const callOf = (fields: Record<string, unknown>) => {
  const result = translate(fields)
  if (Either.isLeft(result)) throw new Error(`expected a call, got ${result.left._tag}: ${result.left.message}`)
  return result.right
}

const toolTurns = [
  { role: "user", content: "Weather in Ipoh?" },
  {
    role: "assistant",
    content: [
      { type: "thinking", thinking: "Use the tool.", signature: "sig" },
      { type: "text", text: "Checking." },
      { type: "tool_use", id: "toolu_01", name: "get_weather", input: { city: "Ipoh" } }
    ]
  },
  {
    role: "user",
    content: [
      { type: "tool_result", tool_use_id: "toolu_01", content: [{ type: "text", text: "31°C" }] },
      { type: "text", text: "And tomorrow?" }
    ]
  }
]

describe("Anthropic requests become the upstream's chat conversation", () => {
  const cases: ReadonlyArray<
    { readonly name: string; readonly fields: Record<string, unknown>; readonly upstream: unknown }
  > = [
    {
      name: "system as a string, first",
      fields: { system: "Be brief.", messages: [{ role: "user", content: "Hi" }] },
      upstream: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" }]
    },
    {
      name: "system as text blocks with cache_control, joined",
      fields: {
        system: [{ type: "text", text: "You are Claude Code." }, {
          type: "text",
          text: "Be brief.",
          cache_control: { type: "ephemeral" }
        }]
      },
      upstream: [{ role: "system", content: "You are Claude Code.\n\nBe brief." }, { role: "user", content: "Hi" }]
    },
    {
      name: "a multi-turn conversation",
      fields: {
        messages: [
          { role: "user", content: [{ type: "text", text: "Hi" }] },
          { role: "assistant", content: [{ type: "text", text: "Hello" }, { type: "text", text: " there." }] },
          { role: "user", content: "Bye" }
        ]
      },
      upstream: [{ role: "user", content: "Hi" }, { role: "assistant", content: "Hello there." }, {
        role: "user",
        content: "Bye"
      }]
    },
    {
      name: "a system message inside messages, as Claude Code sends it, kept in place",
      fields: { messages: [{ role: "system", content: "Rules." }, { role: "user", content: "Hi" }] },
      upstream: [{ role: "system", content: "Rules." }, { role: "user", content: "Hi" }]
    },
    {
      name: "images: base64 as a data: URL, url as it is",
      fields: {
        messages: [{
          role: "user",
          content: [
            { type: "image", source: { type: "base64", media_type: "image/png", data: PNG } },
            { type: "image", source: { type: "url", url: "https://example.com/cat.jpg" } },
            { type: "text", text: "What are these?" }
          ]
        }]
      },
      upstream: [{
        role: "user",
        content: [
          { type: "image_url", image_url: { url: `data:image/png;base64,${PNG}` } },
          { type: "image_url", image_url: { url: "https://example.com/cat.jpg" } },
          { type: "text", text: "What are these?" }
        ]
      }]
    },
    {
      name: "a tool round trip: thinking dropped, tool_use as tool_calls, tool_result as a tool message",
      fields: { tools: [weatherTool], messages: toolTurns },
      upstream: [
        { role: "user", content: "Weather in Ipoh?" },
        {
          role: "assistant",
          content: "Checking.",
          tool_calls: [{
            id: "toolu_01",
            type: "function",
            function: { name: "get_weather", arguments: "{\"city\":\"Ipoh\"}" }
          }]
        },
        { role: "tool", tool_call_id: "toolu_01", content: "31°C" },
        { role: "user", content: "And tomorrow?" }
      ]
    },
    {
      name: "a failed tool, and a tool result's image sent after the results",
      fields: {
        tools: [weatherTool],
        messages: [
          { role: "user", content: "Go" },
          {
            role: "assistant",
            content: [
              { type: "tool_use", id: "toolu_a", name: "get_weather", input: {} },
              { type: "tool_use", id: "toolu_b", name: "get_weather", input: { city: "Ipoh" } }
            ]
          },
          {
            role: "user",
            content: [
              { type: "tool_result", tool_use_id: "toolu_a", content: "city is required", is_error: true },
              {
                type: "tool_result",
                tool_use_id: "toolu_b",
                content: [{ type: "image", source: { type: "base64", media_type: "image/jpeg", data: "AAAA" } }]
              }
            ]
          }
        ]
      },
      upstream: [
        { role: "user", content: "Go" },
        {
          role: "assistant",
          content: null,
          tool_calls: [
            { id: "toolu_a", type: "function", function: { name: "get_weather", arguments: "{}" } },
            { id: "toolu_b", type: "function", function: { name: "get_weather", arguments: "{\"city\":\"Ipoh\"}" } }
          ]
        },
        { role: "tool", tool_call_id: "toolu_a", content: "The tool reported an error: city is required" },
        { role: "tool", tool_call_id: "toolu_b", content: "[image 1 of this turn, sent with the next user message]" },
        { role: "user", content: [{ type: "image_url", image_url: { url: "data:image/jpeg;base64,AAAA" } }] }
      ]
    },
    {
      name: "an assistant turn of only thinking is left out",
      fields: {
        messages: [
          { role: "user", content: "Hi" },
          { role: "assistant", content: [{ type: "redacted_thinking", data: "xyz" }] },
          { role: "user", content: "Again" }
        ]
      },
      upstream: [{ role: "user", content: "Hi" }, { role: "user", content: "Again" }]
    }
  ]
  it.each(cases)("$name", ({ fields, upstream }) => {
    expect(callOf(fields).upstream).toEqual(upstream)
  })

  it("keeps the text view for routing, and the remote images for inlining", () => {
    const call = callOf(cases[4]?.fields ?? {})
    expect(call.messages).toEqual([{ role: "user", content: "What are these?" }])
    expect([...(call.remoteImages ?? new Map())]).toEqual([[
      "https://example.com/cat.jpg",
      "messages[0].content[1].source.url"
    ]])
  })
})

describe("Anthropic's fields become the call's", () => {
  const cases: ReadonlyArray<
    { readonly name: string; readonly fields: Record<string, unknown>; readonly call: Record<string, unknown> }
  > = [
    {
      name: "defaults",
      fields: {},
      call: {
        endpoint: "/v1/messages",
        effort: "medium",
        maxOutputTokens: 1024,
        capabilities: {},
        webSearch: undefined,
        stop: undefined,
        stream: false,
        inputParam: "messages"
      }
    },
    { name: "tools, tool_choice auto", fields: withTools({ type: "auto" }), call: chosen("auto") },
    { name: "tool_choice any is required", fields: withTools({ type: "any" }), call: chosen("required") },
    {
      name: "tool_choice tool names the function",
      fields: { tools: [weatherTool], tool_choice: { type: "tool", name: "get_weather" } },
      call: {
        capabilities: { tools: [weatherFunction], toolChoice: { type: "function", function: { name: "get_weather" } } }
      }
    },
    { name: "tool_choice none", fields: withTools({ type: "none" }), call: chosen("none") },
    {
      name: "disable_parallel_tool_use",
      fields: { tools: [weatherTool], tool_choice: { type: "auto", disable_parallel_tool_use: true } },
      call: { capabilities: { tools: [weatherFunction], toolChoice: "auto", parallelToolCalls: false } }
    },
    {
      name: "thinking enabled routes to reasoning",
      fields: { thinking: { type: "enabled", budget_tokens: 2048 } },
      call: { effort: "high" }
    },
    {
      name: "thinking adaptive routes to reasoning",
      fields: { thinking: { type: "adaptive" } },
      call: { effort: "high" }
    },
    {
      name: "thinking disabled leaves it to the router",
      fields: { thinking: { type: "disabled" } },
      call: { effort: "medium" }
    },
    {
      name: "output_config.effort wins over thinking",
      fields: { thinking: { type: "adaptive" }, output_config: { effort: "low" } },
      call: { effort: "low" }
    },
    {
      name: "output_config.effort max is high",
      fields: { output_config: { effort: "max" } },
      call: { effort: "high" }
    },
    {
      name: "output_config.format json_schema is structured output",
      fields: { output_config: { format: { type: "json_schema", schema: WEATHER } } },
      call: {
        capabilities: { responseFormat: { type: "json_schema", json_schema: { name: "output", schema: WEATHER } } }
      }
    },
    { name: "stop_sequences become stop", fields: { stop_sequences: ["END", "###"] }, call: { stop: ["END", "###"] } },
    {
      name: "sampling: temperature and top_p forwarded, top_k not",
      fields: { temperature: 0.2, top_p: 0.9, top_k: 40 },
      call: { temperature: 0.2, topP: 0.9 }
    },
    {
      name: "metadata.user_id is the user and a tag",
      fields: { metadata: { user_id: "u-42" } },
      call: { user: "u-42", metadata: { user_id: "u-42" } }
    },
    {
      name: "stream and the cost cap",
      fields: { stream: true, max_total_cost_myr: 0.5 },
      call: { stream: true, maxTotalCostMyr: 0.5 }
    },
    {
      name: "a web_search server tool turns web search on, max_uses capping the searches",
      fields: {
        tools: [{ type: "web_search_20250305", name: "web_search", max_uses: 8, allowed_domains: ["example.com"] }]
      },
      call: {
        capabilities: {},
        webSearch: { mode: "on", search_depth: "fast", max_results: 5, max_searches: 5 }
      }
    },
    {
      name: "Claude Code's extra fields are ignored",
      fields: {
        context_management: { edits: [{ type: "clear_thinking_20251015", keep: "all" }] },
        output_config: { effort: "medium", task_budget: 3 },
        service_tier: "auto",
        container: "c_1",
        mcp_servers: [{ type: "url", url: "https://mcp.example.com", name: "x" }],
        diagnostics: { enabled: true },
        speed: "fast",
        cache_control: { type: "ephemeral" },
        betas: ["interleaved-thinking-2025-05-14"],
        thinking: { type: "adaptive", display: "summarized" }
      },
      call: { effort: "medium", capabilities: {} }
    }
  ]
  it.each(cases)("$name", ({ call, fields }) => {
    expect(callOf(fields)).toMatchObject(call)
  })
})

describe("invalid Anthropic bodies name their param", () => {
  const cases: ReadonlyArray<
    { readonly name: string; readonly fields: Record<string, unknown>; readonly error: Partial<ApiError> }
  > = [
    {
      name: "another model is not found",
      fields: { model: "claude-sonnet-4-5" },
      error: { _tag: "NotFound", param: "model" }
    },
    {
      name: "a tool_result without its tool_use",
      fields: {
        messages: [{ role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_x", content: "ok" }] }]
      },
      error: { _tag: "InvalidRequest", param: "messages[0].content[0].tool_use_id" }
    },
    {
      name: "an image by file_id",
      fields: userBlocks({ type: "text", text: "x" }, { type: "image", source: { type: "file", file_id: "f_1" } }),
      error: { _tag: "UnsupportedInput", param: "messages[0].content[1].source" }
    },
    {
      name: "an http image URL",
      fields: {
        messages: [{
          role: "user",
          content: [{ type: "image", source: { type: "url", url: "http://example.com/a.png" } }]
        }]
      },
      error: { _tag: "InvalidRequest", param: "messages[0].content[0].source.url" }
    },
    {
      name: "a document block",
      fields: userBlocks({ type: "document", source: { type: "base64", media_type: "application/pdf", data: "JVBE" } }),
      error: { _tag: "UnsupportedInput", param: "messages[0].content[0]" }
    },
    {
      name: "an image in an assistant turn",
      fields: {
        messages: [{
          role: "assistant",
          content: [{ type: "image", source: { type: "url", url: "https://example.com/a.png" } }]
        }]
      },
      error: { _tag: "InvalidRequest", param: "messages[0].content[0]" }
    },
    {
      name: "an empty user turn",
      fields: userBlocks(),
      error: { _tag: "InvalidRequest", param: "messages[0].content" }
    },
    {
      name: "a bash tool",
      fields: { tools: [{ type: "bash_20250124", name: "bash" }] },
      error: { _tag: "UnsupportedInput", param: "tools[0]" }
    },
    {
      name: "tool_choice naming a missing tool",
      fields: { tools: [weatherTool], tool_choice: { type: "tool", name: "nope" } },
      error: { _tag: "InvalidRequest", param: "tool_choice" }
    },
    {
      name: "tool_choice any without tools",
      fields: { tool_choice: { type: "any" } },
      error: { _tag: "InvalidRequest", param: "tool_choice" }
    },
    {
      name: "two tools of one name",
      fields: { tools: [weatherTool, weatherTool] },
      error: { _tag: "InvalidRequest", param: "tools[1]" }
    },
    {
      name: "five stop sequences",
      fields: { stop_sequences: ["a", "b", "c", "d", "e"] },
      error: { _tag: "InvalidRequest", param: "stop_sequences" }
    }
  ]
  it.each(cases)("$name", ({ error, fields }) => {
    const result = translate(fields)
    expect(Either.isLeft(result) && result.left).toMatchObject(error)
  })
})

describe("the Messages schemas", () => {
  it("take Claude Code's and the SDKs' bodies, beta fields included", () => {
    const decoded = decode({
      model: MODEL,
      max_tokens: 32000,
      messages: [{
        role: "user",
        content: [{ type: "text", text: "Hi", cache_control: { type: "ephemeral", ttl: "1h" } }]
      }],
      thinking: { type: "enabled", budget_tokens: 31999 },
      context_management: { edits: [] },
      anthropic_beta: ["x"],
      tools: [{ name: "Bash", input_schema: { type: "object" }, defer_loading: false, eager_input_streaming: true }]
    })
    expect(decoded.max_tokens).toBe(32000)
    expect(decoded.stream).toBe(false)
    const count = Schema.decodeUnknownSync(AnthropicCountTokensRequest)({
      model: MODEL,
      messages: [{ role: "user", content: "Hi" }]
    })
    expect(count.model).toBe(MODEL)
  })

  const bad: ReadonlyArray<readonly [string, Record<string, unknown>, string]> = [
    ["max_tokens is required", { max_tokens: undefined }, "max_tokens"],
    ["max_tokens above 32000", { max_tokens: 32001 }, "max_tokens"],
    ["an unknown role", { messages: [{ role: "tool", content: "x" }] }, "role"],
    ["a text block without text", { messages: [{ role: "user", content: [{ type: "text" }] }] }, "text"],
    ["a custom tool without input_schema", { tools: [{ name: "x" }] }, "input_schema"],
    ["an unknown tool_choice", { tool_choice: { type: "sometimes" } }, "tool_choice"],
    ["temperature above 1", { temperature: 1.5 }, "temperature"]
  ]
  it.each(bad)("refuse %s", (_name, fields, mentioned) => {
    const result = Schema.decodeUnknownEither(AnthropicMessagesRequest)({
      model: MODEL,
      max_tokens: 10,
      messages: [{ role: "user", content: "Hi" }],
      ...fields
    })
    expect(Either.isLeft(result) && result.left.message).toContain(mentioned)
  })

  it("conversation alone, as count_tokens reads it and counts it as the estimate does", () => {
    const conversation = Effect.runSync(anthropicConversation(
      Schema.decodeUnknownSync(AnthropicCountTokensRequest)({
        model: MODEL,
        system: "S",
        messages: [{ role: "user", content: "Hi" }],
        tools: [weatherTool]
      })
    ))
    expect(conversation.upstream).toEqual([{ role: "system", content: "S" }, { role: "user", content: "Hi" }])
    expect(anthropicTokenCount(conversation)).toEqual({
      input_tokens: countInput(conversation.upstream, conversation.capabilities)
    })
    expect(anthropicTokenCount(conversation).input_tokens).toBeGreaterThan(
      anthropicTokenCount({ ...conversation, capabilities: {} }).input_tokens
    )
  })
})
