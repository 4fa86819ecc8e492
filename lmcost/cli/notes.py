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

