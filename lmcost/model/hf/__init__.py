"""Reading a Hugging Face config.json: the key reader, the registry of families (one file per family group), and the verdict on every model type."""
