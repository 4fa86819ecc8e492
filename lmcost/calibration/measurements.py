"""Measured kernel times as data: a table of single-kernel timings, each row turned into lmcost's own
cost records of the same kernel, ready to fit the efficiency model on (:mod:`lmcost.calibration.efficiency_fit`).

The table's format is that of ``lmcost/data/measurements/public-kernels.csv``, a copy of the developers'
collection of published A100/H100/H200/B200 single-kernel timings, one row per published figure with its
source (issue thread, repository file or paper table) and how the time was derived from what was
published. A user's own table takes the same columns; the ``device`` column may also name a shipped GPU
(``h100``) directly.

Columns read: device, dtype, op, implementation, M, N, K, batch, seq_q, seq_kv, heads_q, heads_kv,
head_dim, causal, tokens, hidden, time_us, source, and where present engine and engine_version (the
engines' table, ``engine-kernels.csv``: vLLM, SGLang and TensorRT-LLM kernels measured by
aiconfigurator-core; its devices are shipped GPU names). Ops: gemm, attention_prefill, attention_decode,
rmsnorm, layernorm, rope, silu_mul, add, softmax. dtype fp4 (NVFP4; MXFP4 on an AMD device) is read for gemm rows only, timed at
the GPU's ``fp4`` peak.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path

from lmcost.cost import kernels as kernel

from lmcost.basics import shipped as resources
from lmcost.basics.dtypes import Precision, canonical
from lmcost.basics.errors import LmcostError
from lmcost.basics.files import read_text
from lmcost.hardware.gpu import GPU, PEAK_ONLY, load_gpu
from lmcost.operators.ops import OpCost, linear
from lmcost.cost.roofline import OpTime, op_time

#: The published table shipped with lmcost (the default fitting set of ``lmcost fit``).
PUBLIC_TABLE = "public-kernels.csv"
#: The engines' measured kernel table shipped with lmcost: a seeded, stratified sample of the per-operator
#: tables of aiconfigurator-core 0.12.0 (vLLM, SGLang, TensorRT-LLM; see ``engine-kernels.md`` beside it
#: and ``benchmarks/convert_aic_kernels.py``). Its rows carry ``engine`` and ``engine_version``.
ENGINE_TABLE = "engine-kernels.csv"

#: Bytes per element of an NVFP4 operand: a 4-bit E2M1 value (0.5 byte) plus its share of one E4M3 scale
#: per 16-element block (1/16 byte); the per-tensor fp32 scale is not counted (NVIDIA, "Introducing NVFP4
#: for efficient and accurate low-precision inference", 2025). Fewer bytes than a run writes (its output is
#: bf16), so the roofline of an fp4 row stays a lower bound.
FP4_BYTES = 0.5 + 1 / 16
#: Bytes per element of an MXFP4 operand, the fp4 format of an AMD GPU (:attr:`lmcost.hardware.gpu.GPU.fp4_format`):
#: 0.5 byte plus one E8M0 scale per 32-element block (OCP Microscaling Formats v1.0: 17 B per 32 values).
MXFP4_BYTES = 0.5 + 1 / 32

#: Device strings of the published table -> (shipped GPU, bandwidth TB/s override or None, note).
#: A row names its device as its source did; where the source left the variant unstated the note says
#: what is assumed. Compute-bound rows do not depend on the variant (A100 SXM and PCIe share the
#: 312 TFLOP/s bf16 peak); memory-bound rows do, and all of those state their variant.
DEVICES = {
    "A100 (variant not stated)": ("a100-80gb", None, "variant not stated: assumed SXM4 80GB"),
    "A100-40GB-PCIe": ("a100-40gb", None, ""),
    "A100-PCIe": ("a100-80gb", 1.935, "A100 PCIe (memory not stated): the 80GB PCIe bandwidth, 1.935 TB/s"),
    "A100-PCIe-80GB": ("a100-80gb", 1.935, "NVIDIA A100 datasheet, 80GB PCIe column: 1,935 GB/s"),
    "A100-SXM": ("a100-80gb", None, ""),
    "A100-SXM4-80GB": ("a100-80gb", None, ""),
    "B200": ("b200", None, ""),
    "H100-NVL": ("h100-sxm", 3.9, "NVIDIA H100 datasheet, H100 NVL column: 3.9 TB/s (its tensor peak is "
                                   "lower than SXM's, 835 vs 989 TFLOP/s bf16; only its memory-bound rows are used)"),
    "H100-PCIe": ("h100-pcie", None, ""),
    "H100-SXM": ("h100-sxm", None, ""),
    "H200": ("h200", None, ""),
}

#: Architecture families: a fit pools the rows of every device of a family, each taken relative to its
#: own peak and bandwidth (the kernels, compilers and libraries are the same within a family).
#: The RTX PRO 6000 (SM120, GDDR7) is a family of its own: its kernels are not SM100's (no TMEM/tcgen05).
FAMILIES = {"a100-40gb": "ampere", "a100-80gb": "ampere", "h100-sxm": "hopper", "h100-pcie": "hopper",
            "h200": "hopper", "b200": "blackwell", "b300": "blackwell", "gb200": "blackwell", "gb300": "blackwell",
            "l40s": "ada", "rtx-pro-6000": "blackwell-ws"}

#: The shipped GPUs ``lmcost fit`` writes blocks for by default: those whose family has rows of every
#: class the model needs and whose SM count is sourced. B200 has 16 rows (two GEMM shapes, FA2
#: prefill, CUB adds) and no sourced SM count here: it keeps its roofline, and its rows inform the
#: fit pooled over families (the prior).
FITTED = ("a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200")

#: Kernel families of attention, from the implementation column (first match wins). The first names
#: engine-kernels.csv's FA3 labels whole (vLLM's flash-attn fork on Hopper, SGLang's fa3 backend); the
#: fork's other labels (vllm_flash_attn, _fa2: FA2 on Ampere and Ada) are FA2, but not its FA4 label,
#: which no family here covers ("auto").
ATTENTION_FAMILIES = (
    (r"^(vllm_flash_attn_fa3|fa3)$", "fa3"),
    (r"PagedAttention V1", "paged-v1"), (r"PagedAttention V2", "paged-v2"), (r"FA3", "fa3"),
    (r"FA2|flash_attn(?!_fa[34])", "fa2"), (r"cuDNN", "cudnn"), (r"FlexAttention", "flex"), (r"TLX", "tlx"),
    (r"Triton tutorial", "triton"), (r"SDPA", "sdpa"),
)

#: Runtimes of memory-bound kernels, from the implementation column: ``triton`` (fused Triton kernels:
#: Liger, the Triton tutorials; torch.compile emits the same kind), ``torch-eager`` (ATen's native
#: kernels), ``cuda`` (hand-written CUDA C++: CUB, vLLM's custom ops).
RUNTIMES = ((r"Liger|Triton", "triton"), (r"torch\.|native", "torch-eager"), (r"cub::|CUDA", "cuda"))

#: Implementations whose kernel lmcost has no record of (a fused residual add + RMSNorm reads and
#: writes two tensors, not one): their rows are not fitted on, and the report says so.
UNMODELLED = (r"fused add\+RMSNorm",)

#: Sources left out of fitting and evaluation, with the reason their own notes give.
EXCLUDED_SOURCES = {
    "vllm-project/vllm#13917": "its notes: times near 69-70 us for very different FLOP counts are a fixed floor of "
                               "the benchmark harness, not the kernel",
}

#: Most rows a table may have: leave-one-source-out refits once per source, each over every row; a
#: table of tens of thousands of figures is a measurement campaign to split, not one fitting set.
MAX_ROWS = 20_000
#: Most bytes read from a table: MAX_ROWS rows of up to 2,000 bytes each.
MAX_TABLE_BYTES = MAX_ROWS * 2000

#: Table columns of each field the kernel builders (lmcost.cost.kernels) name in their errors (a row error names the column).
COLUMN_OF_FIELD = {"m": "M", "n": "N", "k": "K", "attention.batch": "batch", "heads": "heads_q",
                   "kv_heads": "heads_kv", "head_dim": "head_dim", "seq": "seq_q", "kv_len": "seq_kv",
                   "norm.tokens": "tokens", "elementwise.tokens": "tokens", "hidden": "hidden", "width": "hidden",
                   "rows": "M", "cols": "N", "attention.phase": "phase"}

#: The class of each table op that is not a class itself (gemm, attention_prefill, attention_decode, softmax).
CLASS_OF_OP = {"rmsnorm": "norm", "layernorm": "norm", "rope": "elementwise", "silu_mul": "elementwise",
               "add": "elementwise"}


def class_of(op: str) -> str:
    """The class of a table op (a class name is its own class)."""
    return CLASS_OF_OP.get(op, op)


#: The classes errors and bands are reported by.
CLASSES = ("gemm", "attention_prefill", "attention_decode", "norm", "elementwise", "softmax")


@dataclass(frozen=True)
class Measurement:
    """One measured kernel: lmcost's records of it (``ops``), on ``gpu`` (the row's device, with its
    own bandwidth where it differs from the shipped file's), its measured time (s) and provenance."""

    index: int          # 1-based data row of the table
    device: str         # as the table gives it
    gpu: GPU
    family: str         # architecture family (FAMILIES), or the GPU's name
    dtype: str
    op: str             # the table's op: gemm, attention_prefill, ..., silu_mul
    implementation: str
    impl_family: str    # attention kernel family (fa2, fa3, ...), runtime (triton, ...), or "" (GEMMs)
    ops: tuple
    time_s: float
    source: str
    engine: str = ""          # the serving engine whose kernel this is (vllm, sglang, trtllm); "" if not given
    engine_version: str = ""  # that engine's version as the table gives it; "" if not given

    @property
    def cls(self) -> str:
        """The class errors and bands are reported by (:data:`CLASSES`)."""
        return class_of(self.op)

    @property
    def roofline_s(self) -> float:
        """The kernel's roofline time on its device (s): its records' together, an in-kernel softmax's included.
        An ``fp4`` row (a rate, not a storage dtype: :data:`lmcost.hardware.gpu.PEAK_ONLY`) runs its matmuls at
        ``gpu.peak_flops('fp4')``; its bytes are in its records already (:data:`FP4_BYTES`, :data:`MXFP4_BYTES`
        on an AMD device)."""
        if self.dtype in PEAK_ONLY:
            return sum(float(OpTime(compute_s=o.flops / (self.gpu.peak_flops(self.dtype) if o.matmul else self.gpu.vector_flops),
                                    memory_s=o.bytes / self.gpu.bandwidth,
                                    floor_s=(self.gpu.kernel_floor_us or 0.0) * 1e-6).time_s) for o in self.ops)
        p = Precision(self.dtype, self.dtype, self.dtype)
        return sum(float(op_time(o, self.gpu, p).time_s) for o in self.ops)

    @property
    def main(self) -> OpCost:
        """The record that launches the kernel (a flash kernel's, not its in-kernel softmax)."""
        return next(op for op in self.ops if op.kernels)


def _int(row: dict, key: str, where: str) -> int:
    v = (row.get(key) or "").strip()
    try:
        f = float(v)
    except ValueError:
        raise LmcostError(f"{where}: {key}", f"{v!r} is not a number", f"give {key} for this op") from None
    if not f.is_integer():
        raise LmcostError(f"{where}: {key}", f"{v!r} is not a whole number", f"give {key} as a count")
    return int(f)


def _causal(row: dict, where: str) -> bool:
    v = (row.get("causal") or "").strip().lower()
    if v in ("true", "1"):
        return True
    if v in ("false", "0"):
        return False
    raise LmcostError(f"{where}: causal", f"{row.get('causal')!r} is not True or False",
                      "write True (causal mask) or False (full attention)")


def _dtype(text: str, where: str) -> str:
    t = text.strip().lower()
    if t.startswith("not stated"):
        return "bf16"  # fp16 and bf16 share every peak and width lmcost uses
    m = re.match(r"(fp8|fp4|bf16|fp16|fp32|int8)", t)
    if not m:
        raise LmcostError(f"{where}: dtype", f"unknown dtype {text!r}", "use bf16, fp16, fp32, fp8, fp4 or int8")
    return m.group(1) if m.group(1) in PEAK_ONLY else canonical(m.group(1), "dtype")


def _device(text: str, where: str) -> tuple[GPU, str]:
    for key, (name, bw, _) in DEVICES.items():
        if text == key or text.startswith(key + " ("):  # "H100-SXM (NVIDIA H100 80GB HBM3)"
            gpu = load_gpu(name)
            if bw is not None:
                gpu = gpu.model_copy(update={"bandwidth_tb_s": bw})
            return gpu, FAMILIES.get(name, name)
    if text.startswith("H100 ("):  # "H100 (variant not stated)", "H100 (stated only as 'Hopper')": SXM assumed
        return load_gpu("h100-sxm"), "hopper"
    try:
        gpu = load_gpu(text)
    except LmcostError:
        raise LmcostError(f"{where}: device", f"unknown device {text!r}",
                          "name a shipped GPU (lmcost gpus) or a device of the published table") from None
    return gpu, FAMILIES.get(gpu.name, gpu.name)


def _family(implementation: str, table) -> str:
    for pattern, name in table:
        if re.search(pattern, implementation):
            return name
    return "auto"


def _ops(op: str, row: dict, dtype: str, where: str, fp4_bytes: float = FP4_BYTES) -> list[OpCost]:
    g = lambda k: _int(row, k, where)  # noqa: E731
    if op == "gemm":
        if dtype == "fp4":  # operands in the device's FP4 format (fp4_bytes each); the kernel builders know storage dtypes only
            ref = kernel.gemm(g("M"), g("N"), g("K"), "fp8")[0]
            return [linear("gemm", g("M"), g("K"), g("N"), fp4_bytes, fp4_bytes, shapes=ref.shapes)]
        return kernel.gemm(g("M"), g("N"), g("K"), dtype)
    if dtype in PEAK_ONLY:
        raise LmcostError(f"{where}: dtype", f"{dtype} is a matmul rate, not a storage dtype of {op}",
                          "give fp4 rows for gemm only")
    if op in ("attention_prefill", "attention_decode"):
        causal = _causal(row, where) if op == "attention_prefill" else True
        phase = op.removeprefix("attention_")
        return kernel.attention(phase, g("batch"), g("heads_q"), g("heads_kv"), g("head_dim"),
                                seq=g("seq_q") if phase == "prefill" else None, kv_len=g("seq_kv"),
                                causal=causal, dtype=dtype)
    if op in ("rmsnorm", "layernorm"):
        return kernel.norm(op, g("tokens"), g("hidden"), dtype)
    if op == "rope":
        return kernel.elementwise("rope", g("tokens"), heads=g("heads_q"), kv_heads=g("heads_kv"),
                                  head_dim=g("head_dim"), dtype=dtype)
    if op == "silu_mul":
        return kernel.elementwise("silu_mul", g("tokens"), width=g("hidden"), dtype=dtype)
    if op == "add":
        return kernel.elementwise("add", g("M"), width=1, dtype=dtype)
    if op == "softmax":
        return kernel.softmax(g("M"), g("N"), dtype)
    raise LmcostError(f"{where}: op", f"unknown op {op!r}",
                      "use gemm, attention_prefill, attention_decode, rmsnorm, layernorm, rope, silu_mul, add or softmax")


def public_table() -> Path:
    """Path of the shipped table of published kernel timings."""
    return resources.folder("measurements") / PUBLIC_TABLE


def engine_table() -> Path:
    """Path of the shipped table of the engines' measured kernel timings (:data:`ENGINE_TABLE`)."""
    return resources.folder("measurements") / ENGINE_TABLE


def load_table(path: str | Path | None = None, like: str = PUBLIC_TABLE) -> tuple[list[Measurement], list[tuple[int, str]]]:
    """The measurements of a table (default: the shipped public one; :func:`engine_table` the engines'),
    and the rows left out with why. A row's ``engine`` and ``engine_version`` are "" where the table has no
    such columns.

    Rows whose implementation lmcost has no record of (:data:`UNMODELLED`) are left out, not refused.
    ``like``: the shipped table whose columns a table missing some is told to give (:data:`ENGINE_TABLE` for
    ``fit --engines``).
    Raises: LmcostError for a missing file, a missing (field ``table``, naming the columns) or repeated column, or a row that does not parse
    (naming the row and the field).
    """
    if path is not None and not str(path).strip():
        raise LmcostError("table", "empty", "give a CSV of kernel timings (see lmcost/data/measurements/)")
    path = Path(path) if path is not None else public_table()
    text = read_text(path, MAX_TABLE_BYTES, "CSV of kernel timings")  # a spreadsheet's byte-order mark dropped
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        rows = list(reader)
    except csv.Error as e:
        raise LmcostError(str(path), f"not a readable CSV ({e})", "give a UTF-8 CSV with a header row") from None
    # DictReader keeps the last of two same-named columns silently; " time_us" is time_us (stripped below)
    names = [c.strip() for c in reader.fieldnames or []]
    twice = next((c for i, c in enumerate(names) if c and c in names[:i]), None)
    if twice is not None:
        raise LmcostError(f"{path}: {twice}", "column given twice in the header", "keep one column of that name")
    need = ("device", "dtype", "op", "implementation", "time_us", "source")
    if not rows:
        raise LmcostError(str(path), "no data rows", "give a CSV with a header and one row per measured kernel")
    if len(rows) > MAX_ROWS:
        raise LmcostError(str(path), f"{len(rows):,} rows is beyond one fitting set", f"split it into tables of at most {MAX_ROWS:,} rows")
    rows = [{(k.strip() if isinstance(k, str) else k): v for k, v in r.items()} for r in rows]  # " time_us" is time_us
    missing = [c for c in need if c not in rows[0]]
    if missing:
        raise LmcostError("table", f"{path.name} lacks the column(s) {', '.join(missing)}",
                          f"give the columns of {like} ({', '.join(need)} and the shape columns)")
    out, skipped, gpus = [], [], {}
    for i, row in enumerate(rows, start=1):
        where = f"{path.name} row {i}"
        if None in row:
            raise LmcostError(where, f"{len(row[None])} more field(s) than the header", "remove them, or name them in the header")
        short = [k for k, v in row.items() if v is None]  # a cut-off row: DictReader fills its tail with None
        if short:
            raise LmcostError(where, f"fewer fields than the header (no {', '.join(short)})", "complete the row")
        impl = (row.get("implementation") or "").strip()
        if not impl:
            raise LmcostError(f"{where}: implementation", "empty", "name the kernel (FA2, cuBLAS, Liger, torch.nn.LayerNorm, ...)")
        if any(re.search(p, impl) for p in UNMODELLED):
            skipped.append((i, f"{impl}: a kernel lmcost has no record of"))
            continue
        why = EXCLUDED_SOURCES.get((row.get("source") or "").strip())
        if why:
            skipped.append((i, f"{row['source'].strip()}: {why}"))
            continue
        op = (row.get("op") or "").strip()
        dtype = _dtype(row.get("dtype") or "", where)
        dev = (row.get("device") or "").strip()
        if dev not in gpus:  # a GPU file is read once per table, not once per row
            gpus[dev] = _device(dev, where)
        gpu, family = gpus[dev]
        try:
            t = float(row["time_us"]) * 1e-6
        except (TypeError, ValueError):
            raise LmcostError(f"{where}: time_us", f"{row.get('time_us')!r} is not a number", "give microseconds") from None
        if not 0 < t < 1e5:
            raise LmcostError(f"{where}: time_us", f"{row['time_us']} is not a kernel time",
                              "give microseconds, above 0 and below 1e11 (a day)")
        if not (row.get("source") or "").strip():
            raise LmcostError(f"{where}: source", "missing", "every figure names where it was published or measured")
        table = ATTENTION_FAMILIES if op.startswith("attention") else RUNTIMES if op != "gemm" else ()
        try:
            ops = tuple(_ops(op, row, dtype, where, MXFP4_BYTES if gpu.fp4_format == "MXFP4" else FP4_BYTES))
        except LmcostError as e:
            if e.field.startswith(where):
                raise
            col = COLUMN_OF_FIELD.get(e.field, e.field)
            raise LmcostError(f"{where}: {col}", e.what, f"fix the row's {col}") from None
        if dtype not in gpu.peak_tflops:
            raise LmcostError(f"{where}: dtype", f"{gpu.name} has no {dtype} rate", "check the row's device and dtype")
        m = Measurement(i, row["device"].strip(), gpu, family, dtype, op, impl,
                        _family(impl, table) if table else "", ops, t, row["source"].strip(),
                        (row.get("engine") or "").strip(), (row.get("engine_version") or "").strip())
        roof = m.roofline_s
        if t < roof * 0.98:  # 2%: the datasheet's rounding and a boost clock
            raise LmcostError(f"{where}: time_us", f"{t * 1e6:.4g} us is faster than this kernel's roofline on "
                              f"{gpu.name} ({roof * 1e6:.4g} us)", "check the row's shape, dtype, device and time")
        out.append(m)
    return out, skipped

