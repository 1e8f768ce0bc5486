"""Provides `Optimizer`, the base class of this suite's optimizers, and the helpers they share.

What "weight decay" means here, once for every optimizer of this package: `weight_decay` is the
rate wd of a term wd * w that the optimizer adds *inside its own update*, on variables that no
`exclude_from_weight_decay` pattern matches. Where the term goes is part of each optimizer's
formula (LARS adds it to the gradient before the trust ratio and momentum, i.e. an L2 penalty;
LAMB adds it to the Adam direction before the trust ratio, i.e. decoupled from the moments), and
each optimizer's docstring says where. Keras' own decoupled weight decay, which the Keras base
class would apply before `update_step` to every variable, is always off (`self.weight_decay` is
None); the rate is stored as `weight_decay_rate` and `get_config` writes it back as
`weight_decay`. The MLPerf log key that carries it is the benchmark's (`lars_opt_weight_decay`,
`opt_lamb_weight_decay_rate`, ...): benchmark configs name their fields after those keys and
pass the value as `weight_decay=`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import keras
import tensorflow as tf

from mlperf_tf.sparse import merge_duplicate_rows

# Keras documents its base keyword arguments once (`base_optimizer_keyword_args`); this is the
# same text for this suite's optimizers, substituted into each class docstring by
# `document_base_keyword_args`.
BASE_KEYWORD_ARGS = """\
weight_decay: rate wd >= 0 of the weight-decay term wd * w that this optimizer adds inside its
  own update (its formula says where), on variables that no `exclude_from_weight_decay`
  pattern matches. 0 turns it off. Keras' decoupled weight decay is never used.
exclude_from_weight_decay: regular expressions matched with `re.search` against each
  variable's Keras `path` (e.g. "dense/bias", "resnet/conv1_bn/gamma"); matching variables
  get no weight decay. None means no exclusions; a bare string is an error.
name: the optimizer's name (prefix of its slot variables).
**kwargs: the other `keras.optimizers.Optimizer` arguments, passed through unchanged:
  `clipnorm`, `clipvalue`, `global_clipnorm` (clipping of the cross-replica summed gradients),
  `use_ema`, `ema_momentum`, `ema_overwrite_frequency`, `loss_scale_factor`,
  `gradient_accumulation_steps` (unknown names raise there)."""


def document_base_keyword_args(cls):
    """Class decorator: replaces `{{base_keyword_args}}` in the class's and its `__init__`'s
    docstrings with `BASE_KEYWORD_ARGS`, indented like the placeholder (as Keras does with
    `{{base_optimizer_keyword_args}}`)."""

    def fill(doc: str | None) -> str | None:
        if not doc:
            return doc
        match = re.search(r"^( *)\{\{base_keyword_args\}\}$", doc, flags=re.MULTILINE)
        if match is None:
            return doc
        indent = match.group(1)
        text = "\n".join(indent + line for line in BASE_KEYWORD_ARGS.splitlines())
        return doc[: match.start()] + text + doc[match.end() :]

    cls.__doc__ = fill(cls.__doc__)
    cls.__init__.__doc__ = fill(cls.__init__.__doc__)
    return cls


def compile_exclusion_patterns(arg_name: str, patterns: Iterable[str] | None) -> tuple[str, ...]:
    """Validates a list of regular expressions given as an optimizer argument.

    Args:
      arg_name: the argument's name, for error messages.
      patterns: regular expressions (strings), or None for none. A single string is rejected
        because iterating it would silently give one pattern per character.

    Returns:
      The patterns as a tuple of strings (what `get_config` stores).

    Raises:
      ValueError: `patterns` is a bare string, holds a non-string, or a pattern does not compile.
    """
    if patterns is None:
        return ()
    if isinstance(patterns, str):
        raise ValueError(
            f"`{arg_name}` ({patterns!r}) must be a list of regular expressions, not one string."
        )
    result = []
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise ValueError(f"`{arg_name}` entry ({pattern!r}) must be a string.")
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(
                f"`{arg_name}` entry ({pattern!r}) is not a valid regular expression: {e}."
            ) from e
        result.append(pattern)
    return tuple(result)


def variable_path(variable) -> str:
    """The name that exclusion patterns are matched against (with `re.search`).

    For a Keras 3 variable it is `variable.path`, e.g. "dense/kernel" or
    "resnet/conv1_bn/gamma" (layer names joined by "/"); for a plain `tf.Variable` it is its
    name without the ":0" suffix.
    """
    path = getattr(variable, "path", None)
    if path is None:
        path = re.sub(r":\d+$", "", str(variable.name))
    return path


def matches_any(patterns: Sequence[str], path: str) -> bool:
    """Whether any regular expression in `patterns` occurs in `path` (`re.search`)."""
    return any(re.search(p, path) is not None for p in patterns)


def tf_variable(variable) -> tf.Variable:
    """The `tf.Variable` behind a Keras variable (a `tf.Variable` passes through).

    Under `tf.distribute` this is a distributed variable whose `.handle`, inside
    `strategy.extended.update` (where `update_step` runs), is the local replica's.
    """
    if isinstance(variable, keras.Variable):
        return variable.value
    return variable


def dense_gradient(gradient, dtype) -> tf.Tensor:
    """`gradient` as a dense tensor of `dtype` (an embedding's `IndexedSlices` is densified,
    since layer-wise norms and weight decay touch every row anyway)."""
    if isinstance(gradient, tf.IndexedSlices):
        gradient = tf.convert_to_tensor(gradient)
    return tf.cast(gradient, dtype)


def clipped_update(optimizer, grads, variables, clip_norm: float | None):
    """One optimizer step of a single-replica loop outside the runner (a benchmark's base
    training in `prepare`): duplicate sparse rows merged (`merge_duplicate_rows`), then the
    global-norm clip, then `optimizer.apply_gradients`. Returns the global norm before the clip.

    Why one function: every such loop must merge before it clips and applies (the runner's
    `Trainer` does the same for its own step); a loop that clips first counts each duplicate
    row's square in the norm and hands Keras the duplicates.
    """
    grads = [merge_duplicate_rows(g) for g in grads]
    if clip_norm:
        grads, norm = tf.clip_by_global_norm(grads, clip_norm)
    else:
        norm = tf.linalg.global_norm(grads)
    optimizer.apply_gradients(zip(grads, variables))
    return norm


def l2_norm(x) -> tf.Tensor:
    """|x|_2 over all elements, with one fused reduction (`tf.nn.l2_loss` = sum(x**2) / 2)."""
    return tf.sqrt(2.0 * tf.nn.l2_loss(x))


def check_number(name: str, value, *, low: float = 0.0, high: float | None = None) -> float:
    """Validates a float hyperparameter: low <= value (< high when given); returns it as float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"`{name}` ({value!r}) must be a number.")
    if value != value or value < low or (high is not None and value >= high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high})"
        raise ValueError(f"`{name}` ({value!r}) must be {bounds}.")
    return float(value)


def check_positive_int(name: str, value) -> int:
    """Validates an int hyperparameter >= 1 (a step count or interval); returns it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` ({value!r}) must be a positive integer.")
    return value


def as_learning_rate(learning_rate):
    """Lets an int learning rate through Keras' float-only check; schedules pass unchanged."""
    if isinstance(learning_rate, int) and not isinstance(learning_rate, bool):
        return float(learning_rate)
    return learning_rate


class Optimizer(keras.optimizers.Optimizer):
    """Base class of this suite's optimizers: the shared `weight_decay` and exclusion handling.

    Subclasses call `super().__init__(learning_rate, weight_decay=..., exclude_from_weight_decay=
    ..., name=..., **kwargs)` (declaring the first two only where their defaults differ from
    these, e.g. LARS' exclusions or AdamW's decay; the others pass through `**kwargs`), create their slots in `build` (calling `super().build` first, which also decides
    `self._decay`, one Python bool per variable index: whether weight decay applies to it), and
    name their own arguments in `config_arguments` for `get_config`.

    Layer-wise norms: an optimizer whose update uses a whole variable's L2 norms (LARS, LAMB)
    sets `uses_layer_norms`; to run on variables split across replicas (tensor parallelism) it
    also provides `whole_norm_terms(gradient, variable)` and `update_step_with_norms(...)`
    (see `LAMB`), through which the runner hands it the whole tensors' norms.

    Weight-update sharding: an optimizer that can update a flat 1/N piece of each variable
    declares how with `sharded_update(variables)` (a `ShardedUpdate`, or None: it cannot). It
    is the same contract as the one above: the optimizer names the tensors whose whole norms
    its update needs, the runner's collectives sum their squares over the pieces (the data
    shards and, for split variables, the model or expert shards) and hand the norms back.
    """

    uses_layer_norms = False
    # The constructor arguments a subclass adds, each stored as the attribute of the same name:
    # `get_config` writes them back (an argument stored otherwise is added by an override).
    config_arguments: tuple[str, ...] = ()

    def sharded_update(self, variables) -> ShardedUpdate | None:
        """This optimizer's update on 1/N pieces of `variables` (None: it has none).

        Args:
          variables: the trainable variables the runner will update, in its order.
        """
        del variables
        return None

    def __init__(
        self,
        learning_rate,
        *,
        weight_decay: float = 0.0,
        exclude_from_weight_decay: Iterable[str] | None = (),
        name: str,
        **kwargs,
    ):
        """Creates the optimizer (arguments: see the module docstring and `BASE_KEYWORD_ARGS`).

        Raises:
          ValueError: `weight_decay` is negative or not a number, or a pattern does not compile.
        """
        super().__init__(
            learning_rate=as_learning_rate(learning_rate), weight_decay=None, name=name, **kwargs
        )
        if weight_decay is None:  # Keras' convention for "off".
            weight_decay = 0.0
        self.weight_decay_rate = check_number("weight_decay", weight_decay)
        self.exclude_patterns = compile_exclusion_patterns(
            "exclude_from_weight_decay", exclude_from_weight_decay
        )

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        """Not supported: pass `exclude_from_weight_decay=` to the constructor instead."""
        raise NotImplementedError(
            f"{type(self).__name__} takes its exclusions as the `exclude_from_weight_decay` "
            "constructor argument."
        )

    def build(self, var_list):
        """Builds the base state and decides, once per variable, whether weight decay applies.

        Args:
          var_list: the model's trainable variables (Keras variables). Under a strategy, call
            this inside `strategy.scope()` before the first step.
        """
        super().build(var_list)
        # Python bools per variable index: update_step branches at trace time.
        self._decay = [
            bool(self.weight_decay_rate)
            and not matches_any(self.exclude_patterns, variable_path(v))
            for v in var_list
        ]

    def get_config(self):
        """Returns every constructor argument: Keras', `weight_decay`, the exclusion list and
        the subclass's `config_arguments`."""
        config = super().get_config()
        config.update(
            {
                "weight_decay": self.weight_decay_rate,
                "exclude_from_weight_decay": list(self.exclude_patterns),
            }
        )
        config.update({name: getattr(self, name) for name in self.config_arguments})
        return config


class ShardedUpdate:
    """An optimizer's update of a flat piece of each variable, for weight-update sharding.

    With weight-update sharding (Kumar et al. 2019, "Scale MLPerf-0.6 models on Google TPU-v3
    Pods") each replica holds the summed gradient of a 1/N piece of every variable and the
    optimizer slots of that piece only: the slots are laid out over the data axis as the
    weights of a split layer are over the model axis. The runner (`mlperf_tf.collectives`)
    owns the pieces, the slot variables and the collectives; the optimizer that made this
    object owns the formula, in two phases around one all-reduce of the norms:

      1. `direction(index, w, g, slots, step)`: updates the slots that need no norm and
         returns (state, terms): `terms` are the tensors whose whole-variable L2 norms phase 2
         needs (None: none), computed on the piece;
      2. `finish(index, state, w, slots, lr, norms)`: the new piece of the weight, given the
         whole-variable norms of the terms (a [len(terms)] tensor, or None).

    Both run in replica context on tensors: `w` and `g` are the piece ([k], the variable's
    dtype), `slots` the piece's slot variables in `slot_names` order (assign them; they are
    per replica), `step` the iteration being taken (>= 1), `lr` the learning rate as `w`'s
    dtype. `index` is the variable's position in the list `sharded_update` was given.
    """

    slot_names: tuple[str, ...] = ()

    def __init__(self, optimizer, variables):
        self.optimizer = optimizer
        self.paths = [variable_path(v) for v in variables]

    def direction(self, index: int, w, g, slots, step):
        raise NotImplementedError

    def finish(self, index: int, state, w, slots, lr, norms):
        raise NotImplementedError


def assign(slot, value):
    """Assigns `value` to the slot variable and returns `value` (for `ShardedUpdate` rules)."""
    slot.assign(value)
    return value
