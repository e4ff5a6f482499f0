# call 1: is the batch's throughput bound by the CPUs? topology; 4 builds at once (the default) beside
# the KernelBench-style baseline; 7 builds at once (14 CPUs for builds, 2 kept for timing); vmstat
# through both; then one .cu unit's and one host unit's compile split by stage (nvcc --time)
set -x
nproc; lscpu | grep -iE "model name|thread|core|socket|numa|mhz"; cat /sys/devices/system/cpu/cpu{0,1,8}/topology/thread_siblings_list
(vmstat 2 > $OUT/vmstat_b4.log &) ; VM=$!
timeout 260 python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 12 --baseline-n 0 --stability-runs 0 --cache-root /tmp/h4 --json-out $OUT/tp_b4.json > $OUT/tp_b4.log 2>&1; grep -E "wall|noise|KernelBench-style:|ratio|per phase" $OUT/tp_b4.log
pkill vmstat
(vmstat 2 > $OUT/vmstat_b7.log &)
timeout 150 python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 0 --baseline-n 0 --stability-runs 0 --max-parallel-compiles 7 --cache-root /tmp/h7 --json-out $OUT/tp_b7.json > $OUT/tp_b7.log 2>&1; grep -E "wall|noise|per phase" $OUT/tp_b7.log
pkill vmstat
D=$(dirname $(ls /tmp/h4/build/*/cuda.cu | head -1)); echo $D; cd $D
CF=$(grep "^cuda_cflags" build.ninja | sed 's/^cuda_cflags = //'); eval nvcc $CF -c cuda.cu -o /tmp/x.o --time $OUT/nvcc_time.csv > /dev/null 2>&1; cat $OUT/nvcc_time.csv | cut -d, -f2,7
CF=$(grep "^cflags" build.ninja | sed 's/^cflags = //'); /usr/bin/time -f "host unit %e s" c++ $CF -c main.cpp -o /tmp/m.o; cat .ninja_log
