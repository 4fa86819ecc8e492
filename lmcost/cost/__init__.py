"""The cost of a graph: compilation into phases and totals, roofline and calibrated times, collective times, parameters, KV cache, memory, optimizer states, activations, and symbolic formulas."""
