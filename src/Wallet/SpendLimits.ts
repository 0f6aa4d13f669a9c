import { SpendLimitExceeded } from "../Domain/Errors.js"
import { type MicroMyr, microMyr, toMyrString } from "../Domain/Money.js"

/**
 * Monthly spend limits (docs/money.md, "Spend limits and budgets"): a key's own, and its
 * member's budget over all the member's keys. Each is checked under the
 * wallet's lock against what was spent this month plus what calls in flight
 * hold (reservations, and grants through `key_grant_holds`), so a call under
 * either never lends from a grant nor takes the quick reservation.
 */

/** What a key (or all of a member's keys) spent this `BUSINESS_TIMEZONE` month, and what its calls in flight hold. */
export interface MonthToDate {
  readonly spent: number
  readonly held: number
}

/** The dashboard page of a member budget's refusal: the caller cannot raise it, an owner or admin can. */
export const MEMBER_BUDGET_ACTION = "/members"

export const MEMBER_BUDGET_GUIDANCE =
  "Ask an owner or admin of the account to raise your monthly budget (PATCH /dashboard/members/{id}), or wait for the next month."

/** Whether a call (its `ReserveInput`) is under a monthly limit, its key's or its member's: checked call by call, never lent from a grant. */
export const isLimited = (input: {
  readonly monthlySpendLimitMicroMyr: number | null
  readonly memberMonthlySpendLimitMicroMyr: number | null
}): boolean => input.monthlySpendLimitMicroMyr !== null || input.memberMonthlySpendLimitMicroMyr !== null

const over = (limit: number, month: MonthToDate, amount: MicroMyr): boolean => month.spent + month.held + amount > limit

const rm = (amount: number): string => toMyrString(microMyr(amount))

/** The key's own limit's refusal of a call of `amount`, or nothing. */
export const keyLimitRefusal = (limit: number, month: MonthToDate, amount: MicroMyr): SpendLimitExceeded | undefined =>
  over(limit, month, amount)
    ? new SpendLimitExceeded({
      message: `This key's monthly spend limit is RM ${rm(limit)}; it has spent RM ${rm(month.spent)} this month, RM ${
        rm(month.held)
      } is held for calls in flight, and this request may cost up to RM ${rm(amount)}.`
    })
    : undefined

/** The member's budget's refusal of a call of `amount` (`month`: all the member's keys), or nothing. */
export const memberBudgetRefusal = (
  budget: number,
  month: MonthToDate,
  amount: MicroMyr
): SpendLimitExceeded | undefined =>
  over(budget, month, amount)
    ? new SpendLimitExceeded({
      message: `Your monthly budget in this account is RM ${rm(budget)}; your keys have spent RM ${
        rm(month.spent)
      } this month, RM ${rm(month.held)} is held for calls in flight, and this request may cost up to RM ${
        rm(amount)
      }.`,
      guidance: MEMBER_BUDGET_GUIDANCE,
      action: MEMBER_BUDGET_ACTION
    })
    : undefined

/** A refusal by a member's budget (not by the key's own limit, whose first in a month is announced). */
export const isMemberBudgetRefusal = (error: SpendLimitExceeded): boolean => error.action === MEMBER_BUDGET_ACTION
