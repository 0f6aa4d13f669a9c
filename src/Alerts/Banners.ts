import { microMyr, myrAsSet, myrDown } from "../Domain/Money.js"
import type { Wallet } from "../Wallet/Api.js"
import type { WalletSettingsRow } from "../Wallet/Settings.js"
import type { EndpointRow } from "../Webhooks/Endpoints.js"
import { maskedUrl } from "../Webhooks/MaskedUrl.js"
import type { Banner } from "./Api.js"

/** What the dashboard shows at its top, from the wallet, its settings and the endpoints (`wholeUrls`: to those who manage webhooks). */
export const bannersOf = (
  wallet: typeof Wallet.Type,
  settings: WalletSettingsRow,
  endpoints: ReadonlyArray<EndpointRow>,
  wholeUrls: boolean
): Array<typeof Banner.Type> => {
  const banners: Array<typeof Banner.Type> = []
  const balance = wallet.availableMicroMyr + wallet.reservedMicroMyr
  const threshold = settings.lowBalanceThresholdMicroMyr
  if (threshold !== null && balance < threshold) {
    banners.push({
      kind: "balance_low",
      // Rounded down: a balance just below the threshold never reads as the threshold itself.
      message:
        `Your balance is RM ${myrDown(microMyr(balance))}, below the RM ${myrAsSet(microMyr(threshold))} you set. ` +
        "Top up, or turn on auto top-up, before live calls answer 402.",
      action_url: "/billing"
    })
  }
  if (!settings.autoTopupEnabled && settings.autoTopupDisabledReason !== null) {
    banners.push({
      kind: "auto_topup_failed",
      message: `Auto top-up is off: ${settings.autoTopupDisabledReason}`,
      action_url: settings.autoTopupActionUrl ?? "/billing"
    })
  }
  for (const endpoint of endpoints) {
    if (endpoint.disabledAt !== null && endpoint.disabledReason === "failing for 3 days") {
      banners.push({
        kind: "webhook_endpoint_disabled",
        // Every role sees banners: the URL's path and query can hold the receiver's token.
        message: `Webhook endpoint ${
          wholeUrls ? endpoint.url : maskedUrl(endpoint.url)
        } was disabled after 3 days of failed deliveries.`,
        action_url: `/webhooks?endpoint=${encodeURIComponent(endpoint.id)}`
      })
    }
  }
  return banners
}
