import { isIP } from "node:net"
import ipaddr from "ipaddr.js"

/**
 * Why an address may not be fetched, or `undefined` when it may: only public
 * unicast addresses are reachable. Loopback, private, link-local (cloud
 * metadata at 169.254.169.254), carrier-grade NAT (Alibaba's metadata at
 * 100.100.100.200), unique-local IPv6 (AWS's fd00:ec2::254), multicast,
 * reserved and translated ranges are all refused; an IPv4-mapped IPv6 address
 * is judged as the IPv4 address it carries.
 */
export const refusedAddress = (address: string): string | undefined => {
  const bare = address.startsWith("[") && address.endsWith("]") ? address.slice(1, -1) : address
  if (!ipaddr.isValid(bare)) return "not an IP address"
  const range = ipaddr.process(bare).range()
  return range === "unicast" ? undefined : range
}

/** Whether `host` (a URL's hostname, IPv6 in brackets or not) is an IP literal rather than a name. */
export const isIpLiteral = (host: string): boolean => {
  const bare = host.startsWith("[") && host.endsWith("]") ? host.slice(1, -1) : host
  return isIP(bare) !== 0
}
