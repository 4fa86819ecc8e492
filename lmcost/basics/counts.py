"""Counts as typed: ``4096``, or with a binary suffix as token counts and context lengths are quoted (``128k`` =
131,072). The one parser of every count option and list (:mod:`lmcost.cli.options`) and of the token figures in
a serving workload's length specs (:func:`lmcost.apps.serve_workload.lengths`), kept here, below both.
"""

#: Token-count suffixes, binary as context lengths are quoted (128k = 131,072; 1M = 1,048,576). Lowercase
#: m and g are refused: in SI m is milli, and no count is a thousandth of a token.
COUNT_SUFFIXES = {"k": 2**10, "K": 2**10, "M": 2**20, "G": 2**30}


def _whole(digits: str, text: str) -> int:
    """``digits`` (ASCII, an optional leading minus) as an int. Raises: ValueError naming ``text``
    otherwise (``int`` alone would take full-width and other Unicode digits, ``８`` as 8, and
    underscores, ``1_000``)."""
    if not (digits.isascii() and digits.removeprefix("-").isdigit()):
        raise ValueError(f"{text!r} is not a whole number")
    return int(digits)


def parse_count(text: str) -> int:
    """A count as typed: ``4096``, or with a binary suffix as token counts are quoted: ``128k`` or ``128K``
    (x 1024), ``1M`` (x 1024^2), ``1G`` (x 1024^3); the one suffix rule of every count option and list.
    Digits are ASCII; no underscores, decimal points or exponents (``1e3`` is a float). The range is
    checked where the count is used.

    Raises: ValueError saying why if it is not a whole number, or its suffix is ``m``/``g`` (milli and
    gram in SI: write M or G)."""
    t = str(text).strip()
    unit = t[-1:] if t[-1:].isalpha() else ""
    if unit in ("m", "g"):
        raise ValueError(f"{text!r}: a lowercase {unit} is not a count suffix ({'m is milli' if unit == 'm' else 'g is gram'}); "
                         f"write {t[:-1]}{unit.upper()} for x {COUNT_SUFFIXES[unit.upper()]:,}")
    return _whole(t[:-1] if unit in COUNT_SUFFIXES else t, text) * COUNT_SUFFIXES.get(unit, 1)
