# call 2: the host units' precompiled header, the slim CUDAContext and 7 builds at once (the new
# default): kernel_eval's GPU tests; the throughput beside the KernelBench-style baseline in one run;
# the same without the precompiled header
set -x
timeout 240 python -m pytest -m gpu -q tests/test_kernel_eval.py -k "not builtin" > $OUT/ke_gpu.log 2>&1; tail -4 $OUT/ke_gpu.log
(vmstat 2 > $OUT/vmstat_new.log &)
timeout 230 python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 12 --baseline-n 0 --stability-runs 0 --cache-root /tmp/n1 --json-out $OUT/tp_new.json > $OUT/tp_new.log 2>&1; grep -E "wall|noise|KernelBench-style:|ratio|per phase" $OUT/tp_new.log
pkill vmstat
ls -la /tmp/n1/host_pch/*/
timeout 120 python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 0 --baseline-n 0 --stability-runs 0 --no-host-pch --cache-root /tmp/n2 --json-out $OUT/tp_nopch.json > $OUT/tp_nopch.log 2>&1; grep -E "wall|noise|per phase" $OUT/tp_nopch.log
python - <<'PY'
import json, glob
for root in ("/tmp/n1", "/tmp/n2"):
    hosts, cus = [], []
    for log in glob.glob(root + "/build/*/.ninja_log"):
        for line in open(log).read().splitlines()[1:]:
            a, b, _, target, _ = line.split("\t")
            (hosts if target == "main.o" else cus if target.endswith(".cuda.o") else []).append((int(b) - int(a)) / 1000)
    tiers = [json.load(open(p)).get("header_tier") for p in glob.glob(root + "/compiled/*.json")]
    med = lambda v: sorted(v)[len(v) // 2] if v else float("nan")
    print(root, "host units", len(hosts), "median %.1f s" % med(hosts), "| .cu units", len(cus), "median %.1f s" % med(cus), "| tiers", {t: tiers.count(t) for t in set(tiers)})
PY
