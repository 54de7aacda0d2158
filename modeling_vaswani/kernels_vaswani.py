"""Fast fp32 and int8 CPU kernels behind the model's linear layers; the model reads as nn.Linear.

`VaswaniLinear` is an `nn.Linear` (same parameters, same state dict, same contract) whose fp32 CPU calls may run
oneDNN, or int8 by opt-in. `set_cpu_kernel(model, kernel)` chooses for every layer; "auto" times oneDNN against
F.linear per shape at first use and keeps the choice per process (`cpu_kernel_table()`). Tested in
tests/test_fast_paths.py (every kernel against F.linear, the table's keys, the timing choice).

This file travels to the Hub as remote code with `modeling_vaswani.py`, which imports it relatively.
"""

import functools
import math
import os
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import is_torchdynamo_compiling

CPU_KERNELS = ("auto", "onednn", "int8", "aten")
FP32_CPU_KERNELS = ("onednn", "aten")  # what "auto" chooses between, per shape, by timing both on this CPU
# What "int8" chooses between, per shape, by timing both on this CPU: torch's dynamic int8 linear (weights per output
# channel, the activation per call) on fbgemm (activations in 7 bits, `reduce_range`, as fbgemm needs without VNNI) or
# on oneDNN (8 bits; VNNI and AMX where the CPU has them: 2–3.5× fbgemm's speed on an AMX Xeon at 32–128 rows).
INT8_ENGINES = ("fbgemm", "onednn")


@functools.cache
def cpu_isa() -> str:
    """The instruction set CPU kernels may use in this process: torch's ATen capability ("AVX2", "AVX512" ...) and
    oneDNN's cap where `ONEDNN_MAX_CPU_ISA` sets one (benchmarks' `--isa` sets both to measure another CPU class).

    Read once per process, as ATen and oneDNN read their caps once (benchmarks' `--isa` sets them before torch
    loads); `cpu_isa.cache_clear()` reads them again (tests/test_fast_paths.py)."""
    capability = torch.backends.cpu.get_cpu_capability()
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    return capability if not limit else f"{capability}, oneDNN ≤ {limit.upper()}"


# "auto"'s kernel in training, by the instruction set oneDNN runs (its cap where `ONEDNN_MAX_CPU_ISA` sets one, else
# ATen's capability), from the training benchmark's measurements: on AVX-512, oneDNN's three products made the step
# 1.25× Marian's (benchmarks/results/train-cpu2-2026-11-30-4.*); on AVX2 each was 13–22% slower than torch's matmul
# and timing chose torch's for every shape (train-cpu2-avx2-2026-11-30.*). Both of those were AMD EPYCs, where MKL
# (torch's matmul) runs its generic code; on an Intel AVX-512/AMX Xeon MKL runs its AVX-512 code, and the step with
# oneDNN's products was 0.74× Marian's against 0.98× with torch's (train-ab-cpu2-amx-2026-12-01.*): keyed by
# "<class> <vendor>" first, then "<class>". A table, not a timing: a run and its resume in a new process then round
# alike on one machine. Unlisted classes (ARM, no AVX2) keep torch's own kernel.
TRAINING_KERNEL_BY_ISA = {"AVX512": "onednn", "AVX512 GenuineIntel": "aten", "AVX2": "aten"}


@functools.cache
def cpu_vendor() -> str:
    """The CPU's vendor as /proc/cpuinfo names it ("GenuineIntel", "AuthenticAMD"; "" where unknown): MKL, torch's
    matmul on x86, runs its fastest code on Intel CPUs only."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def training_isa(capability: str, onednn_limit: str | None) -> str:
    """The class TRAINING_KERNEL_BY_ISA is keyed by: oneDNN's cap ("AVX2", "AVX512_CORE_VNNI" ...) if set, read as
    "AVX2" or "AVX512" (AVX10 and AMX caps allow AVX-512), else ATen's capability ("AVX2", "AVX512", "DEFAULT" ...)."""
    if not onednn_limit:
        return capability
    limit = onednn_limit.upper()
    if limit.startswith(("AVX512", "AVX10", "AMX", "ALL")):
        return "AVX512" if capability == "AVX512" else capability  # a cap cannot raise the CPU's own class
    return "AVX2" if limit.startswith("AVX2") else limit


@functools.cache
def int8_engines_available() -> tuple[str, ...]:
    """The INT8_ENGINES this torch build has ("fbgemm" also through its "x86" engine)."""
    engines = set(torch.backends.quantized.supported_engines)
    return tuple(e for e in INT8_ENGINES if e in engines or (e == "fbgemm" and "x86" in engines))


@functools.cache
def usable_int8_engines(asked: tuple[str, ...]) -> tuple[str, ...]:
    """Those of `asked` (a layer's `int8_engines`) this torch build has, in order; once per tuple, not per call."""
    return tuple(e for e in asked if e in int8_engines_available())


def _fbgemm_engine() -> str:
    return "fbgemm" if "fbgemm" in torch.backends.quantized.supported_engines else "x86"


@functools.cache
def training_kernel() -> str:
    """What "auto" runs in training on this CPU without `calibrate_training`: TRAINING_KERNEL_BY_ISA's entry for
    "`training_isa` `cpu_vendor`", else for `training_isa`, else "aten". Read once per process
    (`training_kernel.cache_clear()` reads the caps again)."""
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    isa = training_isa(torch.backends.cpu.get_cpu_capability(), limit)
    kernel = TRAINING_KERNEL_BY_ISA.get(f"{isa} {cpu_vendor()}", TRAINING_KERNEL_BY_ISA.get(isa, "aten"))
    return kernel if torch.backends.mkldnn.is_available() else "aten"


# "auto"'s and "int8"'s choices, filled at first use of each shape: (ISA, threads, "inference"/"training"/"int8",
# d_in, d_out, bias, rows bucket) → "onednn" or "aten" (int8: "fbgemm" or "onednn"). Per process, so per CPU and per
# --isa; `cpu_kernel_table()` reads it.
_KERNEL_TABLE: dict[tuple, str] = {}
CALIBRATION_REPEATS = 3  # timed calls per candidate (after one untimed), interleaved; the fastest call counts ...
# ... and more for short calls, up to CALIBRATION_MAX_REPEATS within ~CALIBRATION_BUDGET_S per candidate: with 3,
# a 0.3 ms product whose two kernels are 10% apart was picked either way from run to run on a shared 2-core machine
CALIBRATION_MAX_REPEATS, CALIBRATION_BUDGET_S = 25, 0.02


def cpu_kernel_table() -> dict[str, str]:
    """What "auto" chose so far in this process, readable: {"inference 512→2048, ≤128 rows (AVX2, 2 threads)": ...}."""
    return {
        f"{mode} {d_in}→{d_out}, ≤{rows} rows ({isa}, {threads} threads)": kernel
        for (isa, threads, mode, d_in, d_out, _, rows), kernel in _KERNEL_TABLE.items()
    }


def clear_cpu_kernel_table() -> None:
    """Forget "auto"'s choices (they are measured again at next use)."""
    _KERNEL_TABLE.clear()


def _rows_bucket(rows: int) -> int:
    """Calls are calibrated per power of two of their rows (1, 2, 4 ... 4096, then 4096 for all larger)."""
    return min(1 << max(rows - 1, 0).bit_length(), 4096)


class VaswaniLinear(nn.Linear):
    """nn.Linear (same parameters, same state dict) whose fp32 CPU calls may run a faster kernel.

    Only fp32 CPU calls outside autocast and torch.compile change kernel; accelerators and other dtypes use F.linear.
    "auto" (default): for each shape, the faster of "onednn" and "aten" on this CPU, measured at first use (a few
    calls of each on random inputs of that shape) and kept for the process; in training (forward and both backward
    products) only when `calibrate_training` is set, else the kernel TRAINING_KERNEL_BY_ISA names for this CPU's
    instruction set (`training_kernel()`). Which kernel wins depends on the CPU's instruction set
    (benchmarks/results/ has the measurements). "onednn": the same
    fp32 product through oneDNN, on a weight copy packed in oneDNN's blocked layout (inference) or through
    `_OneDNNLinear` (training). "int8": dynamic int8 quantization (weights per output channel, activations per call),
    an approximation and opt-in, inference only, on the faster of fbgemm and oneDNN for each shape (`int8_engines`,
    timed like "auto"; both within the int8 tolerance of tests/test_fast_paths.py). "aten": F.linear. The inference weight copy is rebuilt when
    the weight's version changes and dropped by `train()`/`eval()` and by any call with autograd on. Weights changed
    in place by a fused optimizer (no version bump) outside training mode need `train()`, `eval()` or
    `set_cpu_kernel()` before the next inference.
    """

    cpu_kernel = "auto" if torch.backends.mkldnn.is_available() else "aten"
    onednn_min_macs = 2**22  # below ~4M multiply-adds a call, F.linear (a oneDNN call has a fixed cost)
    onednn_training = True  # oneDNN allowed in training; off for lm_head, whose (tokens × vocab) products MKL wins
    # Training under "auto" runs `training_kernel()` (a table keyed by the instruction set) unless this is True: a
    # timed choice can differ between two runs of one command, and with it the rounding, so a training run (and its
    # resume in a new process) would not be reproducible. Inference timing only moves last bits of one call.
    calibrate_training = False
    int8_engines = INT8_ENGINES  # what "int8" times per shape (one name: that engine, nothing timed)

    def _fp32_cpu(self, x: torch.Tensor) -> bool:
        return (
            not is_torchdynamo_compiling()  # first: compiled code keeps F.linear, and must not trace the rest
            and self.cpu_kernel != "aten"
            and x.device.type == "cpu"
            and x.dtype == torch.float32
            and self.weight.dtype == torch.float32
            and not self.weight.is_inference()
            and not torch.is_autocast_enabled("cpu")  # autocast's bf16 goes through F.linear
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            kernel = self.cpu_kernel
            small = x.numel() * self.out_features < self.onednn_min_macs  # multiply-adds of this call
            rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
            if self.__dict__.get("_packed") is not None:
                self._packed = None  # training again: free the inference copy
            if self.onednn_training and kernel in ("auto", "onednn") and not small and self._fp32_cpu(x):
                timed = self.calibrate_training and kernel == "auto"
                choice = kernel if kernel == "onednn" else self._calibrated("training", rows) if timed else None
                if (choice or training_kernel()) == "onednn":
                    out = _OneDNNLinear.apply(x.reshape(-1, x.shape[-1]), self.weight, self.bias)
                    return out.view(*x.shape[:-1], self.out_features)
            return F.linear(x, self.weight, self.bias)
        kernel = self.inference_kernel(x)
        if kernel == "aten":
            return F.linear(x, self.weight, self.bias)
        out = self._fast_linear(x.reshape(-1, x.shape[-1]).contiguous(), kernel)  # (B·T, d_out)
        return out.view(*x.shape[:-1], self.out_features)  # (..., d_out)

    def inference_kernel(self, x: torch.Tensor) -> str:
        """What an inference call on `x` runs: "aten" (F.linear), "onednn" or "int8" ("auto" resolved)."""
        kernel = self.cpu_kernel
        small = x.numel() * self.out_features < self.onednn_min_macs  # multiply-adds of this call
        if (kernel in ("auto", "onednn") and small) or not self._fp32_cpu(x):
            return "aten"
        if kernel == "auto":
            return self._calibrated("inference", x.numel() // x.shape[-1] if x.shape[-1] else 0)
        return kernel

    def _fast_linear(self, x2: torch.Tensor, kernel: str) -> torch.Tensor:
        """x2 Wᵀ + b on a packed weight: kernel "onednn" (fp32), "int8" (the engine `int8_engines` gives for this
        shape), or one int8 engine by name ("int8-fbgemm", "int8-onednn")."""
        if kernel == "int8":
            engines = usable_int8_engines(self.int8_engines) or ("fbgemm",)
            kernel = "int8-" + (engines[0] if len(engines) == 1 else self._calibrated("int8", x2.shape[0]))
        packed = self._packed_weight(kernel)
        if kernel.startswith("int8"):
            return torch.ops.quantized.linear_dynamic(x2, packed, kernel == "int8-fbgemm")  # fbgemm: 7-bit inputs
        return torch.ops.mkldnn._linear_pointwise(x2, packed, self.bias, "none", [], "")  # dense in, dense out

    def _calibrated(self, mode: str, rows: int) -> str:
        bucket = _rows_bucket(rows)
        key = (cpu_isa(), torch.get_num_threads(), mode, self.in_features, self.out_features, self.bias is not None)
        key += (bucket,)
        choice = _KERNEL_TABLE.get(key)
        if choice is None:
            choice = _KERNEL_TABLE[key] = self._calibrate(mode, bucket)
            if mode == "int8" and self.__dict__.get("_packed") is not None:  # free the copies timing built ...
                copies = self._packed[1]  # ... but the chosen one
                for name in [k for k in copies if k.startswith("int8-") and k != f"int8-{choice}"]:
                    del copies[name]
        return choice

    def _calibrate(self, mode: str, rows: int) -> str:
        """The faster of "onednn" and "aten" for `rows` × d_in inputs (mode "int8": of the `int8_engines` this torch
        has): one untimed call of each, then CALIBRATION_REPEATS timed calls of each (more for short calls: as many
        as fit CALIBRATION_BUDGET_S, at most CALIBRATION_MAX_REPEATS), interleaved; the fastest single call of each
        counts."""
        g = torch.Generator().manual_seed(0)
        x = torch.randn(rows, self.in_features, generator=g)
        weight = self.weight.detach()
        bias = None if self.bias is None else self.bias.detach()
        if mode == "int8":
            engines = usable_int8_engines(self.int8_engines)
            candidates = {e: functools.partial(self._fast_linear, x, f"int8-{e}") for e in engines}
        elif mode == "inference":
            candidates = {
                "onednn": lambda: self._fast_linear(x, "onednn"),
                "aten": lambda: F.linear(x, weight, bias),
            }
        else:  # forward and backward on copies: the model's parameters and their .grad are not touched
            x.requires_grad_()
            w, b = weight.clone().requires_grad_(), None if bias is None else bias.clone().requires_grad_()
            grad = torch.randn(rows, self.out_features, generator=g)
            candidates = {
                "onednn": lambda: _OneDNNLinear.apply(x, w, b).backward(grad),
                "aten": lambda: F.linear(x, w, b).backward(grad),
            }
        if mode != "int8" and not torch.backends.mkldnn.is_available():
            return "aten"
        best = dict.fromkeys(candidates, math.inf)
        with torch.set_grad_enabled(mode == "training"):
            for run in candidates.values():
                run()
            repeats = CALIBRATION_REPEATS
            done = 0
            while done < repeats:
                for name, run in candidates.items():
                    start = time.perf_counter()
                    run()
                    best[name] = min(best[name], time.perf_counter() - start)
                done += 1
                if done == CALIBRATION_REPEATS:  # short calls: time more of them, within the budget
                    slowest = max(best.values())
                    repeats = max(repeats, min(CALIBRATION_MAX_REPEATS, int(CALIBRATION_BUDGET_S / slowest)))
        return min(best, key=best.get)

    def train(self, mode: bool = True) -> "VaswaniLinear":
        """Entering or leaving training drops the inference copies (this layer's, and the stacked one `fused_linear`
        keeps on it): a fused optimizer updates weights in place without bumping their version counter, so the
        version alone cannot tell that a copy is stale."""
        self._packed = None
        self.__dict__.pop("_stacked", None)
        return super().train(mode)

    def _packed_weight(self, kernel: str):
        """The weight packed for `kernel` ("onednn", "int8-fbgemm", "int8-onednn"), built at first use and kept
        (`_packed`: the weight's address and versions, and a copy per kernel) until the weight changes."""
        bias = self.bias
        key = (self.weight.data_ptr(), self.weight._version, None if bias is None else bias._version)
        cached = self.__dict__.get("_packed")
        if cached is None or cached[0] != key:
            cached = self._packed = (key, {})
        if kernel not in cached[1]:
            cached[1][kernel] = self._pack(kernel)
        return cached[1][kernel]

    def _pack(self, kernel: str):
        bias = self.bias
        weight = self.weight.detach()
        if kernel.startswith("int8"):  # symmetric, per output channel: scale_i = max_j |W_ij| / 127
            scales = weight.abs().amax(dim=1).clamp(min=1e-12).double() / 127.0
            zeros = torch.zeros(weight.shape[0], dtype=torch.long)
            engine = torch.backends.quantized.engine
            with warnings.catch_warnings():  # torch ≥ 2.12 flags quantized tensors as deprecated; fbgemm stays
                warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
                qweight = torch.quantize_per_channel(weight, scales, zeros, 0, torch.qint8)
                # the packed weight carries its engine: calls run it, whatever engine is set then
                torch.backends.quantized.engine = "onednn" if kernel == "int8-onednn" else _fbgemm_engine()
                try:
                    packed = torch.ops.quantized.linear_prepack(qweight, None if bias is None else bias.detach())
                finally:
                    torch.backends.quantized.engine = engine
        else:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight)  # oneDNN's blocked layout, packed once
        return packed


class _OneDNNLinear(torch.autograd.Function):
    """y = x Wᵀ + b with all three products of training (y, dL/dx, dL/dW) through oneDNN; fp32 CPU only."""

    @staticmethod
    def forward(ctx, x, weight, bias):  # (N, d_in), (d_out, d_in), (d_out,)
        x = x.contiguous()
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return torch._C._nn.mkldnn_linear(x.to_mkldnn(), weight.detach().to_mkldnn(), bias).to_dense()  # (N, d_out)

    @staticmethod
    def backward(ctx, grad):  # (N, d_out)
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        onednn = torch._C._nn.mkldnn_linear
        grad_x = onednn(grad.to_mkldnn(), weight.detach().t().contiguous().to_mkldnn(), None).to_dense()  # (N, d_in)
        grad_w = onednn(grad.t().contiguous().to_mkldnn(), x.t().contiguous().to_mkldnn(), None).to_dense()
        return grad_x, grad_w, grad.sum(0) if ctx.has_bias else None


def fused_linear(x: torch.Tensor, *layers: VaswaniLinear) -> tuple[torch.Tensor, ...]:
    """(x W_1ᵀ + b_1, x W_2ᵀ + b_2, ...) for linear layers reading one input (§3.2.2's Q, K and V projections of
    self-attention; K and V of encoder-decoder attention), exactly what calling each layer gives.

    Fast path, fp32 CPU inference where the stacked product runs oneDNN or int8 (`inference_kernel`; under F.linear
    each layer keeps its own call, so the plain path's numbers do not change): one product on the layers' weights
    stacked once ((Σ d_out, d_in), a copy kept on the first layer and rebuilt when a weight changes, as
    `VaswaniLinear`'s packed copy; the state dict is untouched). At 32 decoder rows, one 512→1536 product runs
    ~1.5× faster than three 512→512 ones on 2 AVX2 cores; at 128 rows it is not
    (benchmarks/results/generate-fused-ab-cpu2-avx2-2026-12-01.md). int8 gives the
    same numbers either way (weights quantized per output row, the activation once per call); fp32 within rounding
    (tests/test_fast_paths.py). Anything else (training, accelerators, other dtypes, "aten", layers with hooks or
    replaced by an adapter): one call per layer."""
    first = layers[0]
    if (
        torch.is_grad_enabled()
        or first.cpu_kernel == "aten"
        or not all(
            type(layer) is VaswaniLinear
            and layer.cpu_kernel == first.cpu_kernel
            and layer.in_features == first.in_features
            and (layer.bias is None) == (first.bias is None)
            and not (layer._forward_hooks or layer._forward_pre_hooks)
            for layer in layers
        )
        or not first._fp32_cpu(x)
    ):
        return tuple(layer(x) for layer in layers)
    stacked = _stacked_layer(layers)
    if stacked.inference_kernel(x) == "aten":  # a small product, or "auto" timed F.linear faster for this shape
        return tuple(layer(x) for layer in layers)
    return stacked(x).split([layer.out_features for layer in layers], dim=-1)


def _stacked_layer(layers: tuple[VaswaniLinear, ...]) -> VaswaniLinear:
    """One VaswaniLinear over the layers' weights stacked (not a submodule: kept in the first layer's __dict__)."""
    first = layers[0]
    key = tuple((p.data_ptr(), p._version) for layer in layers for p in (layer.weight, layer.bias) if p is not None)
    cached = first.__dict__.get("_stacked")
    if cached is None or cached[0] != key:
        with torch.inference_mode(False), torch.no_grad():  # a normal tensor (it gets packed), even in inference mode
            d_out = sum(layer.out_features for layer in layers)  # built on "meta": no random init, no RNG draw
            stacked = VaswaniLinear(first.in_features, d_out, first.bias is not None, device="meta")
            stacked.weight = nn.Parameter(torch.cat([layer.weight for layer in layers]), requires_grad=False)
            if first.bias is not None:
                stacked.bias = nn.Parameter(torch.cat([layer.bias for layer in layers]), requires_grad=False)
        cached = first.__dict__["_stacked"] = (key, stacked)
    stacked = cached[1]
    stacked.cpu_kernel, stacked.onednn_min_macs = first.cpu_kernel, first.onednn_min_macs
    stacked.int8_engines = first.int8_engines
    return stacked


def check_cpu_kernel(kernel: str) -> str:
    """The kernel name, if this torch build can run it; else a ValueError that says why."""
    if kernel not in CPU_KERNELS:
        raise ValueError(f"cpu_kernel must be one of {CPU_KERNELS}, got {kernel!r}")
    if kernel == "onednn" and not torch.backends.mkldnn.is_available():
        raise ValueError("cpu_kernel 'onednn' needs a torch build with oneDNN (torch.backends.mkldnn)")
    if kernel == "int8" and not {"fbgemm", "x86"} & set(torch.backends.quantized.supported_engines):
        raise ValueError("cpu_kernel 'int8' needs torch's fbgemm/x86 quantized engine, absent from this build")
    return kernel


def set_cpu_kernel(model: nn.Module, kernel: str) -> nn.Module:
    """Every `VaswaniLinear` of `model` runs `kernel` on fp32 CPU from its next call (inference copies dropped)."""
    check_cpu_kernel(kernel)
    for module in model.modules():
        if isinstance(module, VaswaniLinear):
            module.cpu_kernel = kernel
            module._packed = None
            module.__dict__.pop("_stacked", None)
    return model
