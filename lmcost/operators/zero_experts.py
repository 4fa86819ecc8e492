"""Zero-computation experts (LongCat-Flash, arXiv 2509.01322, section 2.1; transformers ``LongcatFlashExperts``):
the router scores E FFN experts and Z identity experts and each token takes its top k of the E+Z; an identity
pick returns the token times its routing weight (inside ``moe.combine``), no matmul. The two widths
:func:`lmcost.operators.ffn.moe_ops` reads through here, so a model without them (Z = 0) keeps its formulas.
"""

from __future__ import annotations


def ffn_experts_per_token(cfg, x):
    """FFN experts one token runs: k, or with Z zero-computation experts k*E/(E+Z) (the expectation under
    uniform routing over the E+Z, LongCat-Flash section 2.1): the token-expert pairs of the routed FFNs
    are this times b*s."""
    z = cfg.moe.zero_experts
    return x.k if not z else x.k * x.E / (x.E + z)


def routed_experts(cfg, x):
    """Experts the router scores (its output width): E, or E + Z with zero-computation experts."""
    z = cfg.moe.zero_experts
    return x.E if not z else x.E + z
