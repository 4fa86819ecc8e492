"""The typer apps, the shared ``--json``/``--csv`` output, the one-line error handler and the entry point."""

import contextlib
import errno
import functools
import inspect
import sys
import threading
import time
import warnings
from typing import Annotated

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

try:  # typer >= 0.26 vendors click; older releases use click itself
    from typer import _click as click_api
except ImportError:  # pragma: no cover
    import click as click_api

import lmcost.cli.flags as flags
from lmcost.output import render
from lmcost.basics.errors import LmcostError, LmcostNote


class OptionRefused(click_api.exceptions.UsageError):
    """An option's value refused before it is converted: ``what`` it is, and the ``fix``."""

    def __init__(self, name: str, what: str, fix: str, ctx):
        super().__init__(what, ctx=ctx)
        self.option_name, self.fix = name, fix


def _is_path(param) -> bool:
    """True for an option typed ``Path`` (typer >= 0.2x keeps the annotation; older ones a click.Path)."""
    from pathlib import Path

    desc = getattr(param, "type_descriptor", None)
    if desc is not None:
        return isinstance(desc.annotation, type) and issubclass(desc.annotation, Path)
    return isinstance(getattr(param, "type", None), click_api.Path)


class OnceCommand(TyperCommand):
    """A command that refuses a single-valued option (or a flag pair such as ``--causal/--no-causal``)
    given more than once: click keeps the last value silently, so ``--gpu h100 --gpu a100`` would cost
    an A100 without a word. Options declared repeatable (``multiple``, as plan's ``--gpu``) and eager
    ones (``--help``) are left alone. An empty path (``-o ''``) is refused naming its option: converted,
    it would be ``.``, the current folder. Every command is registered with this class
    (lmcost/cli/__init__.py)."""

    def parse_args(self, ctx, args):
        if args and not ctx.resilient_parsing:
            try:  # a dry parse for the order options came in; a malformed line is left to click's own parse
                given, _, order = self.make_parser(ctx).parse_args(args=list(args))
            except click_api.exceptions.UsageError:
                given, order = {}, []
            for p in self.params:
                if p.param_type_name == "option" and _is_path(p) and given.get(p.name) == "":
                    raise OptionRefused("/".join(p.opts), "empty", "give a path", ctx)
            seen: dict = {}
            for p in order:
                if p.param_type_name == "option" and not p.multiple and not p.count and not p.is_eager:
                    seen[p] = seen.get(p, 0) + 1
            for p, times in seen.items():
                if times > 1:
                    raise OptionRefused("/".join(p.opts + p.secondary_opts), f"given {times} times; it takes one value",
                                        "give it once", ctx)
        return super().parse_args(ctx, args)


class HelpGroup(TyperGroup):
    """A command group that, run without a command (a bare ``lmcost``, ``lmcost gpus``), prints its help on
    stderr and exits 2, as click (>= 8.2) does: nothing ran, and stdout stays data. (typer's rich help
    writes to stdout; it is sent to stderr here.) ``--version`` with anything else is refused: as an eager
    option it would print and exit before the rest was read."""

    def parse_args(self, ctx, args):
        lead = args[:next((i for i, a in enumerate(args) if not a.startswith("-")), len(args))]
        if "--version" in lead and len(args) > 1 and not ctx.resilient_parsing:  # it would exit before the rest
            raise OptionRefused("--version", f"takes nothing else, given {' '.join(a for a in args if a != '--version')!r}",
                                "run `lmcost --version` alone", ctx)
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            import contextlib

            with contextlib.redirect_stdout(sys.stderr):  # NoArgsIsHelpError prints the help as it is made
                raise click_api.exceptions.NoArgsIsHelpError(ctx)
        return super().parse_args(ctx, args)


#: -h as well as --help, on every command.
HELP = {"help_option_names": ["-h", "--help"]}
app = typer.Typer(cls=HelpGroup, no_args_is_help=True, add_completion=False, context_settings=HELP,
                  help="Analytic cost model and roofline calculator for transformer language models.")
gpus_app = typer.Typer(cls=HelpGroup, no_args_is_help=True, context_settings=HELP, help="The shipped GPUs (lmcost/data/gpus/*.yaml).")
models_app = typer.Typer(cls=HelpGroup, no_args_is_help=True, context_settings=HELP, help="The shipped model architectures (lmcost/data/models/*.yaml).")
app.add_typer(gpus_app, name="gpus")
app.add_typer(models_app, name="models")
clusters_app = typer.Typer(cls=HelpGroup, no_args_is_help=True, context_settings=HELP, help="The shipped clusters: nodes and networks (lmcost/data/clusters/*.yaml).")
app.add_typer(clusters_app, name="clusters")
op_app = typer.Typer(cls=HelpGroup, no_args_is_help=True, context_settings=HELP,
                     help="The cost of one operator on one GPU: FLOPs, bytes, bound, roofline and calibrated time.")
app.add_typer(op_app, name="op")


def _version(value: bool):
    if value:
        from lmcost import __version__
        print(f"lmcost {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print lmcost's version and exit.")] = False):
    """Analytic cost model and roofline calculator for transformer language models."""


#: Notes a command says (:func:`say`) wait here until it prints its output or a status line, so that a
#: run refused after a note (a V100's fp16 said, then the batch refused) prints the error line alone.
_HELD: dict = {"notes": None}


def release_notes() -> None:
    """Print the notes held so far (in order) and say every later one at once."""
    held, _HELD["notes"] = _HELD["notes"], None
    for line in held or ():
        err.print(line, markup=False, highlight=False, soft_wrap=True)


class _Console(Console):
    """A console that prints the notes held (:func:`release_notes`) before anything of its own."""

    def print(self, *args, **kwargs):
        if _HELD["notes"] is not None:
            release_notes()
        super().print(*args, **kwargs)

    def status(self, *args, **kwargs):
        release_notes()
        return super().status(*args, **kwargs)

    def on_broken_pipe(self) -> None:
        """``lmcost ... | head``: the reader left, which is not an error of ours (exit 0, as :func:`main`
        does for a BrokenPipeError of its own); rich's default exits 1."""
        try:
            super().on_broken_pipe()
        except SystemExit:
            raise SystemExit(0) from None


# Piped output keeps whole rows (a terminal's own width applies otherwise).
out = _Console(soft_wrap=False, width=None if sys.stdout is not None and sys.stdout.isatty() else 200)
err = _Console(stderr=True)


def require_extra(module: str, extra: str, what: str) -> None:
    """One-line error if an optional dependency is missing (torch for profiling, plotly for figures)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise LmcostError(module, f"not installed; {what} needs it", f"pip install 'lmcost[{extra}]'")


def one_line(text: str) -> str:
    """``text`` with newlines and other control characters (from a path or a key in a file) escaped, so
    an error stays one line and cannot drive the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def error_line(text: str) -> None:
    """Print the error line ``text`` on stderr (:func:`one_line`). Never raises: a closed or full stderr
    (``2>/dev/full``) loses the line, not the exit status that follows it."""
    try:  # written as it is, not through rich: a console whose write failed keeps the line buffered and
        # prints it before the next one (another test's error, in-process)
        sys.stderr.write(one_line(text) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # ValueError: a closed stream; AttributeError: sys.stderr None
        pass


def user_errors(fn):
    """Render LmcostError as one line ``error: <field>: <what>; <fix>`` and exit 2. Other errors are bugs.

    The notes the command says are held until it prints (:data:`_HELD`): on an error they are dropped,
    and the error line is all it prints."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from pydantic import ValidationError

        from lmcost.basics.errors import from_validation_error

        _HELD["notes"] = []
        try:
            done = fn(*args, **kwargs)
        except LmcostError as e:
            _HELD["notes"] = None
            error_line(f"error: {flags.for_cli(e)}")
            raise typer.Exit(2)
        except ValidationError as e:  # a config the options derived (e.g. --window on a model) is invalid
            _HELD["notes"] = None
            error_line(f"error: {from_validation_error(e, 'options')}")
            raise typer.Exit(2)
        except BaseException:
            release_notes()  # an exit of its own (validate's mismatch), a broken pipe: what it said stands
            raise
        release_notes()
        return done

    return wrapper


#: The machine format the running command was asked for (set by :func:`machine_output`): json, csv or None.
_FORMAT: dict = {"mode": None}


def machine_output(fn):
    """Give a command one ``--<name>`` flag per machine format (:data:`lmcost.output.render.MACHINE_FORMATS`:
    ``--json``, ``--csv``; declared here once for every command that prints machine output); the command
    asks :func:`output_mode` and prints with :func:`emit`.

    Raises (inside the command, so user_errors renders it): LmcostError if more than one is given.
    """
    sig = inspect.signature(fn)
    extra = {f"as_{name}": inspect.Parameter(f"as_{name}", inspect.Parameter.KEYWORD_ONLY, default=False,
                                             annotation=Annotated[bool, typer.Option(f"--{name}", help=f.help)])
             for name, f in render.MACHINE_FORMATS.items()}

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        chosen = [name for name in render.MACHINE_FORMATS if kwargs.pop(f"as_{name}", False)]
        if len(chosen) > 1:
            raise LmcostError("/".join(f"--{name}" for name in chosen), "both given" if len(chosen) == 2 else
                              f"{len(chosen)} given", "pick one")
        _FORMAT["mode"] = chosen[0] if chosen else None
        return fn(*args, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=[*sig.parameters.values(), *extra.values()])
    wrapper.__annotations__ = {**fn.__annotations__, **{k: p.annotation for k, p in extra.items()}}
    return wrapper


def output_mode() -> str | None:
    """The machine format the running command was asked for (``json``, ``csv``), or None (rich tables)."""
    return _FORMAT["mode"]


def emit(data) -> bool:
    """Print ``data`` in the machine format the command was asked for, if any; True if printed."""
    mode = output_mode()
    if mode is not None:
        release_notes()
        sys.stdout.write(render.MACHINE_FORMATS[mode].write(data))
    return mode is not None


#: A run still busy after this many seconds says so on a stderr that is not a terminal, then again
#: every PROGRESS_EVERY_S (a terminal gets rich's live status line at once).
PROGRESS_AFTER_S, PROGRESS_EVERY_S = 2.0, 5.0


class Ticker:
    """A status line for a stderr that is not a terminal (a pipe, a log, CI): ``lmcost: <text> (<n> s)``
    written once the run has taken :data:`PROGRESS_AFTER_S`, then every :data:`PROGRESS_EVERY_S`, from a
    daemon thread, as whole lines (a log keeps each). ``update(text)`` changes what the next line says,
    as rich's ``Status.update`` does. Only stderr: ``--json`` and ``--csv`` on stdout stay clean."""

    #: The ticker of the run in progress (progress over steps updates it rather than starting another).
    current: "Ticker | None" = None

    def __init__(self, text: str):
        self.text = text
        self._stop = threading.Event()

    def update(self, text: str) -> None:
        self.text = text

    def _line(self) -> None:
        try:
            release_notes()
            self._stream.write(f"lmcost: {self.text} ({time.monotonic() - self._t0:.0f} s)\n")
            self._stream.flush()
        except (OSError, ValueError):  # stderr closed or gone: nothing more to say
            self._stop.set()

    def _run(self) -> None:
        if PROGRESS_AFTER_S == float("inf"):
            return
        wait = PROGRESS_AFTER_S if PROGRESS_AFTER_S > 0 else PROGRESS_EVERY_S  # (said at once: __enter__)
        while not self._stop.wait(wait):
            self._line()
            wait = PROGRESS_EVERY_S

    def __enter__(self) -> "Ticker":
        self._t0, self._stream, self._outer = time.monotonic(), sys.stderr, Ticker.current
        Ticker.current = self
        if PROGRESS_AFTER_S <= 0:
            self._line()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        Ticker.current = self._outer


def status_line(text: str, live: bool = True):
    """A status line on stderr while something slow runs: rich's live one on a terminal (none with
    ``live=False``, where the command draws progress bars of its own), else a :class:`Ticker`'s plain
    lines once it has run :data:`PROGRESS_AFTER_S`. Returns a context manager whose value has
    ``update(text)``, or is None where nothing is drawn."""
    if err.is_terminal:
        return err.status(text) if live else contextlib.nullcontext(None)
    return Ticker(text)


def progress_over(it, text: str):
    """``it``, with progress on stderr: rich's transient bar on a terminal; elsewhere each item's
    ``<text> i/n`` said by the :class:`Ticker` running (one started here if none is)."""
    if err.is_terminal:
        from rich.progress import track

        return track(it, description=text, console=err, transient=True)
    return _ticked(it, text)


def _ticked(it, text: str):
    """:func:`progress_over` off a terminal."""
    items = list(it)
    with Ticker(text) if Ticker.current is None else contextlib.nullcontext(Ticker.current) as ticker:
        for i, item in enumerate(items):
            ticker.update(f"{text} {i + 1}/{len(items)}")
            yield item


def _usage_error_line(e) -> str:
    """One line for a click usage error (bad option value, unknown option, missing argument)."""
    param = getattr(e, "param", None)
    if param is not None:
        field = "/".join(param.opts) if getattr(param, "opts", None) and param.param_type_name == "option" else param.name.upper()
    else:
        field = getattr(e, "option_name", None) or "command line"
    what = e.format_message().replace("\n", " ").replace("Value error, ", "").rstrip(".")
    if param is not None and what.startswith("Invalid value for"):
        what = what.split(": ", 1)[-1]
    cmd = e.ctx.command_path if e.ctx is not None else "lmcost"
    return f"error: {field}: {what}; {getattr(e, 'fix', None) or f'see `{cmd} --help`'}"


_show_warning = warnings.showwarning


def _show_note(message, category, filename, lineno, file=None, line=None):
    """The library's notes (:class:`lmcost.basics.errors.LmcostNote`) as one stderr line through :func:`say`;
    other warnings as Python shows them."""
    if issubclass(category, LmcostNote):
        say(str(message))
    else:
        _show_warning(message, category, filename, lineno, file, line)


def main():
    """Console-script entry point: usage errors as one line, exit 2, like LmcostError. A bare ``lmcost``
    (or ``lmcost gpus``) prints its help on stderr and exits 2, as click (>= 8.2) does for a group run
    without a command: no command ran, and stdout stays data."""
    UsageError = click_api.exceptions.UsageError

    if sys.stdout is None:  # started with stdout closed (`>&-`): Python sets it to None
        if sys.stderr is not None:
            sys.stderr.write("error: stdout: closed; run with stdout open (redirect it to a file or /dev/null)\n")
        sys.exit(2)
    warnings.showwarning = _show_note
    try:
        code = app(standalone_mode=False)
    except UsageError as e:
        if type(e).__name__ != "NoArgsIsHelpError":  # whose help is on stderr already (HelpGroup)
            error_line(_usage_error_line(e))
        sys.exit(2)
    except typer.Abort:
        sys.exit(130)
    except BrokenPipeError:  # `lmcost ... | head`: the reader left; not an error of ours
        sys.stderr.close()
        sys.exit(0)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EIO):
            raise
        error_line(f"error: stdout: cannot write ({e.strerror}); free space or redirect elsewhere")
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


def say(line: str) -> None:
    """Print a library note on stderr, the fields it names in backticks as flags (:func:`flags.text_for_cli`);
    held while the command holds its notes (:func:`user_errors`)."""
    text = flags.text_for_cli(line)
    if _HELD["notes"] is not None:
        _HELD["notes"].append(text)
    else:
        err.print(text, markup=False, highlight=False, soft_wrap=True)
