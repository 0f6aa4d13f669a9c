/**
 * Resident memory of the processes behind peers.mjs's targets, from
 * /proc/PID/status (Linux): the node process itself, not its children (the
 * service's embedded PostgreSQL is not counted).
 */
import { readFileSync, writeFileSync } from "node:fs"

/** One target's resident memory in MB (MiB, as /proc counts kB in KiB); NaN when it could not be read. */
export interface TargetMemory {
  /** VmRSS when its load began, after its start-up and preflight. */
  readonly idleRssMb: number
  /** VmHWM (the peak of VmRSS since the process started, or since the round began for one that outlives it) at the end of its measured seconds. */
  readonly peakRssMb: number
}

const statusMb = (status: string, field: "VmRSS" | "VmHWM") => {
  const match = new RegExp(`^${field}:\\s+(\\d+) kB$`, "m").exec(status)
  return match === null ? NaN : Number(match[1]) / 1024
}

/** VmRSS and VmHWM of `pid` in MB: NaN when they cannot be read (it has exited, or this is not Linux). */
const readStatus = (pid: number) => {
  try {
    const status = readFileSync(`/proc/${pid}/status`, "utf8")
    return { rss: statusMb(status, "VmRSS"), hwm: statusMb(status, "VmHWM") }
  } catch {
    return { rss: NaN, hwm: NaN }
  }
}

/** Restarts `pid`'s VmHWM from its VmRSS now (Linux's clear_refs); left as it is where that is refused. */
const resetPeak = (pid: number) => {
  try {
    writeFileSync(`/proc/${pid}/clear_refs`, "5")
  } catch {
    // not Linux, or not ours to reset: the peak is then the process's lifetime peak
  }
}

/**
 * Samples the VmHWM of each target's process every `intervalMs` until that
 * target's measured seconds end (then once more, and no more: the upstream
 * behind `direct` goes on serving the later targets), so that a peak is known
 * even when a process dies before the end; and reads VmRSS when a target's
 * load begins, for its idle figure.
 */
export class MemoryWatch {
  private readonly pids: Map<string, number>
  private readonly idle = new Map<string, number>()
  private readonly peak = new Map<string, number>()
  private readonly ended = new Set<string>()
  private readonly timer: NodeJS.Timeout

  /** `pids`: target name to the PID of the node process behind it, for those known before the run. */
  constructor(pids: Readonly<Record<string, number>>, intervalMs = 200) {
    this.pids = new Map(Object.entries(pids))
    // These outlive the run (the service, the upstream): their peak restarts from now, as a peer started for this run has.
    for (const pid of this.pids.values()) resetPeak(pid)
    this.timer = setInterval(() => {
      for (const name of this.pids.keys()) if (!this.ended.has(name)) this.sample(name)
    }, intervalMs)
  }

  /** The process behind target `name`, once peers.mjs has started it. */
  started(name: string, pid: number) {
    this.pids.set(name, pid)
  }

  /** `name`'s load begins: its VmRSS now is its idle figure. */
  loadBegins(name: string) {
    const pid = this.pids.get(name)
    if (pid !== undefined) this.idle.set(name, readStatus(pid).rss)
  }

  /** `name`'s measured seconds ended: its peak is read a last time. */
  windowEnds(name: string) {
    this.sample(name)
    this.ended.add(name)
  }

  stop() {
    clearInterval(this.timer)
  }

  /** Every target's figures (NaN for what was not read). */
  figures(): ReadonlyMap<string, TargetMemory> {
    return new Map([...this.pids.keys()].map((name): [string, TargetMemory] => [name, {
      idleRssMb: this.idle.get(name) ?? NaN,
      peakRssMb: this.peak.get(name) ?? NaN
    }]))
  }

  private sample(name: string) {
    const pid = this.pids.get(name)
    if (pid === undefined) return
    const { hwm } = readStatus(pid)
    if (hwm > (this.peak.get(name) ?? -Infinity)) this.peak.set(name, hwm)
  }
}
