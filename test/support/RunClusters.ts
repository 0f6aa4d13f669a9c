import { isAbsolute, relative, sep } from "node:path"

/** A cluster folder under /var/lib/nenas: the DATA_DIR its marker records (none yet: a start under way), and whether a server runs on it. */
export interface ClusterSeen {
  readonly ownDir: string
  readonly dataDir: string | undefined
  readonly served: boolean
}

/** Whether `path` is `dir` or inside it; a sibling that merely starts with its name (`/tmp/run-1x` for `/tmp/run-1`) is not. */
export const isWithin = (dir: string, path: string): boolean => {
  const rest = relative(dir, path)
  return rest === "" || (rest !== ".." && !rest.startsWith(`..${sep}`) && !isAbsolute(rest))
}

/**
 * The clusters a test run left behind: those of a DATA_DIR inside the run's own temporary
 * directory with no server on them. A cluster of any other DATA_DIR (an `npm start` beside
 * the tests, another run) is never the run's, wherever it lives.
 */
export const leftByRun = (runDir: string, clusters: ReadonlyArray<ClusterSeen>): ReadonlyArray<ClusterSeen> =>
  clusters.filter((cluster) => !cluster.served && cluster.dataDir !== undefined && isWithin(runDir, cluster.dataDir))
