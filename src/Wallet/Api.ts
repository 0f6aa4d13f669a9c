import { Schema } from "effect"

/** A wallet's balances as the dashboard reads them, in integer micro-MYR. */
export const Wallet = Schema.Struct({
  availableMicroMyr: Schema.Int,
  reservedMicroMyr: Schema.Int,
  lifetimeTopupMicroMyr: Schema.Int,
  lifetimeSpendMicroMyr: Schema.Int
}).annotations({ identifier: "Wallet" })

export const LedgerType = Schema.Literal("topup", "usage", "refund", "chargeback", "chargeback_reversal", "adjustment")

export const LedgerEntry = Schema.Struct({
  id: Schema.String,
  type: LedgerType,
  amountMicroMyr: Schema.Int,
  balanceAfterMicroMyr: Schema.Int,
  description: Schema.String,
  createdAt: Schema.String
}).annotations({ identifier: "LedgerEntry" })
