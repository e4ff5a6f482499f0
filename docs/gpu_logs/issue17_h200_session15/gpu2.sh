# call 2: is the pair noise the builds' CPU load? The same 32 candidates judged with their builds
# cached (no compile runs during any timing window), quiet, and then with compiler-like load on the
# 14 build CPUs (g++ -fsyntax-only of torch/extension.h in a loop per CPU, nice 10 like the
# harness's builds); one cold batch first fills the cache and is one more cold datum
set -x; mkdir -p /tmp/logs
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv
run() {  # $1 name
  timeout 105 python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 0 --baseline-n 0 --stability-runs 0 --cache-root /tmp/c --json-out $OUT/$1.json > /tmp/logs/$1.log 2>&1
  grep -E "in-batch noise|^\| (wall|unique)" /tmp/logs/$1.log
}
run cold
run warm_quiet_1
run warm_quiet_2
INC="$(python -c "import torch.utils.cpp_extension as c; print(' '.join('-I'+p for p in c.include_paths()))") -I$(python -c "import sysconfig; print(sysconfig.get_paths()['include'])")"
echo '#include <torch/extension.h>' > /tmp/load.cpp
pids=()
for c in $(seq 0 13); do taskset -c $c nice -n 10 bash -c "while :; do g++ -std=c++17 -w -fsyntax-only $INC /tmp/load.cpp >/dev/null 2>&1; done" & pids+=($!); done
sleep 3; uptime
run warm_loaded_1
run warm_loaded_2
uptime
kill ${pids[@]}; pkill -f fsyntax-only; true
tar czf $OUT/logs.tgz -C /tmp/logs .
