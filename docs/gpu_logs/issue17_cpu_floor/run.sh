# The 2-core box's own floor for a paired timing of two ~0.1-0.3 ms memory-bound loops (no torch, no
# harness): the fused loop of tests/adversarial/cpp/benign.py (A) and the reference's three passes (B),
# timed in 8 alternating blocks of 200 calls, medians; the heap settings kernel_eval gives CPU workers.
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=268435456
g++ -O3 two_loops_per_process.cpp -o /tmp/two_loops_per_process && g++ -O3 two_loops_in_rounds.cpp -o /tmp/two_loops_in_rounds
uptime
echo "16 processes, one window each:"; for i in $(seq 16); do /tmp/two_loops_per_process 0; done
echo "3 processes, 8 windows each (rounds 0-3 on one input buffer, 4-7 on a new one each):"; for i in 1 2 3; do /tmp/two_loops_in_rounds; echo; done
uptime
