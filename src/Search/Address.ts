import ipaddr from "ipaddr.js"
import { isIP } from "node:net"

/** `::/96`, the deprecated IPv4-compatible form (`::7f00:1` is 127.0.0.1), which ipaddr.js calls unicast. */
const IPV4_COMPATIBLE: [ipaddr.IPv6, number] = [ipaddr.IPv6.parse("::"), 96]

/**
 * Cloud metadata services on addresses ipaddr.js calls public unicast: Azure's
 * wireserver. The others sit in refused ranges already (169.254.169.254 and
 * Tencent's 169.254.0.23 link-local, Alibaba's 100.100.100.200 carrier-grade
 * NAT, Oracle's 192.0.0.192 reserved, AWS's fd00:ec2::254 and GCP's
 * fd20:ce::254 unique-local).
 */
const METADATA_V4: ReadonlySet<string> = new Set(["168.63.129.16"])

const rangeOfV4 = (address: ipaddr.IPv4): string => METADATA_V4.has(address.toString()) ? "metadata" : address.range()

/**
 * Why an address may not be fetched, or `undefined` when it may: only public
 * unicast addresses are reachable. Loopback, private, link-local (cloud
 * metadata at 169.254.169.254), Azure's wireserver (168.63.129.16), carrier-grade NAT (Alibaba's metadata at
 * 100.100.100.200), unique-local IPv6 (AWS's fd00:ec2::254), multicast and
 * reserved ranges are all refused, and so is every IPv6 form that carries an
 * IPv4 address (IPv4-compatible `::/96`, IPv4-mapped `::ffff:0:0/96`,
 * translated `::ffff:0:0:0/96`, NAT64 `64:ff9b::/96` and `64:ff9b:1::/48`,
 * 6to4 `2002::/16`, Teredo `2001::/32`), since some network on the way may
 * reach the IPv4 address inside. An IPv4-mapped address names the IPv4 range
 * inside when that is refused too.
 */
export const refusedAddress = (address: string): string | undefined => {
  const bare = address.startsWith("[") && address.endsWith("]") ? address.slice(1, -1) : address
  if (!ipaddr.isValid(bare)) return "not an IP address"
  const parsed = ipaddr.parse(bare)
  if (parsed.kind() === "ipv6") {
    const v6 = parsed as ipaddr.IPv6
    if (v6.isIPv4MappedAddress()) {
      const inner = rangeOfV4(v6.toIPv4Address())
      return inner === "unicast" ? "ipv4Mapped" : inner
    }
    const range = v6.range()
    // `::` and `::1` keep their own names; the rest of ::/96 embeds an IPv4 address.
    if (range === "unicast" && v6.match(IPV4_COMPATIBLE)) return "ipv4Compatible"
    return range === "unicast" ? undefined : range
  }
  const range = rangeOfV4(parsed as ipaddr.IPv4)
  return range === "unicast" ? undefined : range
}

/** Whether `host` (a URL's hostname, IPv6 in brackets or not) is an IP literal rather than a name. */
export const isIpLiteral = (host: string): boolean => {
  const bare = host.startsWith("[") && host.endsWith("]") ? host.slice(1, -1) : host
  return isIP(bare) !== 0
}
