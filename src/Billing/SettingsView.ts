import { fromMyr, microMyr, toMyrNumber } from "../Domain/Money.js"
import type { WalletSettingsChange, WalletSettingsRow } from "../Wallet/Settings.js"
import type { BillingSettings, SavedCard, UpdateBillingSettings } from "./Api.js"
import type { CardRow } from "./Cards.js"

const myrOrNull = (micro: number | null) => micro === null ? null : toMyrNumber(microMyr(micro))

export const toSettings = (
  row: WalletSettingsRow,
  card: typeof SavedCard.Type | null
): typeof BillingSettings.Type => ({
  low_balance_threshold_myr: myrOrNull(row.lowBalanceThresholdMicroMyr),
  auto_topup: {
    enabled: row.autoTopupEnabled,
    threshold_myr: myrOrNull(row.autoTopupThresholdMicroMyr),
    amount_myr: row.autoTopupAmountSen === null ? null : row.autoTopupAmountSen / 100,
    max_per_day: row.autoTopupMaxPerDay,
    disabled_reason: row.autoTopupDisabledReason,
    action_url: row.autoTopupActionUrl
  },
  card
})

export const toChange = (payload: typeof UpdateBillingSettings.Type): WalletSettingsChange => ({
  lowBalanceThresholdMicroMyr: payload.low_balance_threshold_myr === undefined
    ? undefined
    : payload.low_balance_threshold_myr === null
    ? null
    : fromMyr(payload.low_balance_threshold_myr),
  autoTopupEnabled: payload.auto_topup?.enabled,
  autoTopupThresholdMicroMyr: payload.auto_topup?.threshold_myr === undefined
    ? undefined
    : fromMyr(payload.auto_topup.threshold_myr),
  autoTopupAmountSen: payload.auto_topup?.amount_myr === undefined ? undefined : payload.auto_topup.amount_myr * 100,
  autoTopupMaxPerDay: payload.auto_topup?.max_per_day
})

export const toCard = (row: CardRow | undefined): typeof SavedCard.Type | null =>
  row?.paymentMethodId == null
    ? null
    : { brand: row.brand ?? "card", last4: row.last4 ?? "", exp_month: row.expMonth ?? 0, exp_year: row.expYear ?? 0 }

/** What turning auto top-up on lacks, with the field to name: a card, a threshold, an amount. */
export const autoTopupGap = (
  before: WalletSettingsRow,
  change: WalletSettingsChange,
  card: typeof SavedCard.Type | null
): { readonly message: string; readonly param: string } | undefined => {
  if (card === null) {
    return {
      message: "Auto top-up needs a saved card: save one first (POST /dashboard/billing/card).",
      param: "auto_topup.enabled"
    }
  }
  if ((change.autoTopupThresholdMicroMyr ?? before.autoTopupThresholdMicroMyr) === null) {
    return {
      message: "Set 'auto_topup.threshold_myr': the balance below which the card is charged.",
      param: "auto_topup.threshold_myr"
    }
  }
  if ((change.autoTopupAmountSen ?? before.autoTopupAmountSen) === null) {
    return {
      message: "Set 'auto_topup.amount_myr': how much each automatic top-up adds.",
      param: "auto_topup.amount_myr"
    }
  }
  return undefined
}
