"""Provides what each MLPerf Training round asks of a log: its benchmarks, keys and rule files.

Pure Python (no TensorFlow): the runner asks it which keys a round wants emitted
(`init_events`, `adapt_hparams`), the checker which rounds accept a benchmark and which keys each
requires (`accepted_benchmarks`, `required_keys`, `rules_fingerprint`) to pick a log's round. The
rounds' rules themselves are read from the installed official checker's rule files, never copied:
e.g. the tensor names of `weights_initialization` are the list in the round's
`closed_<benchmark>.yaml` (`END: CHECK: sorted(s['initialized_tensors']) == sorted([...])`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import re
from typing import Any

USAGE = "training"
WEIGHTS_INITIALIZATION = "weights_initialization"  # mlperf_logging.mllog.constants
TENSOR = "tensor"  # its metadata key
OPT_EPSILON = "opt_epsilon"
OPT_LAMB_EPSILON = "opt_lamb_epsilon"

# The round-level disclosure keys of 6.1.0's common rules (precision, parallelism, run config):
# `Benchmark.round_hparams` gives them for every run; a round before 6.1.0 does not know them.
PRECISION_KEYS = (
    "lowest_numerical_precision_in_linear",
    "lowest_numerical_precision_in_attn",
    "lowest_numerical_precision_in_comm",
)
ROUND_KEYS = (
    *PRECISION_KEYS,
    "tensor_parallelism",
    "pipeline_parallelism",
    "context_parallelism",
    "expert_parallelism",
    "micro_batch_size",
    "config_filename",
)
# The rules' names of the dtypes a Keras policy computes in.
_PRECISION_NAMES = {"float32": "fp32", "bfloat16": "bfloat16", "float16": "fp16"}


def precision_name(dtype: str) -> str:
    """The 6.1.0 rules' name of a compute dtype ("bfloat16" -> "bfloat16", "float16" -> "fp16");
    fp32 for any other."""
    return _PRECISION_NAMES.get(dtype, "fp32")


# Keys that a round's common rules require from that round on (EXACTLY_ONE: an older round's
# log leaves them out): 6.1.0's precision, parallelism and run-config disclosure.
_FIRST_ROUND_OF_KEY = {key: "6.1.0" for key in ROUND_KEYS}

_QUOTED = re.compile(r'"([^"\\]+)"')
_SINGLE_QUOTED = re.compile(r"'([^'\\]+)'")
# `- KEY:` entries of a rule file: NAME, then optionally REQ, as every rule file writes them.
_KEY_ENTRY = re.compile(r"^\s*NAME:\s*(\S+)\s*\n\s*REQ:\s*(\S+)", re.MULTILINE)
_BENCHMARK_CHECK = re.compile(
    r"NAME:\s*submission_benchmark\s*\n(?:.*\n)*?\s*CHECK:\s*\"([^\"]*)\"", re.MULTILINE
)
_RULESET_IN_PATH = re.compile(r"training_\d+\.\d+\.\d+/")


def version_key(ruleset: str) -> tuple[int, ...]:
    """Sorts rulesets by version: "0.7.0" < "1.0.0" < "10.0.0"."""
    return tuple(int(part) for part in ruleset.split("."))


@functools.cache  # the installed package does not change under a running process (cf. rule_text)
def rules_dir() -> str:
    """The folder of the installed official checker's rule files (found without importing it)."""
    spec = importlib.util.find_spec("mlperf_logging.compliance_checker")
    return list(spec.submodule_search_locations)[0]


@functools.cache
def available_rulesets() -> tuple[str, ...]:
    """The training rulesets the installed checker has, oldest first."""
    names = []
    for entry in os.listdir(rules_dir()):
        match = re.fullmatch(rf"{USAGE}_(\d+\.\d+\.\d+)", entry)
        if match:
            names.append(match.group(1))
    return tuple(sorted(names, key=version_key))


@functools.cache
def rule_text(ruleset: str, name: str) -> str:
    """The text of one rule file of `ruleset` ("" when it does not exist or is not a name)."""
    if os.sep in name or "/" in name or not re.fullmatch(r"\d+\.\d+\.\d+", ruleset):
        return ""
    path = os.path.join(rules_dir(), f"{USAGE}_{ruleset}", name)
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


def accepted_benchmarks(ruleset: str, division: str = "closed") -> frozenset[str]:
    """The `submission_benchmark` values the round's `<division>_common.yaml` accepts.

    Empty for 0.6.0 (no such check) and for divisions whose common file does not list them. A
    listed name may still lack its rule file (resnet in 4.1.0): see `has_benchmark`.
    """
    match = _BENCHMARK_CHECK.search(rule_text(ruleset, f"{division}_common.yaml"))
    listed = re.search(r"\bin\s*\[([^\]]*)\]", match.group(1)) if match else None
    return frozenset(_SINGLE_QUOTED.findall(listed.group(1))) if listed else frozenset()


def has_benchmark(ruleset: str, benchmark: str | None) -> bool:
    """Whether the round accepts `benchmark` and has its closed rule file."""
    if not benchmark or not re.fullmatch(r"[a-z0-9_]+", benchmark):
        return False
    return benchmark in accepted_benchmarks(ruleset) and bool(
        rule_text(ruleset, f"closed_{benchmark}.yaml")
    )


def required_keys(ruleset: str, benchmark: str, division: str = "closed") -> frozenset[str]:
    """Keys the round requires (REQ EXACTLY_ONE or AT_LEAST_ONE) of a `benchmark` log.

    From common.yaml, `<division>_common.yaml` and `<division>_<benchmark>.yaml`; optimizer
    sub-files (closed_resnet_lars.yaml) are left out: they do not change between rounds.
    """
    names = ("common.yaml", f"{division}_common.yaml", f"{division}_{benchmark}.yaml")
    keys = set()
    for name in names:
        for key, requirement in _KEY_ENTRY.findall(rule_text(ruleset, name)):
            if requirement in ("EXACTLY_ONE", "AT_LEAST_ONE"):
                keys.add(key)
    return frozenset(keys)


def rules_fingerprint(ruleset: str, benchmark: str, division: str = "closed") -> str:
    """The text of the rule files that judge a `benchmark` log in `ruleset`, round names removed.

    Two rounds with the same fingerprint give every log the same verdict.
    """
    names = ["common.yaml", f"{division}_common.yaml", f"{division}_{benchmark}.yaml"]
    folder = os.path.join(rules_dir(), f"{USAGE}_{ruleset}")
    if os.path.isdir(folder):
        names += sorted(n for n in os.listdir(folder) if n.startswith(f"{division}_{benchmark}_"))
    text = "\n".join(f"{name}\n{rule_text(ruleset, name)}" for name in names)
    return _RULESET_IN_PATH.sub("training_R/", text)


@functools.cache
def rounds_with_rules(benchmark: str | None) -> tuple[str, ...]:
    """The installed rounds that accept MLPerf benchmark `benchmark` and ship its closed rule
    file, oldest first: the default of `Benchmark.supported_rounds`."""
    return tuple(r for r in available_rulesets() if has_benchmark(r, benchmark))


def rounds_with(benchmark: Any) -> tuple[str, ...]:
    """The rounds whose closed rules fit `benchmark` (a `Benchmark` class or instance: its
    `supported_rounds()`), oldest first."""
    return tuple(benchmark.supported_rounds())


def default_ruleset(benchmark: Any) -> str:
    """The newest round that has `benchmark` (a `Benchmark` class or instance): what
    `mlperf-tf run` emits for by default.

    Raises:
      ValueError: the benchmark is in no round this suite knows.
    """
    rounds = rounds_with(benchmark)
    if not rounds:
        raise ValueError(
            f"`benchmark` ({benchmark.mlperf_benchmark!r}) is in no MLPerf round this suite knows."
        )
    return rounds[-1]


def resolve_ruleset(benchmark: Any, ruleset: str) -> str:
    """The round a run of `benchmark` (a `Benchmark` class or instance) emits for: `ruleset`, or
    by default the newest with it.

    Returns "" (no round-specific keys) for a benchmark in no round this suite knows, e.g. a
    third-party one, when no ruleset is given.

    Raises:
      ValueError: `ruleset` is given and is not a round with the benchmark.
    """
    if ruleset:
        validate_ruleset(benchmark, ruleset)
        return ruleset
    return default_ruleset(benchmark) if rounds_with(benchmark) else ""


def validate_ruleset(benchmark: Any, ruleset: str) -> None:
    """Checks that `ruleset` is a round with `benchmark` (a `Benchmark` class or instance).

    Raises:
      ValueError: naming the ruleset and the rounds that have the benchmark.
    """
    rounds = rounds_with(benchmark)
    if ruleset not in rounds:
        have = ", ".join(rounds) if rounds else "none"
        raise ValueError(
            f"ruleset {ruleset!r} has no MLPerf '{benchmark.mlperf_benchmark}' this suite can "
            f"emit; rounds with it: {have}"
        )


@functools.cache
def initialized_tensors(benchmark: str, ruleset: str) -> tuple[str, ...]:
    """The tensor names the round's rules require in `weights_initialization` events, or ().

    Read from the END check of the round's `closed_<benchmark>.yaml`: the rules compare the sorted
    list of logged `tensor` metadata with this list, so each name is logged exactly once.
    """
    import yaml

    path = os.path.join(rules_dir(), f"{USAGE}_{ruleset}", f"closed_{benchmark}.yaml")
    if not re.fullmatch(r"[a-z0-9_]+", benchmark) or not os.path.isfile(path):
        return ()
    with open(path) as handle:
        entries = yaml.load(handle, Loader=yaml.BaseLoader) or []
    for entry in entries:
        end = entry.get("END") if isinstance(entry, dict) else None
        check = end.get("CHECK", "") if isinstance(end, dict) else ""
        if "initialized_tensors" in check:
            return tuple(_QUOTED.findall(check))
    return ()


@functools.cache
def closed_allowed_values(ruleset: str, benchmark: str, key: str) -> tuple[Any, ...] | None:
    """The values the round's closed rules allow for `key` of a `benchmark` log, or None.

    Read from `closed_<benchmark>.yaml`: a `CHECK: " v['value'] in [...] "` of the key (ResNet's
    `opt_name` in ['sgd', 'lars']). None when the rules do not restrict the key that way.
    """
    import ast

    if not re.fullmatch(r"[a-z0-9_]+", benchmark or ""):
        return None
    # Read as text (no YAML parser: `check` keeps its process light): one entry per "- KEY:".
    for entry in re.split(r"^- ", rule_text(ruleset, f"closed_{benchmark}.yaml"), flags=re.M):
        if not re.search(rf"^\s+NAME:\s*{re.escape(key)}\s*$", entry, flags=re.M):
            continue
        match = re.search(r"CHECK:.*v\['value'\]\s+in\s+(\[[^\]]*\])", entry)
        if match:
            try:
                return tuple(ast.literal_eval(match.group(1)))
            except (ValueError, SyntaxError):
                return None
    return None


def closed_division_problem(ruleset: str, benchmark: str, hparams: dict[str, Any]) -> str | None:
    """Why a closed-division log of `benchmark` with these hparams breaks the round's rules.

    Checks the keys whose allowed values the closed rules list (ResNet's `opt_name`: an optimizer
    the closed division does not allow makes it an open-division run), and that some round has
    the benchmark at all (`ruleset` ""). None: no such problem.
    """
    if not any(has_benchmark(r, benchmark) for r in available_rulesets()):
        return f"no MLPerf round has benchmark {benchmark!r}: its logs belong to the open division"
    for key in ("opt_name",):
        if key not in hparams:
            continue
        allowed = closed_allowed_values(ruleset, benchmark, key)
        if allowed is not None and hparams[key] not in allowed:
            return (
                f"the closed division of round {ruleset} allows {key} "
                f"{' or '.join(repr(v) for v in allowed)} for {benchmark}, not "
                f"{hparams[key]!r} ({USAGE}_{ruleset}/closed_{benchmark}.yaml): such a run "
                "belongs to the open division"
            )
    return None


def adapt_hparams(renamed_keys, ruleset: str, hparams: dict[str, Any]) -> dict[str, Any]:
    """The hyperparameter keys under the names `ruleset` uses, keeping their order.

    A benchmark may give a value under both names of a key it declares renamed
    (`Benchmark.renamed_keys`, `mlperf_tf.facts.RenamedKey`: BERT's `opt_epsilon`, called
    `opt_lamb_epsilon` from v2.1); the rules want the key EXACTLY_ONE time under the round's
    name, so the other name is dropped (or the value renamed, where only the other name was
    given). Keys that only a later round's rules know (6.1.0's disclosure keys) are dropped for
    older rounds.
    """
    adapted = dict(hparams)
    for old, new, since in renamed_keys:
        if not ruleset:
            continue
        keep, drop = (new, old) if version_key(ruleset) >= version_key(since) else (old, new)
        if keep not in adapted and drop in adapted:
            adapted = {keep if k == drop else k: v for k, v in adapted.items()}
        adapted.pop(drop, None)
    if ruleset:
        adapted = {
            key: value
            for key, value in adapted.items()
            if version_key(ruleset) >= version_key(_FIRST_ROUND_OF_KEY.get(key, "0.0.0"))
        }
    return adapted


@dataclasses.dataclass(frozen=True)
class Event:
    """One MLPerf log event: `mllog.event(key, value, metadata=metadata)`."""

    key: str
    value: Any = None
    metadata: dict[str, Any] | None = None


def init_events(benchmark: str, ruleset: str) -> tuple[Event, ...]:
    """The events a round requires during initialization, beyond the hyperparameters.

    Today: one `weights_initialization` event per tensor the round lists (rounds 1.1.0-2.1.0 for
    resnet, bert and ssd); log them between init_start and init_stop.
    """
    if not ruleset:
        return ()
    return tuple(
        Event(WEIGHTS_INITIALIZATION, None, {TENSOR: name})
        for name in initialized_tensors(benchmark, ruleset)
    )
