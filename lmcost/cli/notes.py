"""The notes several commands print on stderr about a run they were given (stdout stays data)."""

from lmcost.cli.app import err, say


def warn_uncalibrated(hw, model: str) -> None:
    """Say so when --model calibrated meets a GPU without an efficiency block (:func:`lmcost.apps.setup.say_uncalibrated`)."""
    from lmcost.apps.setup import say_uncalibrated

    say_uncalibrated(hw, model, say)


def warn_context(cfg, tokens: int) -> None:
    """Say so when a context runs past what a RoPE model was trained for (:func:`lmcost.operators.workload.past_trained_context`)."""
    from lmcost.operators.workload import past_trained_context

    note = past_trained_context(cfg, tokens)
    if note:
        err.print(note, markup=False, highlight=False, soft_wrap=True)


def note_layers(cfg, layers: int | None) -> None:
    """Say so when --layers asks for more blocks than the model has (all of them are kept)."""
    if layers and layers > cfg.n_layers:
        err.print(f"note: --layers {layers} exceeds {cfg.name}'s {cfg.n_layers} layers: all {cfg.n_layers} are used",
                  markup=False, highlight=False, soft_wrap=True)
