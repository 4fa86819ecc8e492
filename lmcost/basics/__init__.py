"""Basics every layer stands on: the error users see, reading and writing files, finding shipped data, dtypes, the field's notation, and tracing a formula once to run it at any workload."""
