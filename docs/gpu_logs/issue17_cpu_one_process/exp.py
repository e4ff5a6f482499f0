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
