/**
 * `parse` with its answers remembered by argument: for what every request asks again with the same few
 * strings (its client's address, its path). Forgotten whole past `size` arguments, and arguments longer
 * than `maxLength` are parsed but not kept, so that a stream of new or long ones costs a bounded map.
 */
export const memoized = <A>(
  parse: (text: string) => A,
  options: { readonly size?: number; readonly maxLength?: number } = {}
) => {
  const { maxLength = 256, size = 10_000 } = options
  const known = new Map<string, A>()
  return (text: string): A => {
    if (known.has(text)) return known.get(text) as A
    const parsed = parse(text)
    if (text.length > maxLength) return parsed
    if (known.size >= size) known.clear()
    known.set(text, parsed)
    return parsed
  }
}
