# 8 fresh processes per mode, two rounds; prints each process's median call time and max/min
for mode in plain norand plain norand; do
  vals=""
  for i in $(seq 8); do
    if [ $mode = norand ]; then v=$(PYTHONHASHSEED=0 setarch -R python host_dispatch_cpu.py); else v=$(python host_dispatch_cpu.py); fi
    vals="$vals $v"
  done
  python3 -c "import sys; v=[float(x) for x in sys.argv[2:]]; print(sys.argv[1], ' '.join(f'{x/1000:.2f}' for x in v), 'us; max/min %.3f' % (max(v)/min(v)))" $mode $vals
done
