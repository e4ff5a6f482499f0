"""CPU seconds of a candidate worker's boot, stage by stage (what kernel_eval's worker does before it
reports ready): import torch, the CUDA context, a TorchDispatchMode's first use. Run 3 times."""
import resource
import time


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


c0, w0 = cpu(), time.monotonic()
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
c1, w1 = cpu(), time.monotonic()
dev = torch.device("cuda")
torch.ones(1, device=dev)
torch.cuda.synchronize()
c2, w2 = cpu(), time.monotonic()


class Recorder(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


with Recorder():
    torch.ones(1, device=dev).add(1)
c3, w3 = cpu(), time.monotonic()
print(f"import torch {c1 - c0:.2f} CPU s ({w1 - w0:.2f} wall) | CUDA context {c2 - c1:.2f} ({w2 - w1:.2f}) | "
      f"dispatch mode first use {c3 - c2:.2f} ({w3 - w2:.2f}) | total {c3 - c0:.2f} CPU s")
