"""The reference decoder sharded over N processes with ``torch.distributed`` (gloo, CPU, fp32): the
oracle for the collectives of :mod:`lmcost.operators.parallel`.

:func:`run_sharded` builds, in every rank, the same seeded :class:`~lmcost.profiling.decoder.ReferenceDecoder`
as an unsharded run, keeps its rank's slice of the weights, runs a prefill and ``gen`` decode steps
under a layout, and returns the largest difference of its logits from the unsharded decoder's and
every collective each rank issued. Collectives are recorded by wrapping the ``torch.distributed``
functions inside each worker (:class:`_Recorder`), so any call the sharded forward makes is seen. A rank's
slice of the decoder (its weights, blocks and pipeline stage) is :mod:`lmcost.profiling.sharded_decoder`.

The scheme (the one :mod:`lmcost.operators.parallel` models):

- TP (Megatron): embedding vocab-parallel (V/tp rows, masked lookup), all_reduce [n, d]; q/k/v
  column-parallel by heads (h/tp query heads; h_kv/tp KV heads, or the one KV head a rank's query
  heads share when tp > h_kv); o_proj row-parallel, its bias added once after the all_reduce [n, d];
  dense FFN gate/up column-parallel (d_ff/tp), down row-parallel, all_reduce [n, d]; a parallel block
  sums both partial outputs and all-reduces once. MLA: q_b (or q) and W_UK/W_UV sharded by head,
  q_a and kv_a (the latent and its cache) replicated. Norms and residuals replicated. lm_head
  vocab-parallel, logits all-gathered (payload n*V*4). MoE, ep = 1: router replicated, every expert's
  d_e and the shared experts' width sharded over tp, routed + shared partial sums all-reduced once.
- EP inside TP (ep divides tp, dp = 1): expert group r // (tp/ep) of E/ep experts, each expert's d_e
  sharded over the tp/ep ranks of the group; the same single all_reduce per MoE layer.
- EP over attention-DP (tp = 1, ep = dp): each rank runs attention on its batch/dp sequences; a MoE
  layer all_to_alls the pair counts per (destination rank, local expert) [ep, E/ep] int64 (payload
  E*8: the receiver must know which of its E/ep experts each row is for), dispatches its n_r*k rows
  of d (all_to_all), runs its E/ep experts, and sends every received row back (all_to_all combine);
  shared experts run locally.
- PP: stage i holds numpy.array_split(range(L), pp)[i]; embedding on stage 0, final norm and lm_head
  on the last; a send of [n, d] from TP rank r of stage i to TP rank r of stage i + 1 per forward.
- DP (ep = 1): replicas on batch slices, no collective.

Ranks are placed as :mod:`lmcost.operators.parallel` places them: TP innermost, then DP, then PP
(rank = stage*tp*dp + replica*tp + tp_rank). Payloads follow nccl-tests' "size": all_reduce the
buffer, all_gather the whole output, reduce_scatter the whole input, all_to_all what the rank sends
(its own slice included), send_recv the bytes sent (recorded at the sender only), broadcast the buffer.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from lmcost.model.config import ArchConfig
from lmcost.basics.errors import LmcostError
from lmcost.profiling.decoder import build_decoder
from lmcost.profiling.sharded_decoder import _Layout, _Stage

#: Largest max-abs logit difference from the unsharded fp32 decoder counted as agreement, relative to
#: the largest |logit| when that exceeds 1 (a tied embedding gives logits of order sqrt(d)).
LOGITS_TOL = 1e-4
_NBYTES = lambda t: t.numel() * t.element_size()  # noqa: E731


# ---------------------------------------------------------------------------------------------------
# Layout (a rank's place in it: sharded_decoder._Layout)


def _bad(what: str, fix: str):
    raise LmcostError("layout", what, fix)


def check_layout(cfg: ArchConfig, layout: dict, batch: int) -> _Layout:
    """Validate ``layout`` (keys tp, pp, ep, dp; default 1) for ``cfg`` and ``batch`` sequences.

    Raises: LmcostError (field ``layout``) for an unknown key, a degree below 1, or a split the model
    cannot take (heads, KV heads, widths or vocabulary not divisible by tp; experts by ep; batch by
    dp; more stages than layers; an unsupported combination).
    """
    unknown = set(layout) - {"tp", "pp", "ep", "dp"}
    if unknown:
        _bad(f"unknown key(s) {sorted(unknown)}", "use tp, pp, ep, dp")
    for k, v in layout.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            _bad(f"{k}={v!r} is not a whole number >= 1", f"give {k} as a positive int")
    L = _Layout(**layout)
    a, m, tp = cfg.attention, cfg.moe, L.tp
    if not cfg.embeddings:
        _bad("a bare layer stack (embeddings: false) is not run sharded", "use a model with embeddings")
    if cfg.recurrent is not None:
        _bad("a hybrid stack (recurrent section) is not run sharded", "profile it on one device")
    if m is not None and (m.zero_experts or m.shortcut or m.post_norm):
        _bad("zero-computation experts, a shortcut MoE or a post-MoE norm are not run sharded", "profile it on one device")
    if a.moa_experts or a.v_head_dim or a.local_kv_heads or a.dynamic_mask or cfg.residual_scale \
            or (m is not None and m.output_bias):
        _bad("a mixture of attention heads, value heads of their own width, local KV heads, a dynamic mask, residual "
             "scales or a MoE output bias are not run sharded", "profile it on one device")
    if a.n_heads % tp:
        _bad(f"tp={tp} does not divide the {a.n_heads} query heads", f"use a tp that divides {a.n_heads}")
    if a.mla is None and cfg.h_kv % tp and tp % cfg.h_kv:
        _bad(f"tp={tp} neither divides the {cfg.h_kv} KV heads nor is a multiple of them",
             f"use a tp that divides {cfg.h_kv} or is a multiple of it")
    if tp > 1 and a.qk_norm == "full":
        _bad("qk_norm: full normalises over all heads, which TP splits", "use tp=1 for this model")
    if any(f == "dense" for _, f in cfg.layer_kinds()) and cfg.ffn.d_ff % tp:
        _bad(f"tp={tp} does not divide d_ff={cfg.ffn.d_ff}", "use a tp that divides the FFN width")
    if cfg.vocab_size % tp:
        _bad(f"tp={tp} does not divide the vocabulary {cfg.vocab_size}", "use a tp that divides it")
    if L.pp > cfg.n_layers:
        _bad(f"pp={L.pp} exceeds the {cfg.n_layers} layers", f"use pp <= {cfg.n_layers}")
    if batch % L.dp:
        _bad(f"batch {batch} does not split over dp={L.dp}", f"use a batch that is a multiple of {L.dp}")
    if L.ep > 1:
        if m is None:
            _bad(f"ep={L.ep} but {cfg.name} has no experts", "use ep=1")
        if m.n_experts % L.ep:
            _bad(f"ep={L.ep} does not divide the {m.n_experts} experts", "use an ep that divides them")
        if tp > 1 and tp % L.ep:
            _bad(f"ep={L.ep} with tp={tp} is not supported",
                 "use ep dividing tp (EP inside each TP group, any dp), or tp=1 and ep=dp (EP over attention-DP)")
        if tp == 1 and L.ep != L.dp:
            _bad(f"ep={L.ep} with tp=1 needs ep=dp, got dp={L.dp}", f"use dp={L.ep}")
    if m is not None:
        etp = 1 if L.ep_over_dp else tp // L.ep
        if m.d_ff_expert % etp:
            _bad(f"the expert width {m.d_ff_expert} does not split over tp/ep={etp}", "use a tp that divides it")
        if m.d_sh % (1 if L.ep_over_dp else tp):
            _bad(f"the shared-expert width {m.d_sh} does not split over tp={tp}", "use a tp that divides it")
    return L


# ---------------------------------------------------------------------------------------------------
# Recording collectives


class _Recorder:
    """Wraps the collective functions of ``torch.distributed`` in this process and appends one record
    per call while ``phase`` is set. ``groups`` maps a process group to its role (tp, ep, pp)."""

    #: Wrapped torch.distributed function -> (kind recorded, payload in bytes of its (args, group)).
    PAYLOAD = {
        "all_reduce": ("all_reduce", lambda a, g: _NBYTES(a[0])),
        "all_gather": ("all_gather", lambda a, g: _NBYTES(a[1]) * dist.get_world_size(g)),
        "all_gather_into_tensor": ("all_gather", lambda a, g: _NBYTES(a[0])),
        "reduce_scatter_tensor": ("reduce_scatter", lambda a, g: _NBYTES(a[1])),
        "all_to_all_single": ("all_to_all", lambda a, g: _NBYTES(a[1])),
        "broadcast": ("broadcast", lambda a, g: _NBYTES(a[0])),
        "send": ("send_recv", lambda a, g: _NBYTES(a[0])),
    }

    def __init__(self, rank: int, groups: dict):
        self.rank, self.groups = rank, groups
        self.records: list[dict] = []
        self.phase, self.step = None, 0
        self._saved = {}

    def __enter__(self):
        for name, (kind, payload) in self.PAYLOAD.items():
            fn = getattr(dist, name)
            self._saved[name] = fn
            setattr(dist, name, self._wrap(fn, kind, payload))
        return self

    def __exit__(self, *exc):
        for name, fn in self._saved.items():
            setattr(dist, name, fn)

    def _wrap(self, fn, kind, payload):
        def call(*args, group=None, **kwargs):
            if self.phase is not None:
                role = self.groups.get(group, "world")
                # A send is a point-to-point pair: two ranks, whatever the group it is addressed in.
                size = 2 if kind == "send_recv" else dist.get_world_size(group)
                self.records.append(dict(rank=self.rank, phase=self.phase, step=self.step, kind=kind, group=role,
                                         group_size=size, payload_bytes=int(payload(args, group))))
            return fn(*args, group=group, **kwargs)
        return call


# ---------------------------------------------------------------------------------------------------
# Processes


def _groups(L: _Layout, rank: int, timeout) -> dict:
    """Every rank creates every group, in the same order; returns this rank's {role: group} and
    {group: role}."""
    mine, roles = {"tp": None, "pp": None, "ep": None}, {}
    specs = []
    for stage in range(L.pp):
        for replica in range(L.dp):
            specs.append(("tp", [L.rank(stage, replica, r) for r in range(L.tp)]))
    for replica in range(L.dp):
        for r in range(L.tp):
            specs.append(("pp", [L.rank(stage, replica, r) for stage in range(L.pp)]))
    if L.ep_over_dp:
        for stage in range(L.pp):
            specs.append(("ep", [L.rank(stage, replica, 0) for replica in range(L.dp)]))
    for role, ranks in specs:
        if len(ranks) == 1:
            continue
        g = dist.new_group(ranks, timeout=timeout)
        if rank in ranks:
            mine[role] = g
            roles[g] = role
    return mine, roles


def _worker(rank: int, cfg_data: dict, layout: dict, batch: int, prompt: int, gen: int, seed: int,
            ids, port: int, timeout_s: float, out_dir: str) -> None:
    torch.set_num_threads(1)
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # localhost only, whatever the host name resolves to
    L = _Layout(**layout)
    timeout = timedelta(seconds=timeout_s)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=L.world,
                            timeout=timeout)
    try:
        cfg = ArchConfig.model_validate(cfg_data)
        full = build_decoder(cfg, max_batch=1, max_context=prompt + gen, seed=seed)
        mine, roles = _groups(L, rank, timeout)
        _, replica, r = L.coords(rank)
        b = batch // L.dp
        ids = ids[replica * b:(replica + 1) * b]
        model = _Stage(full, L, rank, b, mine)
        logits = []
        with _Recorder(rank, roles) as rec, torch.inference_mode():
            for step in range(gen + 1):
                rec.phase, rec.step = ("prefill", 0) if step == 0 else ("decode", step)
                p = 0 if step == 0 else prompt + step - 1
                out = model.forward(ids[:, :prompt] if step == 0 else ids[:, p:p + 1], p)
                if out is not None:
                    logits.append(out)
            rec.phase = None
        torch.save(dict(records=rec.records, logits=logits if (model.last and r == 0) else None,
                        replica=replica), Path(out_dir) / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(world: int, args: tuple, timeout_s: float, target=None) -> None:
    """Spawn ``world`` processes of ``target(rank, *args)`` (default :func:`_worker`); wait at most
    ``timeout_s`` seconds; terminate (then kill) every one still alive on failure or timeout.
    Raises: TimeoutError, or torch's ProcessRaisedException/ProcessExitedException for a failed worker."""
    import multiprocessing

    import torch.multiprocessing as mp

    # forkserver: a fresh interpreter (no threads, no parent state) imports this module once, and every
    # worker of every run is forked from it; spawn re-imports torch in each worker (~2 s apiece).
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    if method == "forkserver":
        multiprocessing.get_context(method).set_forkserver_preload([__name__])
    ctx = mp.start_processes(target or _worker, args=args, nprocs=world, join=False, start_method=method)
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=0.2):
            if time.monotonic() > deadline:
                raise TimeoutError(f"sharded run of {world} processes did not finish in {timeout_s:g} s")
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.terminate()
        for proc in ctx.processes:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()


def run_sharded(cfg: ArchConfig, layout: dict, *, batch: int, prompt: int, gen: int, seed: int = 0,
                timeout_s: float = 60) -> dict:
    """Run ``cfg`` (fp32, CPU, seeded weights) sharded over tp*pp*dp gloo processes: a prefill of
    ``prompt`` tokens and ``gen`` decode steps of ``batch`` sequences (random token ids, seeded, the
    same for both runs), and the same on the unsharded decoder.

    Returns: dict(max_abs_diff (largest |logit difference| over prefill and every decode step),
    logits_ok (max_abs_diff < LOGITS_TOL x max(1, largest |logit|)), collectives (one record per
    collective call per rank: dict(rank, phase 'prefill'|'decode', step 0|1..gen, kind, group
    'tp'|'ep'|'pp', group_size (2 for a send_recv), payload_bytes), by rank then issue order), world).
    A script calling it needs the ``if __name__ == "__main__":`` guard: workers are spawned.
    Raises: LmcostError (field ``layout``) for a layout the model cannot take (:func:`check_layout`);
    TimeoutError if the processes do not finish within ``timeout_s`` seconds (they are terminated).
    """
    L = check_layout(cfg, dict(layout), batch)
    if prompt < 1 or gen < 0:
        raise LmcostError("prompt", f"prompt={prompt}, gen={gen}", "use prompt >= 1 and gen >= 0")
    gen_ids = torch.Generator().manual_seed(seed)
    ids = torch.randint(cfg.vocab_size, (batch, prompt + gen), generator=gen_ids)
    ref = build_decoder(cfg, max_batch=batch, max_context=prompt + gen, seed=seed)
    with torch.inference_mode():
        expected = [ref(ids[:, :prompt], 0)] + [ref(ids[:, p:p + 1], p) for p in range(prompt, prompt + gen)]
    with tempfile.TemporaryDirectory(prefix="lmcost-dist-") as out:
        args = (cfg.model_dump(), dict(layout), batch, prompt, gen, seed, ids, _free_port(), float(timeout_s), out)
        _run(L.world, args, timeout_s)
        results = [torch.load(Path(out) / f"rank{i}.pt") for i in range(L.world)]
    parts = sorted((res["replica"], res["logits"]) for res in results if res["logits"] is not None)
    got = [torch.cat([lg[i] for _, lg in parts], 0) for i in range(gen + 1)]
    diff = max(float((g - e).abs().max()) for g, e in zip(got, expected))
    scale = max(1.0, max(float(e.abs().max()) for e in expected))
    records = [rec for res in results for rec in res["records"]]
    return dict(max_abs_diff=diff, logits_ok=diff < LOGITS_TOL * scale, collectives=records, world=L.world)


def summarize(records: list[dict]) -> list[dict]:
    """Per (phase, kind, group): dict(phase, kind, group, count (calls over all ranks), payload_bytes
    (their total), ranks (distinct ranks issuing them)), in first-seen order."""
    acc: dict = defaultdict(lambda: [0, 0, set()])
    for rec in records:
        a = acc[(rec["phase"], rec["kind"], rec["group"])]
        a[0] += 1
        a[1] += rec["payload_bytes"]
        a[2].add(rec["rank"])
    return [dict(phase=p, kind=k, group=g, count=c, payload_bytes=nb, ranks=len(rs))
            for (p, k, g), (c, nb, rs) in acc.items()]


def compare(cfg: ArchConfig, layout, *, batch: int, prompt: int, gen: int, seed: int = 0,
            timeout_s: float = 120) -> dict:
    """A sharded run (:func:`run_sharded`) against lmcost's communication operators
    (:func:`lmcost.operators.parallel.expected_collectives`, fp32 as the run): per (phase, kind, group), the calls
    and payload bytes summed over ranks and decode steps, measured and predicted (an all-to-all combine's
    per-rank payload follows the routing; its sum over the group is what the model states exactly).

    Returns: dict(rows=[dict(phase, kind, group, calls_run, calls_lmcost, bytes_run, bytes_lmcost, match)],
    match (every row), max_abs_diff, logits_ok, world).
    Raises: as :func:`run_sharded`, and LmcostError if the analytic model refuses the layout.
    """
    from lmcost.basics.dtypes import Precision
    from lmcost.operators.parallel import expected_collectives

    layout.check(cfg, batch)
    res = run_sharded(cfg, dict(tp=layout.tp, pp=layout.pp, ep=layout.ep, dp=layout.dp), batch=batch, prompt=prompt,
                      gen=gen, seed=seed, timeout_s=timeout_s)
    fp32 = Precision("fp32", "fp32", "fp32")
    want = expected_collectives(cfg, layout, phase="prefill", batch=batch, tokens=prompt, precision=fp32)
    for i in range(1, gen + 1):
        want += expected_collectives(cfg, layout, phase="decode", batch=batch, tokens=prompt + i, precision=fp32)
    acc: dict = {}
    for side, records in (("run", res["collectives"]), ("lmcost", want)):
        for rec in records:
            row = acc.setdefault((rec["phase"], rec["kind"], rec["group"]),
                                 dict(calls_run=0, calls_lmcost=0, bytes_run=0, bytes_lmcost=0))
            row[f"calls_{side}"] += 1
            row[f"bytes_{side}"] += rec["payload_bytes"]
    rows = [dict(phase=p, kind=k, group=g, **v, match=v["calls_run"] == v["calls_lmcost"]
                 and v["bytes_run"] == v["bytes_lmcost"]) for (p, k, g), v in acc.items()]
    return dict(rows=rows, match=all(r["match"] for r in rows), max_abs_diff=res["max_abs_diff"],
                logits_ok=res["logits_ok"], world=res["world"])
