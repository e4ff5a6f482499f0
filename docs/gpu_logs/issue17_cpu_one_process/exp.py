# One-process control for the CPU timing noise (issue 17, PERFORMANCE.md): the benign C++ candidate and
# the reference called in turn, no harness. Run from the repo checkout at /work/main as
#   MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=268435456 MALLOC_PERTURB_=128 python exp.py > exp.log
# (kernel_eval's CPU worker malloc settings). Per round: median ms per call of each, and the
# (output - input, output) offsets within their 4 KiB pages seen in that round.
import os, sys, time, random, statistics, torch
torch.set_num_threads(1)
sys.argv=['x']
src = open('/work/main/tests/adversarial/cpp/benign.py').read().replace('load_inline(name="ext",', 'load_inline(name="ext3", extra_cflags=["-O3"],')
g = {}
os.environ['TORCH_EXTENSIONS_DIR'] = '/tmp/alias/ext'
exec(compile(src, 'benign', 'exec'), g)
ext = g['ext']
x = torch.randn(64, 4096)
keep = []
rows = []
for blk in range(60):
    # perturb heap
    keep.append(torch.empty(random.randint(1, 300000)))
    if random.random() < 0.5 and keep: keep.pop(random.randrange(len(keep)))
    ts = []; offs = set()
    for k in range(100):
        t0 = time.process_time(); y = ext.relu_scale_add(x, 1.5); ts.append(time.process_time() - t0)
        offs.add(((y.data_ptr() - x.data_ptr()) % 4096, y.data_ptr() % 4096))
    tr = []
    for k in range(100):
        t0 = time.process_time(); z = torch.relu(x) * 1.5 + x; tr.append(time.process_time() - t0)
    rows.append((statistics.median(ts)*1e3, statistics.median(tr)*1e3, sorted(offs)))
    print(f"{blk:3d} cand {rows[-1][0]:.4f} ref {rows[-1][1]:.4f} offs {rows[-1][2]}", flush=True)
