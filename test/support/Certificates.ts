import forge from "node-forge"
import { generateKeyPairSync } from "node:crypto"

/** A self-signed RSA certificate and its key, as PEM, made with node-forge (the key by Node: forge's is slow). */
export const certificate = () => {
  const { privateKey, publicKey } = generateKeyPairSync("rsa", { modulusLength: 2048 })
  const keyPem = privateKey.export({ type: "pkcs8", format: "pem" }).toString()
  const cert = forge.pki.createCertificate()
  cert.publicKey = forge.pki.publicKeyFromPem(publicKey.export({ type: "spki", format: "pem" }).toString())
  cert.serialNumber = "0a1b2c3d"
  cert.validity.notBefore = new Date("2026-01-01T00:00:00Z")
  cert.validity.notAfter = new Date("2028-01-01T00:00:00Z")
  // Distinguished names in certificate order, the least specific first (C, O, CN).
  cert.setSubject([{ shortName: "C", value: "MY" }, { shortName: "O", value: "Nenas" }, {
    shortName: "CN",
    value: "Nenas Digital Sdn. Bhd."
  }])
  cert.setIssuer([{ shortName: "C", value: "MY" }, { shortName: "CN", value: "Test CA" }])
  cert.sign(forge.pki.privateKeyFromPem(keyPem), forge.md.sha256.create())
  return { keyPem, certPem: forge.pki.certificateToPem(cert) }
}
