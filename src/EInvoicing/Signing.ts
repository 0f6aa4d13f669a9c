import { Effect } from "effect"
import type forge from "node-forge"

/**
 * Version 1.1 documents carry an enveloped XAdES signature in UBL JSON, made as MyInvois' SDK describes
 * ("Document Signature Creation"; docs/api/e-invoices.md, "Signed documents"):
 * 1. the document without `UBLExtensions` and `Signature`, minified, is what is signed;
 * 2. `DocDigest` is the base64 SHA-256 of those bytes; the signature value is RSA-SHA256 over them;
 * 3. `CertDigest` is the base64 SHA-256 of the certificate's DER bytes;
 * 4. the qualifying properties (target and signed properties: signing time, certificate digest, issuer name and
 *    serial number) are minified and their base64 SHA-256 is `PropsDigest`;
 * 5. all of it goes into `UBLExtensions`, with `Signature` naming the enveloped XAdES method.
 * The certificate and the key are read with `node-forge` (PEM, DER, the issuer's distinguished name, RSA).
 */

export interface Signer {
  /** The signed document's JSON text, made from the unsigned one (whose `InvoiceTypeCode` says 1.1). */
  readonly sign: (document: Record<string, unknown>, at: Date) => string
}

const SHA256 = "http://www.w3.org/2001/04/xmlenc#sha256"
const RSA_SHA256 = "http://www.w3.org/2001/04/xmldsig-more#rsa-sha256"
const SIGNED_PROPERTIES_ID = "id-xades-signed-props"

/** `CN=…, O=…, C=MY`: the issuer as MyInvois matches it against the certificate (most specific first). */
const distinguishedName = (attributes: ReadonlyArray<forge.pki.CertificateField>): string =>
  [...attributes].reverse().map((attribute) => `${attribute.shortName ?? attribute.name}=${String(attribute.value)}`)
    .join(", ")

const wrap = (value: string) => [{ _: value }]

/** The transformed document: without `UBLExtensions` and `Signature`, minified (the bytes signed and digested). */
export const transformed = (document: Record<string, unknown>): string => {
  const invoices = (document["Invoice"] as Array<Record<string, unknown>> | undefined) ?? []
  const stripped = invoices.map((invoice) => {
    const { Signature: _signature, UBLExtensions: _extensions, ...rest } = invoice
    return rest
  })
  return JSON.stringify({ ...document, Invoice: stripped })
}

/** Reads the PEM key and certificate (loading `node-forge` only when documents are signed). */
export const makeSigner = (keyPem: string, certificatePem: string) =>
  Effect.promise(() => import("node-forge")).pipe(
    Effect.flatMap(({ default: lib }) =>
      Effect.try({
        try: () => {
          const certificate = lib.pki.certificateFromPem(certificatePem)
          const key = lib.pki.privateKeyFromPem(keyPem)
          const der = lib.asn1.toDer(lib.pki.certificateToAsn1(certificate)).getBytes()
          const certificateBase64 = lib.util.encode64(der)
          const sha256Base64 = (bytes: string, encoding: "raw" | "utf8") => {
            const md = lib.md.sha256.create()
            md.update(bytes, encoding)
            return lib.util.encode64(md.digest().getBytes())
          }
          const certDigest = sha256Base64(der, "raw")
          const issuer = distinguishedName(certificate.issuer.attributes)
          const subject = distinguishedName(certificate.subject.attributes)
          const serial = BigInt(`0x${certificate.serialNumber}`).toString(10)
          const signer: Signer = {
            sign: (document, at) => {
              const text = transformed(document)
              const docDigest = sha256Base64(text, "utf8")
              const md = lib.md.sha256.create()
              md.update(text, "utf8")
              const signatureValue = lib.util.encode64(key.sign(md))
              const signedProperties = {
                Id: SIGNED_PROPERTIES_ID,
                SignedSignatureProperties: [{
                  SigningTime: wrap(`${at.toISOString().slice(0, 19)}Z`),
                  SigningCertificate: [{
                    Cert: [{
                      CertDigest: [{ DigestMethod: [{ _: "", Algorithm: SHA256 }], DigestValue: wrap(certDigest) }],
                      IssuerSerial: [{ X509IssuerName: wrap(issuer), X509SerialNumber: wrap(serial) }]
                    }]
                  }]
                }]
              }
              const qualifying = { Target: "signature", SignedProperties: [signedProperties] }
              const propsDigest = sha256Base64(JSON.stringify(qualifying), "utf8")
              const extensions = [{
                UBLExtension: [{
                  ExtensionURI: wrap("urn:oasis:names:specification:ubl:dsig:enveloped:xades"),
                  ExtensionContent: [{
                    UBLDocumentSignatures: [{
                      SignatureInformation: [{
                        ID: wrap("urn:oasis:names:specification:ubl:signature:1"),
                        ReferencedSignatureID: wrap("urn:oasis:names:specification:ubl:signature:Invoice"),
                        Signature: [{
                          Id: "signature",
                          Object: [{ QualifyingProperties: [qualifying] }],
                          KeyInfo: [{
                            X509Data: [{
                              X509Certificate: wrap(certificateBase64),
                              X509SubjectName: wrap(subject),
                              X509IssuerSerial: [{ X509IssuerName: wrap(issuer), X509SerialNumber: wrap(serial) }]
                            }]
                          }],
                          SignatureValue: wrap(signatureValue),
                          SignedInfo: [{
                            SignatureMethod: [{ _: "", Algorithm: RSA_SHA256 }],
                            Reference: [
                              {
                                Type: "http://uri.etsi.org/01903/v1.3.2#SignedProperties",
                                URI: `#${SIGNED_PROPERTIES_ID}`,
                                DigestMethod: [{ _: "", Algorithm: SHA256 }],
                                DigestValue: wrap(propsDigest)
                              },
                              {
                                Type: "",
                                URI: "",
                                DigestMethod: [{ _: "", Algorithm: SHA256 }],
                                DigestValue: wrap(docDigest)
                              }
                            ]
                          }]
                        }]
                      }]
                    }]
                  }]
                }]
              }]
              const invoices = document["Invoice"] as Array<Record<string, unknown>>
              const signed = {
                ...document,
                Invoice: invoices.map((invoice) => ({
                  ...invoice,
                  UBLExtensions: extensions,
                  Signature: [{
                    ID: wrap("urn:oasis:names:specification:ubl:signature:Invoice"),
                    SignatureMethod: wrap("urn:oasis:names:specification:ubl:dsig:enveloped:xades")
                  }]
                }))
              }
              return JSON.stringify(signed)
            }
          }
          return signer
        },
        catch: (error) =>
          new Error(
            `MYINVOIS_SIGNING_KEY and MYINVOIS_SIGNING_CERT must be an RSA private key and its X.509 certificate in PEM: ${
              String(error)
            }`
          )
      })
    ),
    Effect.orDie
  )
