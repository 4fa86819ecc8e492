"""``lmcost gpus``, ``models`` and ``clusters``: list and show what ships."""

from typing import Annotated

import typer

from lmcost.output import tables
from lmcost.cli.app import emit, machine_output, out, user_errors
from lmcost.cli.options import ModelArg


@user_errors
@machine_output
def clusters_list():
    """Shipped clusters: GPU, GPUs per node, node fabric and network."""
    from lmcost.apps.catalog import cluster_rows

    rows = cluster_rows()
    if emit(rows):
        return
    out.print(tables.clusters_table(rows))


@user_errors
@machine_output
def clusters_show(name: Annotated[str, typer.Argument(help="Cluster name, alias or YAML path.")]):
    """All figures of one cluster, fitted collective figures included, with their sources."""
    from lmcost.hardware.cluster import load_cluster

    c = load_cluster(name)
    if emit(c.model_dump()):
        return
    out.print(tables.cluster_table(c))


@user_errors
@machine_output
def gpus_list():
    """Shipped GPUs with their dense peaks, bandwidth, memory and bf16 ridge point."""
    from lmcost.apps.catalog import gpu_rows

    rows = gpu_rows()
    if emit(rows):
        return
    out.print(tables.gpus_table(rows))


@user_errors
@machine_output
def gpus_show(name: Annotated[str, typer.Argument(help="GPU name, alias or YAML path.")]):
    """All figures of one GPU, with their sources."""
    from lmcost.hardware.gpu import load_gpu

    from lmcost.apps.catalog import fitted_label

    g = load_gpu(name)
    if emit(g.model_dump()):
        return
    out.print(tables.gpu_table(g, fitted_label(g)))


@user_errors
@machine_output
def models_list():
    """Shipped model architectures with their parameter counts."""
    from lmcost.apps.catalog import model_rows

    rows = model_rows()
    if emit(rows):
        return
    out.print(tables.models_table(rows))


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
