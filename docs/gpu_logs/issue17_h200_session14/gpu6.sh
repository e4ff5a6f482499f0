# call 6 (~240 s of device time left, a fresh start): does another process's CUDA context creation and teardown slow a short kernel's timed calls?
# Refused (too little device time to start a machine); it ran in session 15, from that session's folder, where the script now is
python docs/gpu_logs/issue17_h200_session15/context_churn.py 2>&1 | tee $OUT/context_churn.log
