"""Where a command's CPU time goes, by kind of process.

    python bench/cpu_by_process.py -- python bench/harness.py --device cuda ...

Runs the command and, every `--interval` seconds, reads utime + stime of every process on the
machine from /proc/<pid>/stat; a process's CPU time is the last value seen for it (the sampler's own
is not counted). At the end it prints the CPU seconds per kind (the executable's name; kernel_eval's
Python processes by role: compile worker, run worker, zygote, supervisor, harness) beside the
machine's busy CPU seconds from /proc/stat over the same span. Processes that live less than one
interval are missed, so the kinds' sum is a lower bound: the table says how much of the machine's
busy time it accounts for."""
import argparse
import os
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / TICK


# a process forked from a zygote keeps the zygote's command line; kernel_eval names its role instead
FORKED = {"keval-super": "python: supervisor", "keval-compile": "python: compile worker",
          "keval-ref": "python: reference worker", "keval-cand": "python: candidate worker"}


def kind_of(pid: str, comm: str) -> str:
    if comm in FORKED:
        return FORKED[comm]
    if not comm.startswith("python"):
        return comm
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return "python (gone)"
    text = b" ".join(args)
    for marker, name in ((b"--_zygote", "python: zygote"),
                         (b"--_supervise", "python: supervisor"), (b"--_worker compile", "python: compile worker"),
                         (b"--_worker ref", "python: reference worker"), (b"--_worker cand", "python: candidate worker"),
                         (b"harness.py", "python: harness (parent)")):
        if marker in text:
            return name
    return "python: other"


def sample(seen: dict) -> None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        rest = stat[stat.rindex(")") + 2:].split()
        cpu_s = (int(rest[11]) + int(rest[12])) / TICK  # utime, stime
        start = rest[19]
        key = (pid, start)
        if key not in seen or seen[key][2] != comm:  # new, or it has exec'd another program since
            seen[key] = [kind_of(pid, comm), cpu_s, comm]
        seen[key][1] = cpu_s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--interval", type=float, default=0.2)
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args()
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        sys.exit("cpu_by_process.py: give the command to run after --")
    seen: dict = {}
    sample(seen)
    before = {key: row[1] for key, row in seen.items()}  # what already ran counts from here
    busy0, t0 = machine_busy_s(), time.monotonic()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        sample(seen)
        time.sleep(a.interval)
    sample(seen)
    wall, busy = time.monotonic() - t0, machine_busy_s() - busy0
    per_kind: dict = {}
    for key, (kind, cpu_s, _) in seen.items():
        used = cpu_s - before.get(key, 0.0)
        if used > 0:
            count, total = per_kind.get(kind, (0, 0.0))
            per_kind[kind] = (count + 1, total + used)
    accounted = sum(total for _, total in per_kind.values())
    print(f"\nwall {wall:.1f} s, {os.cpu_count()} CPUs; machine busy {busy:.0f} CPU s "
          f"({100 * busy / max(wall * os.cpu_count(), 1e-9):.0f}%), of which the table accounts for {accounted:.0f}\n")
    print("| kind of process | processes | CPU s | share of busy |")
    print("|---|---:|---:|---:|")
    for kind, (count, total) in sorted(per_kind.items(), key=lambda kv: -kv[1][1]):
        if total >= 0.05 * 0.01 * busy:
            print(f"| {kind} | {count} | {total:.1f} | {100 * total / max(busy, 1e-9):.1f}% |")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
