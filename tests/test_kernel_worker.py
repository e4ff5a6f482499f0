"""Tests for kernel_worker: what a worker process runs, here in the test's process (no sandbox):
the timing loop both sides are timed by, the check that a forward's outputs are plain tensors with
no torch mode left active, and how a failure of the task's code or a build is described. The
workers' commands are tested through kernel_eval's verdicts (tests/test_kernel_eval.py)."""
import os

import pytest
import torch

import kernel_memory
import kernel_sandbox as sandbox
import kernel_worker


def test_timing_loop_rotates_input_copies_each_holding_every_set():
    """Timed calls rotate through copies of the input buffers (each its own place in memory: on the
    H200 a kernel's time moved up to ~20% with where its input landed), each call sees exactly its
    set's values, and the copies stay within their byte budget."""
    sets = [[torch.full((4, 8), float(v)), 3] for v in range(2)]
    seen = []

    def model(x, n):
        seen.append((x.data_ptr(), float(x[0, 0]), n))
        return x * 2

    loop = kernel_worker.TimingLoop(model, sets, None, False, lambda: None, buffers=4, buffer_bytes=1 << 20)
    times = loop.run(16)
    assert len(times) == 16 and all(t >= 0 for t in times)
    assert [v for _, v, _ in seen] == [0.0, 1.0] * 8 and all(n == 3 for _, _, n in seen)
    by_copy = {}
    for ptr, v, _ in seen:
        by_copy.setdefault(ptr, set()).add(v)
    assert len(by_copy) == 4 and all(vs == {0.0, 1.0} for vs in by_copy.values())
    assert [float(o[0][0, 0]) for o in loop.last] == [0.0, 2.0]  # each set's last output
    # a budget of 2.5 copies' bytes holds 2 copies; none holds 1 (KernelBench's one set of buffers)
    one = 4 * 8 * 4
    assert len(kernel_worker.TimingLoop(model, sets, None, False, lambda: None, 4, int(2.5 * one)).bufs) == 2
    assert len(kernel_worker.TimingLoop(model, sets, None, False, lambda: None, 4, 0).bufs) == 1


def test_timing_loop_writes_kept_outputs_to_the_file_and_streams_them_with_host_outputs():
    """The kept outputs reach the candidate's output file, each set's last in set order (written when
    the window ends); with host_outputs only a run told to keep keeps anything, straight into the file
    as it is made (no copy beside it), and a side with no file (the reference) keeps nothing."""
    calls = []

    def model(x):
        calls.append(float(x[0, 0]))
        return x + len(calls)

    def loop_file(**kw):
        fd = kernel_memory.memfd("timing-test")
        sets = kw.pop("sets", [[torch.zeros(2, 3)], [torch.ones(2, 3)]])
        return fd, kernel_worker.TimingLoop(model, sets, None, False, lambda: None,
                                            last_file=kernel_memory.TensorFileWriter(os.dup(fd)), **kw)

    fd, loop = loop_file()
    loop.run(5)  # calls 1..5 on sets 0 1 0 1 0: set 0's last is call 5 (0 + 5), set 1's call 4 (1 + 4)
    loop.write_last()
    assert [float(s[0][0, 0]) for s in kernel_memory.read_tensor_sets(fd, 1 << 20)] == [5.0, 5.0]
    os.close(fd)
    calls.clear()
    fd, loop = loop_file(sets=[[torch.zeros(2, 3)]], host_outputs=True)
    loop.keep = False
    loop.run(3)
    assert loop.last == [None] and os.fstat(fd).st_size == 0  # nothing kept, nothing written
    loop.keep = True
    loop.run(2)  # calls 4 and 5: call 5's outputs, in the file before the window ends
    assert os.fstat(fd).st_size >= 2 * 3 * 4 and loop.last == [None]
    loop.write_last()
    [[out]] = kernel_memory.read_tensor_sets(fd, 1 << 20)
    assert torch.equal(out, torch.full((2, 3), 5.0))
    os.close(fd)
    reference = kernel_worker.TimingLoop(model, [[torch.zeros(2, 3)]], None, False, lambda: None, host_outputs=True)
    reference.run(2)
    assert reference.last == [None]
    with pytest.raises(ValueError, match="one input set"):
        loop_file(host_outputs=True)


class _Deferred(torch.Tensor):
    """A tensor with no values of its own: any operation on it computes x * 2 first (on first use)."""

    @staticmethod
    def __new__(cls, x):
        return torch.Tensor._make_wrapper_subclass(cls, x.shape, dtype=x.dtype, device=x.device)

    def __init__(self, x):
        self.x, self.computed = x, 0

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def value(a):
            if isinstance(a, _Deferred):
                a.computed += 1
                return a.x * 2
            return a
        return func(*[value(a) for a in args], **(kwargs or {}))


def test_timing_loop_refuses_outputs_that_are_not_plain_tensors_before_touching_them():
    """The candidate's side of the timing loop (refuse=True) ends at the first call whose output is
    not exactly a torch.Tensor, naming its type, before the output is ever used (so its deferred work
    never runs); the reference's side (refuse=False) and plain outputs run as before."""
    sets = [[torch.ones(4, 8)], [torch.zeros(4, 8)]]
    made = []

    def lazy(x):
        made.append(_Deferred(x))
        return made[-1]

    with pytest.raises(sandbox.Refusal, match=r"_Deferred \(a torch.Tensor subclass\)"):
        kernel_worker.TimingLoop(lazy, sets, None, False, lambda: None, refuse=True).run(4)
    assert len(made) == 1 and made[0].computed == 0
    # the trusted side only computes the same check, at the same cost
    assert len(kernel_worker.TimingLoop(lazy, sets, None, False, lambda: None).run(4)) == 4
    plain = kernel_worker.TimingLoop(lambda x: x * 2, sets, None, False, lambda: None, refuse=True)
    assert len(plain.run(4)) == 4 and [float(o[0][0, 0]) for o in plain.last] == [2.0, 0.0]
    for model, named in ((lambda x: [x * 2, 3], r"output 1 is int \(not a tensor\)"),
                         (lambda x: torch.nn.Parameter(x * 2), r"Parameter \(a torch.Tensor subclass\)")):
        with pytest.raises(sandbox.Refusal, match=named):
            kernel_worker.TimingLoop(model, sets, None, False, lambda: None, refuse=True).run(1)


def test_output_check_sees_disguised_subclasses_and_modes_left_active():
    """A subclass whose __class__ was set to torch.Tensor keeps its Python dispatch; a torch function
    mode left active by forward would run on the harness's first read of a plain output. torch's
    default-device context is allowed."""
    from torch.overrides import TorchFunctionMode
    check = kernel_worker.OutputCheck(torch)
    assert check([torch.ones(2), torch.zeros(3, dtype=torch.int64)]) is None
    disguised = _Deferred(torch.ones(2))
    disguised.__class__ = torch.Tensor
    assert type(disguised) is torch.Tensor and "Python dispatch" in check([disguised])
    plain = torch.ones(2)
    with TorchFunctionMode():
        assert "mode active" in check([plain])
    torch.set_default_device("cpu")
    try:
        assert check([torch.ones(2)]) is None
    finally:
        torch.set_default_device(None)
    assert check([torch.ones(2)]) is None


def test_describe_exception_gives_the_line_in_the_code_and_no_harness_frames(tmp_path):
    path = tmp_path / "cand.py"
    path.write_text("import torch\n\ndef f():\n    return undefined_name\n\nf()\n")
    with pytest.raises(NameError) as info:
        exec(compile(path.read_text(), str(path), "exec"), {})
    assert kernel_worker.describe_exception(info.value, str(path)) == "line 4: NameError: name 'undefined_name' is not defined"
    path.write_text("class ModelNew:\n    def forward(self x):\n        pass\n")
    with pytest.raises(SyntaxError) as info:
        compile(path.read_text(), str(path), "exec")
    message = kernel_worker.describe_exception(info.value, str(path))
    assert message.startswith("line 2: SyntaxError: ") and message.endswith(": def forward(self x):")
    assert "^" not in message and "\n" not in message
