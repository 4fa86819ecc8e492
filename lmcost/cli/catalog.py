"""``lmcost gpus``, ``models`` and ``clusters``: list and show what ships."""

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from lmcost.output import render
from lmcost.cli.app import emit, machine_output, out, user_errors
from lmcost.cli.options import ModelArg


@user_errors
@machine_output
def clusters_list():
    """Shipped clusters: GPU, GPUs per node, node fabric and network."""
    from lmcost.hardware.cluster import list_clusters

    rows = [dict(name=c.name, aliases=",".join(c.aliases), gpu=c.gpu, gpus_per_node=c.gpus_per_node,
                 intra=c.intra.name, intra_bytes_per_s=c.intra.bandwidth, nvls=c.intra.nvls,
                 inter=c.inter.name if c.inter else "", inter_node_bytes_per_s=c.inter.node_bandwidth if c.inter else 0.0)
            for c in list_clusters()]
    if emit(rows):
        return
    t = Table(title="Clusters (bandwidth per direction)", title_justify="left")
    for col in ("name", "gpu", "GPUs/node", "node fabric (per GPU)", "NVLS", "network (per node)"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], r["gpu"], str(r["gpus_per_node"]), f"{escape(r['intra'])} {render.si(r['intra_bytes_per_s'], 'B/s')}",
                  "yes" if r["nvls"] else "no",
                  f"{escape(r['inter'])} {render.si(r['inter_node_bytes_per_s'], 'B/s')}" if r["inter"] else "none")
    out.print(t)


@user_errors
@machine_output
def clusters_show(name: Annotated[str, typer.Argument(help="Cluster name, alias or YAML path.")]):
    """All figures of one cluster, fitted collective figures included, with their sources."""
    from lmcost.hardware.cluster import load_cluster

    c = load_cluster(name)
    data = c.model_dump()
    if emit(data):
        return
    rows = [(k, str(v)) for k, v in data.items() if k not in ("sources", "intra", "inter", "collectives") and v not in (None, "", [])]
    rows += [(f"intra.{k}", str(v)) for k, v in data["intra"].items()]
    rows += [(f"inter.{k}", str(v)) for k, v in (data["inter"] or {}).items()]
    for part in ("intra", "inter", "band", "fit"):
        rows += [(f"collectives.{part}.{k}", str(v)) for k, v in data["collectives"][part].items()]
    rows += [(f"source {i + 1}", s) for i, s in enumerate(c.sources)]
    out.print(render.kv_table(c.name, [(escape(a), escape(b)) for a, b in rows], justify="left"))


@user_errors
@machine_output
def gpus_list():
    """Shipped GPUs with their dense peaks, bandwidth, memory and bf16 ridge point."""
    from lmcost.hardware.gpu import gpu_names, load_gpu

    rows = []
    for name in gpu_names():
        g = load_gpu(name)
        dt = "bf16" if "bf16" in g.peak_tflops else "fp16"
        rows.append(dict(name=g.name, aliases=",".join(g.aliases), description=g.description,
                         peak_flops_per_s=g.peak_flops(dt), peak_dtype=dt, bandwidth_bytes_per_s=g.bandwidth,
                         memory_bytes=g.memory_bytes, ridge_flops_per_byte=g.ridge_point(dt)))
    if emit(rows):
        return
    t = Table(title="GPUs (dense peaks)", title_justify="left")
    for c in ("name", "aliases", "description", "peak (dtype)", "bandwidth", "memory", "ridge FLOPs/byte"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["name"], r["aliases"], r["description"],
                  f"{render.si(r['peak_flops_per_s'], 'FLOP/s')} ({r['peak_dtype']})",
                  render.si(r["bandwidth_bytes_per_s"], "B/s"), render.si(r["memory_bytes"], "B"),
                  f"{r['ridge_flops_per_byte']:.0f}")
    out.print(t)


@user_errors
@machine_output
def gpus_show(name: Annotated[str, typer.Argument(help="GPU name, alias or YAML path.")]):
    """All figures of one GPU, with their sources."""
    from lmcost.hardware.gpu import load_gpu

    g = load_gpu(name)
    data = g.model_dump()
    if emit(data):
        return
    rows = [(k, ", ".join(v) if isinstance(v, list) else str(v)) for k, v in data.items()
            if k not in ("sources", "peak_tflops", "efficiency") and v not in (None, "", [])]
    rows += [(f"peak {k} (dense)", render.si(v * 1e12, "FLOP/s")) for k, v in g.peak_tflops.items()]
    rows += [(f"source {i + 1}", s) for i, s in enumerate(g.sources)]
    rows += render.efficiency_rows(g.efficiency)
    out.print(render.kv_table(g.name, rows, justify="left"))


@user_errors
@machine_output
def models_list():
    """Shipped model architectures with their parameter counts."""
    from lmcost.model.loading import load_config
    from lmcost.cost.params import param_counts
    from lmcost.basics.shipped import names

    rows = []
    for name in names("models"):
        cfg = load_config(name)
        p = param_counts(cfg)
        rows.append(dict(name=name, attention=cfg.attention_kind, layers=cfg.n_layers, d_model=cfg.d_model,
                         params=p["total"], active_params=p["active_per_token"], moe=cfg.moe is not None))
    if emit(rows):
        return
    t = Table(title="Models", title_justify="left")
    for c in ("name", "attention", "layers", "d_model", "params", "active per token"):
        t.add_column(c, justify="left" if c in ("name", "attention") else "right")
    for r in rows:
        t.add_row(r["name"], r["attention"], str(r["layers"]), str(r["d_model"]), render.count(r["params"]),
                  render.count(r["active_params"]))
    out.print(t)


@user_errors
@machine_output
def models_show(name: ModelArg):
    """One architecture as lmcost reads it (after HF mapping), with derived dims."""
    import yaml

    from lmcost.model.loading import load_config

    cfg = load_config(name)
    data = cfg.model_dump(exclude_defaults=True)
    if emit(data):
        return
    out.print(yaml.safe_dump(data, sort_keys=False).rstrip(), highlight=False, markup=False)
    heads = (f"latent d_c {cfg.attention.mla.kv_lora_rank} + RoPE key d_r {cfg.d_rot}" if cfg.attention.mla
             else f"h_kv {cfg.h_kv}, d_h {cfg.d_h}, rotary width {cfg.d_rot}")
    out.print(f"# derived: attention {cfg.attention_kind}, {heads}; unset fields take their defaults "
              "(see lmcost/data/models/llama.yaml)", highlight=False, markup=False)
