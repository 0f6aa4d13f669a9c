import { ConfigProvider, Effect } from "effect"
import { appConfig } from "../../src/AppConfig.js"

/** The configuration read from `env` alone: its error or its value. */
export const configFrom = (env: Record<string, string>) =>
  Effect.either(Effect.withConfigProvider(appConfig, ConfigProvider.fromMap(new Map(Object.entries(env)))))

/** Every real part a production start needs, configured (none of them reached). */
export const PRODUCTION_ENV: Readonly<Record<string, string>> = {
  NODE_ENV: "production",
  DATABASE_URL: "postgres://db/nenas",
  UPSTREAM_BASE_URL: "https://upstream.example/v1",
  SEARCH_BASE_URL: "https://search.example",
  STRIPE_SECRET_KEY: "sk_test_x",
  STRIPE_WEBHOOK_SECRET: "whsec_x",
  AUTH_JWKS_URL: "https://idp.example/jwks.json",
  AUTH_ISSUER: "https://idp.example/",
  AUTH_AUDIENCE: "nenas",
  SUPPLIER_NAME: "Nenas Digital Sdn. Bhd.",
  SUPPLIER_TIN: "C25845632020",
  SUPPLIER_BRN: "202401012345",
  SUPPLIER_MSIC: "62099",
  SUPPLIER_ADDRESS:
    "{\"line1\":\"1 Jalan Nenas\",\"city\":\"Kuala Lumpur\",\"postcode\":\"50000\",\"state_code\":\"14\"}",
  SUPPLIER_EMAIL: "billing@nenas.example",
  SUPPLIER_PHONE: "+60312345678",
  MYINVOIS_BASE_URL: "https://api.myinvois.hasil.gov.my",
  MYINVOIS_CLIENT_ID: "erp-client",
  MYINVOIS_CLIENT_SECRET: "erp-secret",
  MYINVOIS_SIGNING_KEY: "/run/secrets/myinvois-key.pem",
  MYINVOIS_SIGNING_CERT: "/run/secrets/myinvois-cert.pem"
}
