"""Offline, over the three calls' nvidia-smi samples (every 100 ms): did the SM or memory clock move
while the GPU worked? Prints, per call, the clocks seen, the power of samples below the top SM clock
(idle is ~79 W), and the runs of consecutive samples at the top clock."""
import csv, io, tarfile
for tgz, name in (("gpu1_logs.tgz", "./clocks.csv"), ("gpu2_logs.tgz", "./clocks2.csv"), ("gpu3_logs.tgz", "./clocks3.csv")):
    rows = list(csv.reader(io.TextIOWrapper(tarfile.open(tgz).extractfile(name))))[1:]
    rows = [(int(r[1].split()[0]), int(r[2].split()[0]), float(r[3].split()[0])) for r in rows if len(r) == 5]
    top = max(sm for sm, _, _ in rows)
    low_power = [p for sm, _, p in rows if sm < top]
    runs, n = [], 0
    for sm, _, _ in rows + [(0, 0, 0)]:
        if sm == top:
            n += 1
        elif n:
            runs.append(n); n = 0
    print(f"{tgz}: {len(rows)} samples; SM clock {top} MHz in {sum(runs)}, below in {len(low_power)} "
          f"(their power {min(low_power):.0f}-{max(low_power):.0f} W); memory clocks {sorted({m for _, m, _ in rows})} MHz; "
          f"power at the top clock up to {max(p for sm, _, p in rows if sm == top):.0f} W; "
          f"{len(runs)} runs at the top clock, longest {max(runs) / 10:.1f} s")
