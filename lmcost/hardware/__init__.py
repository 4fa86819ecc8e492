"""Hardware as data: GPUs (peaks, bandwidth, memory, fitted efficiency block) and clusters (nodes, fabric, network), read from the YAML shipped in lmcost/data or given by path."""
