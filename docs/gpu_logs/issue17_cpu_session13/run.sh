# CPU repeatability with run workers forked (the default since 966f55b) and spawned, alternated in
# one command on the 2-core box, one shared build cache (the first run builds)
cd "$(dirname "$0")/../../.." || exit 1
D=docs/gpu_logs/issue17_cpu_session13
C=$(mktemp -d)
for i in 2 3; do
  python bench/repeatability.py --device cpu --cache-root $C --no-run-zygote > $D/repeatability_spawned_$i.log 2>&1
  python bench/repeatability.py --device cpu --cache-root $C > $D/repeatability_forked_$i.log 2>&1
done
python bench/repeatability.py --device cpu --cache-root $C --no-run-zygote > $D/repeatability_spawned_1.log 2>&1
grep -H "max / min" $D/*.log
