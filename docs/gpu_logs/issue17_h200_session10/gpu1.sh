set -x
nproc; lscpu | grep -iE "model name|thread|core|socket|numa"; cat /sys/devices/system/cpu/cpu{0,1}/topology/thread_siblings_list
SIB=$(cat /sys/devices/system/cpu/cpu{0,1}/topology/thread_siblings_list | tr '\n' ',' | sed 's/,$//')
echo "harness cores: $SIB"
REST=$(python -c "
s=set()
for p in '$SIB'.split(','):
    a,_,b=p.partition('-'); s.update(range(int(a),int(b or a)+1))
print(','.join(str(c) for c in range($(nproc)) if c not in s))")
NREST=$(python -c "print(len('$REST'.split(',')))")
echo "busy cores: $REST ($NREST)"
timeout 280 python bench/repeatability.py --device cuda --runs 8 --busy $(nproc) --blocks --cache-root /tmp/rc --json-out $OUT/rep_any.json > $OUT/rep_any.log 2>&1; tail -14 $OUT/rep_any.log
timeout 250 taskset -c $SIB python bench/repeatability.py --device cuda --runs 8 --busy $NREST --busy-cores $REST --blocks --cache-root /tmp/rc --json-out $OUT/rep_off.json > $OUT/rep_off.log 2>&1; tail -14 $OUT/rep_off.log
