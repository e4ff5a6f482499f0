"""Offline, from process_floor9.log (no device time): what would timing the candidate in k fresh
processes and paying the median of their levels (k = 2: their mean) do to the pair noise? For
each task, every way of drawing two disjoint groups of k from the 8 candidate processes p1-p8 is
paired against p0's two reference windows, as process_floor.py pairs single processes. Batches of
8 pairs (one per task, drawn at random 2000 times) give the chance that a batch meets the goal."""
import itertools, random, re, statistics
tasks = {}
for line in open("process_floor9.log"):
    m = re.match(r"(\S+)\s+process medians \(ms\) (.*?)\s+\| windows of p0 (\S+) (\S+)", line)
    if m:
        tasks[m.group(1)] = ([float(x) for x in m.group(2).split()], float(m.group(3)), float(m.group(4)))
random.seed(0)
for k in (1, 2, 3):
    level = statistics.fmean if k == 2 else statistics.median
    per_task = []
    for medians, w1, w2 in tasks.values():
        c, ratios = medians[1:], []
        for group in itertools.combinations(range(8), 2 * k):
            for a in itertools.combinations(group, k):
                b = [i for i in group if i not in a]
                s1, s2 = w1 / level([c[i] for i in a]), w2 / level([c[i] for i in b])
                ratios.append(max(s1, s2) / min(s1, s2))
        per_task.append(ratios)
    flat = sorted(r for rs in per_task for r in rs)
    batches = [[random.choice(rs) for rs in per_task] for _ in range(2000)]
    maxima, medians_ = [max(b) for b in batches], [statistics.median(b) for b in batches]
    print(f"k={k}: pairs median {statistics.median(flat):.3f}, p90 {flat[int(0.9 * len(flat))]:.3f}, max {flat[-1]:.3f}; "
          f"batches of 8: median of their maxima {statistics.median(maxima):.3f}, "
          f"P(max <= 1.10) {sum(x <= 1.10 for x in maxima) / len(maxima):.2f}, "
          f"P(median <= 1.03) {sum(x <= 1.03 for x in medians_) / len(medians_):.2f}")
