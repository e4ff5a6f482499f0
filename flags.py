"""flags.py: a dataclass's fields as command-line flags, the one way train.py and eval.py read theirs.

Each field is a flag (--max-new-tokens for max_new_tokens); its trailing comment in the class's
source is the flag's --help, so a reader of the dataclass sees what --help shows; a field with no
default is a required flag. Its type picks the parsing (bool: --x/--no-x, tuple: repeat the
flag), `choices` names the allowed values of some. Flags parse to None when not given
(`given`), so the caller layers its defaults (train.py's presets, eval.py's Kevin protocol) and
then the flags given. Refusals are one line and exit 2, not argparse's usage block.

    parser = flags.parser("eval.py", "what it does")
    flags.add_fields(parser, Args, choices={"split": ("all", "train", "heldout")})
    args = Args(**{**DEFAULTS, **flags.given(parser.parse_args(argv))})

A module of its own: both scripts and the rollout's shared settings (rollout.Sampling) use it,
and it needs nothing of theirs.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import re

KINDS = {"bool": dict(action=argparse.BooleanOptionalAction), "int": dict(type=int, metavar="N"),
         "float": dict(type=float, metavar="X"), "float | None": dict(type=float, metavar="X"),
         "int | None": dict(type=int, metavar="N"), "str": dict(metavar="TEXT"),
         "str | None": dict(metavar="TEXT"), "tuple[str, ...]": dict(action="append", metavar="TEXT")}


def field_help(cls) -> dict[str, str]:
    """Each field's trailing comment in the source of cls and of the dataclasses it derives from."""
    comments = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            matches = (re.match(r"\s+(\w+): .*?\s# (.*)", line) for line in inspect.getsource(klass).splitlines())
            comments.update({m[1]: m[2] for m in matches if m})
    return comments


def shown(value) -> str:
    """A default as --help writes it."""
    return "none" if value is None or value == () else repr(value) if value == "" else str(value)


def parser(prog: str, description: str, raw: bool = False) -> argparse.ArgumentParser:
    """An ArgumentParser whose refusals are one line (`prog: message`, exit 2)."""
    ap = argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False,
                                 **(dict(formatter_class=argparse.RawDescriptionHelpFormatter) if raw else {}))
    ap.error = lambda message: ap.exit(2, f"{prog}: {message}\n")
    return ap


def add_fields(ap: argparse.ArgumentParser, cls, choices: dict | None = None, defaults: dict | None = None,
               note: str = "", also: dict | None = None) -> None:
    """One flag per field of cls. --help shows each default: `defaults` (the caller's, followed by `note`)
    or the field's own; `also` adds text after a field's default (train.py: the kevin preset's value)."""
    choices, defaults, also, comments = choices or {}, defaults or {}, also or {}, field_help(cls)
    for f in dataclasses.fields(cls):
        if f.name not in comments:
            raise TypeError(f"{cls.__name__}.{f.name} has no comment to be its --help")
        required = f.default is dataclasses.MISSING and f.name not in defaults
        default = (f"default: {shown(defaults[f.name])}{note}" if f.name in defaults else
                   "required" if required else f"default: {shown(f.default)}")
        ap.add_argument("--" + f.name.replace("_", "-"), default=None, required=required,
                        help=f"{comments[f.name]} ({default}{also.get(f.name, '')})".replace("%", "%%"),
                        **(dict(choices=choices[f.name]) if f.name in choices else KINDS[f.type]))


def given(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> dict:
    """The flags given on the command line (a flag not given parsed to None)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in vars(args).items() if v is not None and k not in skip}


def refuse_file_out(ap: argparse.ArgumentParser, out: str) -> None:
    """--out, or a folder above it, that is a file: refused before anything is written (makedirs would fail)."""
    blocked = next((p for p in [out, *_parents(out)] if os.path.isfile(p)), None)
    if blocked:
        ap.error(f"--out {out}: {blocked} is a file, not a folder")


def _parents(path: str) -> list[str]:
    out = []
    while os.path.dirname(path) not in ("", path):
        path = os.path.dirname(path)
        out.append(path)
    return out


def refuse_out_of_range(config, prog: str, at_least_one=(), positive=(), non_negative=()) -> None:
    """One line for the first field below its range: --name value: must be at least 1 / > 0 / >= 0."""
    for names, bad, words in ((at_least_one, lambda v: v < 1, "must be at least 1"),
                              (positive, lambda v: not v > 0, "must be > 0"),
                              (non_negative, lambda v: v < 0, "must be >= 0")):
        for name in names:
            if bad(getattr(config, name)):
                raise SystemExit(f"{prog}: --{name.replace('_', '-')} {getattr(config, name)}: {words}")
