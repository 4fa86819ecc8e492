"""The model description: the architecture schema, loading it from lmcost YAML or a Hugging Face config.json, quantization recipes, attention variants and vision towers."""
