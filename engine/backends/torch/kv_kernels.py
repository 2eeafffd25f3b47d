"""C kernels for quantized K/V on a cpu (kv_kernels.c): a decode step's token quantized straight into the
cache's buffers, and the attended view dequantized, each in one call. In torch ops a layer's step takes
some thirty small ops and five passes over the view, a third of a small model's step
(benchmarks/kv_quant.py measures both).

Built on first use with the machine's C compiler (`$CC`, else cc / gcc / clang) into
`$XDG_CACHE_HOME/kakeya/kernels` (default ~/.cache/kakeya/kernels), one file per source and compiler,
and loaded with ctypes. Where there is no compiler, the build fails, or `KAKEYA_KV_KERNELS=torch` is set,
`library()` is None and the torch backend runs its torch ops, which give the same bytes (tests compare
the two). `status()` says which is in use and why."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("kv_kernels.c")
# No contraction of a * b + c into a fused multiply-add: the results stay those of the torch ops.
FLAGS = ["-O3", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC"]

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_UNITS = [_I64, _I64, _I64, _I64, _I64, ctypes.c_int]  # d0, d1, d2, groups, group, bits
_STRIDES = [_I64, _I64, _I64]


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kakeya" / "kernels"


def _compiler() -> list[str] | None:
    if cc := os.environ.get("CC"):
        return shlex.split(cc)
    found = next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    return None if found is None else [found]


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str]:
    if os.environ.get("KAKEYA_KV_KERNELS", "").lower() == "torch":
        return None, "torch ops (KAKEYA_KV_KERNELS=torch)"
    cc = _compiler()
    if cc is None:
        return None, "torch ops (no C compiler: set CC, or install cc)"
    stamp = "\0".join([SOURCE.read_text(), *cc, *FLAGS, platform.system(), platform.machine()])
    lib = cache_dir() / f"kv_kernels-{hashlib.sha256(stamp.encode()).hexdigest()[:16]}.so"
    if not lib.exists():
        try:
            lib.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:  # built aside, then renamed: atomic
                built = Path(tmp) / lib.name
                run = subprocess.run(
                    [*cc, *FLAGS, "-o", str(built), str(SOURCE)], capture_output=True, text=True, timeout=120
                )
                if run.returncode != 0:
                    last = (run.stderr.strip().splitlines() or ["no output"])[-1]
                    return None, f"torch ops ({' '.join(cc)} could not build {SOURCE.name}: {last})"
                os.replace(built, lib)
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"torch ops (building {SOURCE.name} failed: {exc})"
    try:
        dll = ctypes.CDLL(str(lib))
    except OSError as exc:
        return None, f"torch ops (could not load {lib}: {exc})"
    dll.kv_quantize.argtypes = [_PTR, *_STRIDES, *_UNITS, _PTR, *_STRIDES, _PTR, _PTR, *_STRIDES]
    dll.kv_dequantize.argtypes = [_PTR, *_UNITS, *_STRIDES, _PTR, _PTR, *_STRIDES, _PTR, *_STRIDES]
    dll.kv_quantize.restype = dll.kv_dequantize.restype = None
    return dll, f"C kernels ({lib})"


def library() -> ctypes.CDLL | None:
    return _load()[0]


def status() -> str:
    """Which quantized K/V kernels the torch backend uses on a cpu, and why."""
    return _load()[1]


def _fits(codes: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, bits: int, group: int) -> bool:
    """Grouped cpu buffers the kernels can address: [d0, d1, d2, groups, per] uint8 codes (per = group, or
    group / 2 at 4 bits) and [..., groups, 1] float32 scales and biases of the same strides, each unit
    contiguous inside (any strides between units)."""
    return (
        bits in (4, 8)
        and codes.dim() == 5
        and codes.device.type == "cpu"
        and codes.dtype == torch.uint8
        and scales.dtype == biases.dtype == torch.float32
        and scales.device == biases.device == codes.device
        and codes.shape[4] == (group // 2 if bits == 4 else group)
        and scales.shape == biases.shape == (*codes.shape[:4], 1)
        and codes.stride(4) == 1
        and codes.stride(3) == codes.shape[4]
        and scales.stride(3) == 1
        and scales.stride() == biases.stride()
    )


def quantize_into(
    x: torch.Tensor, bits: int, group: int, codes: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor
) -> bool:
    """Quantize x [d0, d1, d2, groups * group] (float32, cpu) into the grouped buffers (views of the
    cache's, any unit strides); False where the kernel does not apply (the caller uses torch ops)."""
    lib = library()
    if (
        lib is None
        or x.dtype != torch.float32
        or x.device.type != "cpu"
        or x.shape != (*codes.shape[:3], codes.shape[3] * group)
        or not _fits(codes, scales, biases, bits, group)
    ):
        return False
    if x.stride(3) != 1:
        x = x.contiguous()
    d0, d1, d2, width = x.shape
    (x0, x1, x2, _), (s0, s1, s2, _, _), (t0, t1, t2, _, _) = x.stride(), codes.stride(), scales.stride()
    xp, cp, sp, bp = x.data_ptr(), codes.data_ptr(), scales.data_ptr(), biases.data_ptr()
    _chunked(
        lambda a, n: lib.kv_quantize(
            xp + 4 * a * x2, x0, x1, x2, d0, d1, n, width // group, group, bits,
            cp + a * s2, s0, s1, s2, sp + 4 * a * t2, bp + 4 * a * t2, t0, t1, t2,
        ),
        d2,
        x.numel(),
    )  # fmt: skip
    return True


def dequantize(
    codes: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, bits: int
) -> torch.Tensor | None:
    """scale * code + bias of grouped buffers (views, any unit strides) as a new [d0, d1, d2, groups,
    group] float32 tensor; None where the kernel does not apply."""
    lib = library()
    group = 2 * codes.shape[-1] if bits == 4 else codes.shape[-1]
    if lib is None or not _fits(codes, scales, biases, bits, group):
        return None
    d0, d1, d2, groups, _ = codes.shape
    return _dequantize(
        lib, (codes.data_ptr(), scales.data_ptr(), biases.data_ptr()), codes.stride()[:3],
        scales.stride()[:3], (d0, d1, d2), groups, group, bits,
    )  # fmt: skip


def _dequantize(
    lib: ctypes.CDLL,
    ptrs: tuple[int, int, int],
    cs: tuple[int, ...],
    ts: tuple[int, ...],
    dims: tuple[int, int, int],
    groups: int,
    group: int,
    bits: int,
) -> torch.Tensor:
    """kv_dequantize of dims units at codes / scales / biases addresses `ptrs` (unit strides cs, ts)
    into a new [*dims, groups, group] float32 tensor, over slot ranges on threads where it is long."""
    (cp, sp, bp), (s0, s1, s2), (t0, t1, t2), (d0, d1, d2) = ptrs, cs, ts, dims
    out = torch.empty((d0, d1, d2, groups, group), dtype=torch.float32)
    o0, o1, o2, _, _ = out.stride()
    op = out.data_ptr()
    _chunked(
        lambda a, n: lib.kv_dequantize(
            cp + a * s2, d0, d1, n, groups, group, bits, s0, s1, s2,
            sp + 4 * a * t2, bp + 4 * a * t2, t0, t1, t2, op + 4 * a * o2, o0, o1, o2,
        ),
        d2,
        out.numel(),
    )  # fmt: skip
    return out


PARALLEL_MIN = 1 << 20  # values per thread below which one call does it all
_POOLS: dict[int, ThreadPoolExecutor] = {}  # by size, made on first use


def _chunked(call: Callable[[int, int], None], slots: int, values: int) -> None:
    """call(first slot, slots) once, or (a long view, torch allowed several threads) over as many slot
    ranges at once on a thread pool: ctypes releases the GIL for the call."""
    n = min(torch.get_num_threads(), values // PARALLEL_MIN, slots)
    if n <= 1:
        call(0, slots)
        return
    if (pool := _POOLS.get(n)) is None:
        pool = _POOLS[n] = ThreadPoolExecutor(max_workers=n, thread_name_prefix="kv_kernels")
    step = -(-slots // n)
    for done in [pool.submit(call, a, min(step, slots - a)) for a in range(0, slots, step)]:
        done.result()


class Buffers:
    """One set of a layer's grouped cache buffers ([rows, heads, slots, groups, per] codes, [..., groups,
    1] scales and biases), checked once and addressed directly: a decode step's write and read are two
    kernel calls, with no views made and nothing checked again but the step's own bounds."""

    def __init__(
        self, codes: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, bits: int, group: int
    ):
        self.lib = library()
        self.bits, self.group = bits, group
        self.rows, self.heads, self.slots, self.groups, _ = codes.shape
        self.codes, self.scales, self.biases = codes.data_ptr(), scales.data_ptr(), biases.data_ptr()
        self.cs, self.ss = codes.stride()[:3], scales.stride()[:3]
        self.width = self.groups * group
        self._keep = (codes, scales, biases)  # the memory the addresses point into

    @classmethod
    def of(
        cls, codes: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, bits: int, group: int
    ) -> Buffers | None:
        """The buffers' kernel addressing; None where the kernels do not apply (torch ops do)."""
        if library() is None or not _fits(codes, scales, biases, bits, group) or not codes.is_contiguous():
            return None
        return cls(codes, scales, biases, bits, group)

    def step(self, x: torch.Tensor, row: int, start: int, view: int) -> torch.Tensor | None:
        """Quantize x [1, heads, k, width] (float32, cpu) into slots start..start+k of `row`, then
        return slots 0..view of that row dequantized ([1, heads, view, groups, group]); None where x
        does not fit (the caller uses torch ops)."""
        k = x.shape[2]
        if (
            x.dtype != torch.float32
            or x.device.type != "cpu"
            or x.shape != (1, self.heads, k, self.width)
            or x.stride(3) != 1
            or not (
                0 <= row < self.rows and start >= 0 and start + k <= self.slots and 0 <= view <= self.slots
            )
        ):
            return None
        assert self.lib is not None
        (s0, s1, s2), (t0, t1, t2) = self.cs, self.ss
        c, s, b = self.codes + row * s0, self.scales + 4 * row * t0, self.biases + 4 * row * t0
        x0, x1, x2, _ = x.stride()
        bits, group, groups = self.bits, self.group, self.groups
        self.lib.kv_quantize(
            x.data_ptr(), x0, x1, x2, 1, self.heads, k, groups, group, bits,
            c + start * s2, s0, s1, s2, s + 4 * start * t2, b + 4 * start * t2, t0, t1, t2,
        )  # fmt: skip
        return _dequantize(self.lib, (c, s, b), self.cs, self.ss, (1, self.heads, view), groups, group, bits)
