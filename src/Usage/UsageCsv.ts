import { microMyr, toMyrString } from "../Domain/Money.js"
import { csvField, csvLine } from "../Logs/LogsCsv.js"

export const USAGE_COLUMNS = [
  "bucket",
  "requests",
  "cost_myr",
  "cost_micro_myr",
  "input_tokens",
  "output_tokens",
  "reasoning_tokens"
] as const

export interface UsageLine {
  readonly bucket: string
  readonly requests: number
  readonly costMicroMyr: number
  readonly inputTokens: number
  readonly outputTokens: number
  readonly reasoningTokens: number
}

export const usageCsv = (points: ReadonlyArray<UsageLine>): string =>
  csvLine([...USAGE_COLUMNS]) + points.map((point) =>
    csvLine([
      csvField(point.bucket),
      csvField(point.requests),
      csvField(toMyrString(microMyr(point.costMicroMyr))),
      csvField(point.costMicroMyr),
      csvField(point.inputTokens),
      csvField(point.outputTokens),
      csvField(point.reasoningTokens)
    ])
  ).join("")
