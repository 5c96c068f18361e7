"""Check `vllm serve` arguments against the pinned vLLM's parser, without vLLM installed.

The parser is described by `infra/data/vllm-<version>-server-flags.json`, dumped from the real
`vllm serve` parser by `scripts/snapshot-vllm-flags.py` (tests/e2e regenerate and compare it, and
parse known-good and known-bad argument lists with the real parser too).

The checker follows what 0.32.0's `vllm serve` does before it loads a model
(`vllm.utils.argparse_utils.FlexibleArgumentParser` on top of argparse): `--flag=value`,
underscores read as dashes, `--no-<flag>` only where vLLM defines it (BooleanOptionalAction),
choices, `nargs`, dotted JSON keys (`--compilation-config.mode 3`), `-O<level>`, `--model`
moved in front, and the model-must-come-first rule when `--served-model-name` is given.
It is deliberately stricter in four places, each reported with the reason: abbreviated flags
(argparse expands unique prefixes, so a later vLLM flag can change their meaning), flags given
twice (the last silently wins), deprecated flags including `--model`, and a missing model
(vLLM would serve its default, Qwen/Qwen3-0.6B).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from domain.versions import VLLM_VERSION

SNAPSHOT_DIR = Path(__file__).resolve().parents[1] / "infra" / "data"

# Flags that earlier vLLM releases accepted, with what to do instead; better advice than a
# spelling guess. Each is absent from the 0.32.0 snapshot (tests check that).
REMOVED_FLAGS: Mapping[str, str] = {
    "--disable-log-requests": ("request logging is off by default; use --enable-log-requests to turn it on"),
    "--swap-space": (
        "the V1 engine recomputes preempted requests instead of swapping them to CPU memory; "
        "for KV-cache offloading see --kv-offloading-size"
    ),
    "--task": (
        "for embedding, reranking or reward models use --runner pooling, adding --convert embed, "
        "--convert classify or --convert reward to adapt a generative model"
    ),
    "--num-scheduler-steps": "multi-step scheduling went with the V0 engine",
    "--use-v2-block-manager": "the V0 block manager it chose is gone",
    "--preemption-mode": "the V1 engine always preempts by recomputation",
    "--guided-decoding-backend": "use --structured-outputs-config.backend",
}

# Cross-flag rules `vllm serve` enforces before loading the model (validate_parsed_serve_args):
# the first switch needs the second.
REQUIRED_COMPANIONS: Mapping[str, str] = {
    "--enable-auto-tool-choice": "--tool-call-parser",
    "--enable-log-outputs": "--enable-log-requests",
}

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
# The part of `--some_flag.key` that FlexibleArgumentParser reads with underscores as dashes.
_FLAG_NAME = re.compile(r"(?<=--)[^.]*")
_OPTIMIZATION_LEVELS = ("0", "1", "2", "3")


@dataclass(frozen=True)
class ServerOption:
    dest: str
    action: str
    takes_value: bool
    nargs: int | str | None
    choices: tuple[str, ...] | None
    deprecated: bool


@dataclass(frozen=True)
class ServerFlags:
    vllm_version: str
    options: Mapping[str, ServerOption]
    allow_abbrev: bool

    def long_options(self) -> list[str]:
        return [name for name in self.options if name.startswith("--")]


def read_server_flags(path: Path) -> ServerFlags:
    """A snapshot written by scripts/snapshot-vllm-flags.py (any vLLM version)."""
    data = json.loads(path.read_text())
    options = {
        name: ServerOption(
            dest=spec["dest"],
            action=spec["action"],
            takes_value=spec["takes_value"],
            nargs=spec["nargs"],
            choices=tuple(spec["choices"]) if spec["choices"] is not None else None,
            deprecated=spec["deprecated"],
        )
        for name, spec in data["options"].items()
    }
    return ServerFlags(vllm_version=data["vllm_version"], options=options, allow_abbrev=data["allow_abbrev"])


@cache
def load_server_flags(vllm_version: str = VLLM_VERSION) -> ServerFlags:
    """The committed snapshot for `vllm_version` in infra/data/."""
    path = SNAPSHOT_DIR / f"vllm-{vllm_version}-server-flags.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"no server-flag snapshot for vLLM {vllm_version} at {path}; "
            "generate it with scripts/snapshot-vllm-flags.py in that vLLM's venv"
        )
    return read_server_flags(path)


def check_server_arguments(
    args: Sequence[str], vllm_version: str = VLLM_VERSION, *, flags: ServerFlags | None = None
) -> list[str]:
    """Problems with `vllm serve ARGS` for the pinned vLLM, as sentences naming the fix; [] if none.

    `args` is everything after `vllm serve`: the model first, then options. `flags` checks against
    another snapshot (read_server_flags) instead of the committed one for `vllm_version`.
    """
    return _ArgumentChecker(flags or load_server_flags(vllm_version), list(args)).check()


def _is_option_like(token: str) -> bool:
    """Whether argparse reads the token as an option rather than a value (no option here looks
    like a negative number, so `-1` is a value)."""
    return token.startswith("-") and token != "-" and not _NEGATIVE_NUMBER.match(token)


class _ArgumentChecker:
    def __init__(self, flags: ServerFlags, args: list[str]) -> None:
        self.flags = flags
        self.args = args
        self.problems: list[str] = []
        self.positionals: list[str] = []
        self.first_positional_index: int | None = None
        self.model_option: str | None = None
        self.seen: dict[str, str] = {}  # dest -> the flag that set it first
        self.turned_on: dict[str, bool] = {}  # dest -> whether its last flag set it (not --no-...)

    @property
    def version(self) -> str:
        return self.flags.vllm_version

    def check(self) -> list[str]:
        index = 0
        while index < len(self.args):
            token = self.args[index]
            if token == "--":
                self._positional(index, *self.args[index + 1 :])
                break
            if not _is_option_like(token):
                self._positional(index, token)
                index += 1
            else:
                index = self._option(index)
        self._check_model()
        self._check_companions()
        return self.problems

    def _check_companions(self) -> None:
        options = self.flags.options
        for flag, companion in REQUIRED_COMPANIONS.items():
            if flag not in options or companion not in options:  # another vLLM's snapshot
                continue
            if self.turned_on.get(options[flag].dest) and not self.turned_on.get(options[companion].dest):
                self.problems.append(
                    f"{flag} requires {companion} in vLLM {self.version}; add it or drop {flag}"
                )

    def _positional(self, index: int, *tokens: str) -> None:
        if tokens and self.first_positional_index is None:
            self.first_positional_index = index
        self.positionals.extend(tokens)

    def _option(self, index: int) -> int:
        """Check the option at `index`; return the index of the next unread token."""
        token = self.args[index]
        if token.startswith("-O") and token != "-O" and not token.startswith("--"):
            level = token[3:] if token[2:3] == "=" else token[2:]
            return self._values("--optimization-level", token, index + 1, inline=level)
        if token == "-O" and index + 1 < len(self.args) and self.args[index + 1] in _OPTIMIZATION_LEVELS:
            return self._values("--optimization-level", token, index + 1, inline=None)

        name, has_value, inline = token.partition("=")
        if name.startswith("--"):
            name = _FLAG_NAME.sub(lambda match: match.group(0).replace("_", "-"), name, count=1)
        if "." in name:
            return self._dotted(name, token, index, inline if has_value else None)
        if name == "--model":
            self.model_option = token
        return self._values(name, token, index + 1, inline if has_value else None)

    def _dotted(self, name: str, token: str, index: int, inline: str | None) -> int:
        """`--json-arg.key value` / `--json-arg.key+ a,b`: one key of a JSON-valued option."""
        base = name.split(".", 1)[0]
        next_index = index + 1 if inline is not None else index + 2
        if inline is None and index + 1 >= len(self.args):
            self.problems.append(f"{token} needs a value (vLLM {self.version} reads the next argument as it)")
        option = self._lookup(base, token)
        if option is not None and not option.takes_value:
            self.problems.append(
                f"{token}: {base} takes no value in vLLM {self.version}, so it has no keys to set"
            )
        return next_index

    def _lookup(self, name: str, token: str) -> ServerOption | None:
        option = self.flags.options.get(name)
        if option is not None:
            return option
        if name in REMOVED_FLAGS:
            self.problems.append(
                f"vLLM {self.version} does not accept {name}; remove it ({REMOVED_FLAGS[name]})"
            )
            return None
        expansions = [long for long in self.flags.long_options() if long.startswith(name)]
        if name.startswith("--") and self.flags.allow_abbrev and len(expansions) == 1:
            self.problems.append(
                f"{token} is an abbreviation that vLLM {self.version} expands to {expansions[0]}; write "
                f"{expansions[0]} in full so that a flag added by a later vLLM cannot change its meaning"
            )
            return self.flags.options[expansions[0]]
        if name.startswith("--") and len(expansions) > 1:
            self.problems.append(
                f"vLLM {self.version} does not accept {name}: it is ambiguous, matching "
                f"{', '.join(expansions[:5])}{' ...' if len(expansions) > 5 else ''}; write one in full"
            )
            return None
        close = difflib.get_close_matches(name, list(self.flags.options), n=3, cutoff=0.75)
        advice = f"did you mean {' or '.join(close)}?" if close else "remove it"
        self.problems.append(f"vLLM {self.version} does not accept {name}; {advice}")
        return None

    def _values(self, name: str, token: str, next_index: int, inline: str | None) -> int:
        option = self._lookup(name, token)
        if option is None:
            # Skip what was probably its value, so that one unknown flag reports one problem.
            if inline is None and next_index < len(self.args) and not _is_option_like(self.args[next_index]):
                return next_index + 1
            return next_index
        self._note_repeat(option, name)
        self.turned_on[option.dest] = not (
            option.action == "BooleanOptionalAction" and name.startswith("--no-")
        )
        if option.deprecated:
            self.problems.append(
                f"{name} is deprecated in vLLM {self.version} and will be removed; "
                f"see `vllm serve --help={name[2:]}`"
            )
        if not option.takes_value:
            if inline is not None:
                self.problems.append(
                    f"{name} is a switch in vLLM {self.version} and takes no value ({token!r}); "
                    + self._switch_advice(name)
                )
            return next_index
        if inline is not None:
            self._check_choices(name, option, [inline])
            return next_index
        values, next_index = self._take_values(option, next_index)
        if isinstance(option.nargs, int):
            missing = len(values) < option.nargs
        else:
            missing = not values and option.nargs in (None, "+")
        if missing:
            self.problems.append(f"{name} needs a value in vLLM {self.version}")
        self._check_choices(name, option, values)
        return next_index

    def _take_values(self, option: ServerOption, index: int) -> tuple[list[str], int]:
        if isinstance(option.nargs, int):
            limit = option.nargs
        elif option.nargs in ("+", "*"):
            limit = len(self.args)
        else:  # None or "?": one value
            limit = 1
        values: list[str] = []
        while index < len(self.args) and len(values) < limit:
            if _is_option_like(self.args[index]) or self.args[index] == "--":
                break
            values.append(self.args[index])
            index += 1
        return values, index

    def _check_choices(self, name: str, option: ServerOption, values: list[str]) -> None:
        if option.choices is None:
            return
        for value in values:
            if value not in option.choices:
                close = difflib.get_close_matches(value, option.choices, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                self.problems.append(
                    f"{name} {value!r} is not a choice vLLM {self.version} accepts{hint}; "
                    f"choose from {', '.join(option.choices)}"
                )

    def _switch_advice(self, name: str) -> str:
        negation = f"--no-{name[2:]}"
        if negation in self.flags.options:
            return f"write {name} to turn it on or {negation} to turn it off"
        return f"write {name} alone to turn it on, or leave it out"

    def _note_repeat(self, option: ServerOption, name: str) -> None:
        first = self.seen.get(option.dest)
        if first is None:
            self.seen[option.dest] = name
        elif option.action != "_AppendAction":
            self.problems.append(
                f"{name} repeats {first} given earlier; vLLM {self.version} keeps only the last one, "
                "so give it once"
            )

    def _check_model(self) -> None:
        if self.model_option is not None:
            if self.positionals:
                self.problems.append(
                    f"the model is given twice, as {self.positionals[0]!r} and as {self.model_option}; "
                    f"`vllm serve` moves --model in front, so vLLM {self.version} rejects "
                    f"{self.positionals[0]!r} as an extra argument. Keep only the first argument"
                )
            self.problems.append(
                f"pass the model as the first argument of `vllm serve`, not {self.model_option}: vLLM "
                f"{self.version} accepts --model only with a warning that it will be removed"
            )
            return
        if len(self.positionals) > 1:
            self.problems.append(
                f"`vllm serve` takes one argument, the model; vLLM {self.version} rejects the extra "
                f"{', '.join(repr(extra) for extra in self.positionals[1:])} (a flag's value given "
                "to a switch, or a missing --flag?)"
            )
        uses_config_file = "config" in self.seen
        if not self.positionals and not uses_config_file:
            self.problems.append(
                f"no model given: `vllm serve` {self.version} would serve its default model "
                "(Qwen/Qwen3-0.6B); pass the model as the first argument"
            )
        elif (
            self.first_positional_index not in (0, None)
            and not uses_config_file
            and ("served_model_name" in self.seen)
        ):
            self.problems.append(
                f"the model {self.positionals[0]!r} must be the first argument when --served-model-name "
                f"is given; vLLM {self.version} refuses to start otherwise"
            )
