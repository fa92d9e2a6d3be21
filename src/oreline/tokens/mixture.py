"""A mixture of token sources: which source, and which of its sequences, sits at each position.

Training reads one global order of sequences (oreline.tokens.loader: position p of the order is
the p-th sequence handed out, over all ranks). With several token folders (`[[train.sources]]`:
a name, a folder, a weight), position p maps to (source i, index j in source i's own stream)
through a pure function of p, so the loader's state stays a position and a short phase list,
and resume, rollback and any world size continue the very same order.

Which source (the largest-error rule, as a closed form). Within a phase whose weights, in the
phase's order, are w_1..w_k (normalised to sum 1), source 1 takes c_1(q) = floor(w_1·q + 1/2) of
the first q positions (hierarchical Bresenham: position q is source 1's iff c_1(q+1) > c_1(q));
the positions it leaves are numbered in order and split the same way between source 2 (with
weight w_2 / (w_2 + ... + w_k)) and the rest, and so on; the last source takes what remains.
Each level rounds to nearest, so every source's count after any q positions is within k/2 of
w_i·q: over any window of W positions a source's share is within k/W of its weight (over 1,000
global batches of ≥ 1 sequence, within 1% for up to 10 sources — a random draw is off by
~sqrt(w(1-w)/W), ~1.4% at 1,000 sequences). Weights are exact fractions (Fraction of the
decimal the config wrote), so no float rounding enters the order. A source of weight 0 is never
picked.

Which sequence of the source. The index j counts source i's positions before p over all phases;
epoch_i = j // n_i (n_i its sequences) and the sequence is source i's seeded Feistel order of that
epoch at j mod n_i (oreline.tokens.order). A source smaller than its share therefore repeats,
epoch by epoch, each a new order. The first source of a run is keyed by `train.seed` alone and
every later one by `seed:name`, so a one-source mixture is exactly the order of the single token
folder of oreline before mixtures (`train.tokens` is that one-source mixture, named "main"),
and the keys are recorded in the loader state and kept on resume. A source's `max_epochs`
bounds its repeats: a read past it stops the run with an error naming the source (and the
loader refuses a run whose planned steps would pass it before the first step).

Phases (`[[train.phases]]`: `start_step` or `start_tokens`, and `weights`). Phase k covers the
positions [start_k, start_{k+1}); start_step = S starts it after S optimizer steps (position
S × global batch sequences), start_tokens rounds up to the next whole step. A source not named
in a phase's weights has weight 0 there. Each source's count at a phase's start is the sum of
its counts in the earlier phases (computed, not stored), so position → (source, index) stays a
pure function of p over the whole run.

Changing the mixture at resume (the documented rule). The loader state records the phases in
effect so far (their starts, weights in order, and each source's count at each start). On resume
the recorded phases that started at or before the resume position are history and are kept as
they were; if the weights the config gives for the resume position differ from the recorded
ones (another weight, a source added or removed), a new phase with the config's weights starts
exactly at the resume position; the config's phases that start later follow. Each source
continues from its own count: the next sequence it gives is the one after the last it gave
(same epoch, same order), a source new to the run starts at its sequence 0 of epoch 0, a source
left out stops where it was. Nothing is replayed. The new phase is in the loader state (and so
in every later checkpoint) and the training loop logs it as a `phase` event. As with any config
change, resuming with other weights needs `--allow-config-change train.sources` (or
`train.phases`; adding or removing a source also changes the run's data fingerprint:
`--allow-config-change data`), and a source whose token folder changed is refused (give it a
new name).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import torch

from oreline.errors import ConfigError, FingerprintMismatch, TrainingError
from oreline.tokens.loader import IGNORE_INDEX, Batch, TokenLoader

STATE_VERSION = 3  # 3: sources and phases; 2: one token folder (read as the one-source mixture)
LEGACY_NAME = "main"  # the source `train.tokens` (or the run's tokens/) becomes


def _fraction(w: float | int | str | Fraction) -> Fraction:
    """The weight as an exact fraction of the decimal written (0.7 is 7/10, not the binary double)."""
    f = Fraction(w) if isinstance(w, Fraction | int) else Fraction(repr(float(w)))
    if f < 0:
        raise ConfigError(f"mixture weight {w} is negative", "give every source a weight ≥ 0")
    return f


# A weight in the loader state is str(Fraction) of a config weight: the fraction of a float's
# repr, whose numerator and denominator have at most ~330 digits (5e-324 is 5/10^324). Fraction()
# of a string is unbounded work (Fraction("1e999999999") computes 10^999999999: a resume that
# never ends), so a state weight must be two plain integers of at most this many digits.
MAX_WEIGHT_DIGITS = 400
_STATE_WEIGHT = re.compile(rf"[0-9]{{1,{MAX_WEIGHT_DIGITS}}}(?:/[0-9]{{1,{MAX_WEIGHT_DIGITS}}})?")


def state_fraction(w: object, where: str) -> Fraction:
    """A weight read back from a loader state (`str(Fraction)`, "7/10"): ConfigError naming `where`
    unless it is that form within MAX_WEIGHT_DIGITS digits, checked before Fraction() computes."""
    if isinstance(w, str) and _STATE_WEIGHT.fullmatch(w):
        num, _, den = w.partition("/")
        if int(den or 1) > 0:
            return Fraction(int(num), int(den or 1))
    shown = repr(w) if len(repr(w)) <= 80 else f"{repr(w)[:60]}… ({len(repr(w)):,} characters)"
    raise ConfigError(
        f"{where}: mixture weight {shown} is not a fraction oreline writes (integers of at most "
        f'{MAX_WEIGHT_DIGITS} digits, as in "7/10")',
        "the checkpoint's loader state is damaged or forged: resume from another checkpoint, or start "
        "a new data order with --resume none",
    )


@dataclass
class Phase:
    """Positions [start, next phase's start) drawn with `weights` (ordered: the order is the hierarchy)."""

    start: int
    weights: list[tuple[str, Fraction]]
    why: str = "config"  # config: from the config; resume: a mixture changed at resume
    counts: dict[str, int] = field(default_factory=dict)  # each source's sequences before `start`

    def __post_init__(self) -> None:
        self.weights = [(name, _fraction(w)) for name, w in self.weights]
        total = sum((w for _, w in self.weights), Fraction(0))
        if total <= 0:
            raise ConfigError(
                f"the mixture phase at position {self.start} has no source of positive weight",
                "give at least one source a weight > 0",
            )
        # hierarchical ratios: w_i / (w_i + ... + w_k), the last positive source takes the rest
        live = [(n, w / total) for n, w in self.weights if w > 0]
        self._levels: list[tuple[str, int, int]] = []
        rest = Fraction(1)
        for i, (name, w) in enumerate(live):
            r = Fraction(1) if i == len(live) - 1 else w / rest
            self._levels.append((name, r.numerator, r.denominator))
            rest -= w

    def normalised(self) -> dict[str, Fraction]:
        total = sum((w for _, w in self.weights), Fraction(0))
        return {n: w / total for n, w in self.weights if w > 0}

    def counts_after(self, q: int) -> dict[str, int]:
        """Each source's positions among the phase's first q."""
        out = {}
        for name, a, b in self._levels:
            c = (2 * a * q + b) // (2 * b)  # floor(a/b · q + 1/2)
            out[name] = c
            q -= c
        return out

    def pick(self, q: int) -> tuple[str, int]:
        """(source, its positions before) of the phase's position q."""
        for name, a, b in self._levels:
            c0 = (2 * a * q + b) // (2 * b)
            if (2 * a * (q + 1) + b) // (2 * b) > c0:
                return name, c0
            q -= c0
        raise AssertionError("the last level takes every remaining position")  # pragma: no cover

    def to_json(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "weights": [[n, str(w)] for n, w in self.weights],
            "why": self.why,
            "counts": dict(self.counts),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Phase:
        where = f"the loader state's phase at {d.get('start')!r}"[:120]
        weights = [(n, state_fraction(w, where)) for n, w in d["weights"]]
        return cls(int(d["start"]), weights, d.get("why", "config"))


class Mixture:
    """Position → (source, index in that source's stream), over phases in order of start."""

    def __init__(self, phases: Sequence[Phase]):
        if not phases or phases[0].start != 0:
            raise ConfigError(
                "a mixture's first phase must start at position 0", "start the first phase at step 0"
            )
        starts = [p.start for p in phases]
        if starts != sorted(set(starts)):
            raise ConfigError(
                f"mixture phases start at positions {starts}: not strictly increasing",
                "give each [[train.phases]] its own, later start_step",
            )
        self.phases = list(phases)
        totals: dict[str, int] = {}
        for i, ph in enumerate(self.phases):
            ph.counts = dict(totals)
            if i + 1 < len(self.phases):
                for name, c in ph.counts_after(self.phases[i + 1].start - ph.start).items():
                    totals[name] = totals.get(name, 0) + c

    def _phase_at(self, p: int) -> Phase:
        k = int(np.searchsorted([ph.start for ph in self.phases], p, side="right")) - 1
        return self.phases[k]

    def locate(self, p: int) -> tuple[str, int]:
        """(source name, index in its stream) of global position p."""
        ph = self._phase_at(p)
        name, c = ph.pick(p - ph.start)
        return name, ph.counts.get(name, 0) + c

    def counts(self, p: int) -> dict[str, int]:
        """Each source's sequences among global positions [0, p)."""
        ph = self._phase_at(p)
        out = dict(ph.counts)
        for name, c in ph.counts_after(p - ph.start).items():
            out[name] = out.get(name, 0) + c
        return out

    def weights_at(self, p: int) -> dict[str, Fraction]:
        return self._phase_at(p).normalised()


# ---------------------------------------------------------------------------------------------
# the loader over a mixture


@dataclass
class Source:
    name: str
    tokens: Path
    weight: float
    max_epochs: float | None = None


def config_phases(
    sources: Sequence[Source], phases: Sequence[Any], global_sequences: int, seq_len: int
) -> list[Phase]:
    """The config's phases as positions: the sources' weights from 0, then each `[[train.phases]]`."""
    names = [s.name for s in sources]
    out = [Phase(0, [(s.name, s.weight) for s in sources])]
    for ph in phases:
        unknown = [n for n in ph.weights if n not in names]
        if unknown:
            raise ConfigError(
                f"train.phases names sources {unknown} that train.sources does not list ({names})",
                "name only sources listed in [[train.sources]]",
            )
        if ph.start_step is not None:
            start = ph.start_step * global_sequences
        else:
            step_tokens = global_sequences * seq_len
            start = -(-ph.start_tokens // step_tokens) * global_sequences
        out.append(Phase(start, [(n, ph.weights.get(n, 0.0)) for n in names]))
    if len(out) > 1 and out[1].start == 0:  # a phase at step 0 replaces the sources' own weights
        out = out[1:]
    return out


def order_key(seed: int, name: str, first: bool) -> str | int:
    """The Feistel key of a source: the seed for the run's first source (today's single-folder order)."""
    return seed if first else f"{seed}:{name}"


class MixtureLoader:
    """next_batch / state_dict / load_state_dict over several token folders (see the module doc).

    Rank r of world W takes positions [consumed + r·micro, consumed + (r+1)·micro) of the global
    order at each next_batch, as TokenLoader does, so every world size reads the same global batches.
    """

    def __init__(
        self,
        sources: Sequence[Source],
        phases: Sequence[Any] = (),
        *,
        seq_len: int = 256,
        micro_batch: int = 8,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        global_sequences: int | None = None,
        tokenizer_fingerprint: str | None = None,
        doc_mask: bool = False,
    ):
        if not sources:
            raise ConfigError("the mixture has no sources", "list at least one [[train.sources]]")
        self.sources = {s.name: s for s in sources}
        self.seq_len, self.micro_batch, self.seed = seq_len, micro_batch, seed
        self.rank, self.world_size = rank, world_size
        self.split = "train"
        self.global_sequences = global_sequences or micro_batch * world_size
        self.loaders: dict[str, TokenLoader] = {}
        self.keys: dict[str, str | int] = {}
        for i, s in enumerate(sources):
            key = order_key(seed, s.name, i == 0)
            self.keys[s.name] = key
            self.loaders[s.name] = TokenLoader(
                s.tokens,
                split="train",
                seq_len=seq_len,
                micro_batch=micro_batch,
                seed=key,  # type: ignore[arg-type]  # FeistelOrder keys with str(seed)
                rank=rank,
                world_size=world_size,
                tokenizer_fingerprint=tokenizer_fingerprint,
                doc_mask=doc_mask,
            )
        first = next(iter(self.loaders.values()))
        for name, loader in self.loaders.items():
            m, m0 = loader.manifest, first.manifest
            if m["tokenizer_fingerprint"] != m0["tokenizer_fingerprint"]:
                raise FingerprintMismatch(
                    f"source {name!r} ({loader.dir}) was tokenized with tokenizer {m['tokenizer_fingerprint'][:12]}…, "
                    f"source {sources[0].name!r} ({first.dir}) with {m0['tokenizer_fingerprint'][:12]}…",
                    "tokenize every source with the same tokenizer (oreline tokenize --tokenizer DIR)",
                )
        self.bos_id, self.eos_id = first.bos_id, first.eos_id
        self.doc_mask = doc_mask
        self._config_phases = config_phases(sources, phases, self.global_sequences, seq_len)
        self.mixture = Mixture(self._config_phases)
        self.consumed = 0
        self.new_phase: Phase | None = None  # set by load_state_dict when the mixture changed at resume

    # -- what the run reports ------------------------------------------------------------------

    @property
    def data_fingerprint(self) -> str:
        """One source: its folder's (as before mixtures); several: sha256 over names and folders' fingerprints."""
        if len(self.loaders) == 1:
            return next(iter(self.loaders.values())).data_fingerprint
        parts = {n: loader.data_fingerprint for n, loader in self.loaders.items()}
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    @property
    def tokens_dir(self) -> Path:
        return next(iter(self.loaders.values())).dir

    def check_fits(self, vocab_size: int, bos_id: int, eos_id: int, model: str) -> None:
        for loader in self.loaders.values():
            loader.check_fits(vocab_size, bos_id, eos_id, model)

    def source_sequences(self, position: int | None = None) -> dict[str, int]:
        """Sequences each source gave among the first `position` (default: consumed) of the order."""
        counts = self.mixture.counts(self.consumed if position is None else position)
        return {n: counts.get(n, 0) for n in self._names()}

    def source_tokens(self, position: int | None = None) -> dict[str, int]:
        return {n: c * self.seq_len for n, c in self.source_sequences(position).items()}

    def source_epochs(self, position: int | None = None) -> dict[str, float]:
        out = {}
        for n, c in self.source_sequences(position).items():
            loader = self.loaders.get(n)
            out[n] = round(c / loader.num_sequences, 4) if loader is not None else None
        return out

    def weights(self, position: int | None = None) -> dict[str, float]:
        w = self.mixture.weights_at(self.consumed if position is None else position)
        return {n: float(w.get(n, 0)) for n in self._names()}

    def _names(self) -> list[str]:
        names = list(self.loaders)
        for ph in self.mixture.phases:
            names += [n for n, _ in ph.weights if n not in names]
        return names

    def check_budget(self, end_position: int, when: str = "the planned train.steps take") -> None:
        """Refuse a plan (before the first step) or a global batch (before it is read) whose sources
        would pass their max_epochs by `end_position`; closed-form counts, O(sources × phases)."""
        counts = self.mixture.counts(end_position)
        for name, s in self.sources.items():
            if (
                s.max_epochs is not None
                and counts.get(name, 0) > s.max_epochs * self.loaders[name].num_sequences
            ):
                self._too_many_epochs(name, counts[name], when)

    def _too_many_epochs(self, name: str, index: int, when: str) -> None:
        s, n = self.sources[name], self.loaders[name].num_sequences
        raise TrainingError(
            f"source {name!r} ({s.tokens}: {n:,} sequences of {self.seq_len} tokens) would be read "
            f"{index / n:.2f} times: {when} {index:,} of its sequences, past its max_epochs = {s.max_epochs}",
            f"raise max_epochs of source {name!r}, lower its weight, add tokens to it, or lower train.steps",
        )

    # -- reading -------------------------------------------------------------------------------

    def global_indices(self, start: int, count: int) -> list[tuple[str, int]]:
        """(source, sequence index in its folder) at global positions [start, start + count)."""
        out = []
        for p in range(start, start + count):
            name, j = self.mixture.locate(p)
            loader = self.loaders.get(name)
            if loader is None:
                raise ConfigError(
                    f"the mixture reads source {name!r} at position {p}, which train.sources does not list",
                    f"list source {name!r} again, or give it weight 0 in a phase before",
                )
            s = self.sources[name]
            n = loader.num_sequences
            if s.max_epochs is not None and j >= s.max_epochs * n:
                self._too_many_epochs(name, j + 1, "the run has reached")
            epoch, offset = divmod(j, n)
            out.append((name, int(loader.order(epoch).permute(np.array([offset]))[0])))
        return out

    def _make_batch(self, picks: list[tuple[str, int]]) -> Batch:
        T = self.seq_len
        rows = np.empty((len(picks), T + 1), dtype=np.int64)
        for row, (name, i) in zip(rows, picks, strict=True):
            self.loaders[name]._window(i * T, row)
        for name, loader in self.loaders.items():
            mine = [k for k, (n, _) in enumerate(picks) if n == name]
            if mine and rows[mine].max() >= loader._vocab_limit:
                loader._name_bad_id([picks[k][1] for k in mine])
        inputs = torch.from_numpy(rows[:, :-1].copy())
        labels = torch.from_numpy(rows[:, 1:].copy())
        labels[labels == self.bos_id] = IGNORE_INDEX
        doc_ids = torch.cumsum(inputs == self.bos_id, dim=1, dtype=torch.int32) if self.doc_mask else None
        return Batch(inputs, labels, doc_ids)

    def next_batch(self) -> Batch:
        # the whole global batch, on every rank: a rank whose own slice stayed within max_epochs
        # must stop with the one that crossed it, not wait for it in the next collective
        self.check_budget(self.consumed + self.micro_batch * self.world_size, "the run has reached")
        mine = self.consumed + self.rank * self.micro_batch
        picks = self.global_indices(mine, self.micro_batch)
        self.consumed += self.micro_batch * self.world_size
        return self._make_batch(picks)

    # -- state ---------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "version": STATE_VERSION,
            "consumed_sequences": self.consumed,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "split": self.split,
            "data_fingerprint": self.data_fingerprint,
            "sources": {
                n: {
                    "data_fingerprint": loader.data_fingerprint,
                    "sequences": loader.num_sequences,
                    "order_key": self.keys[n],
                }
                for n, loader in self.loaders.items()
            },
            "phases": [ph.to_json() for ph in self.mixture.phases],
            "source_sequences": self.source_sequences(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue the recorded order; a changed mixture starts a new phase here (module doc)."""
        version = state.get("version")
        if version == 2:  # one token folder before mixtures: the one-source mixture of weight 1
            if len(self.loaders) != 1:
                raise ConfigError(
                    "the checkpoint's loader state is of a single token folder (before mixtures) and this "
                    f"run lists {len(self.loaders)} sources",
                    "resume with that one folder (train.tokens), then add sources in a later run",
                )
            (name,) = self.loaders
            state = {
                **state,
                "sources": {
                    name: {"data_fingerprint": state["data_fingerprint"], "order_key": state["seed"]}
                },
                "phases": [{"start": 0, "weights": [[name, "1"]], "why": "config"}],
            }
            # the loader's own version-2 checks (fingerprint, seq_len, seed, split)
            self.loaders[name].load_state_dict({**state, "version": 2})
        elif version == 1:  # the stored permutation: TokenLoader's refusal says what to do
            next(iter(self.loaders.values())).load_state_dict(state)
        elif version != STATE_VERSION:
            raise ConfigError(
                f"loader state version {version} is not {STATE_VERSION} (nor the single-folder version 2)",
                "resume with the oreline version that wrote it",
            )
        for key in ("seq_len", "seed", "split"):
            if state[key] != getattr(self, key):
                raise ConfigError(
                    f"loader state has {key}={state[key]!r}, this loader {key}={getattr(self, key)!r}",
                    f"resume with the same {key} (or pass --allow-config-change and start a new data order)",
                )
        for name, rec in state["sources"].items():
            loader = self.loaders.get(name)
            if loader is None:
                continue  # a source left out: it stops where it was
            if rec["data_fingerprint"] != loader.data_fingerprint:
                raise FingerprintMismatch(
                    f"source {name!r} was token data {rec['data_fingerprint'][:12]}… in the checkpoint, "
                    f"{loader.dir} holds {loader.data_fingerprint[:12]}…",
                    "resume with the token folder the run started with, or give the new folder another source name",
                )
            if rec["order_key"] != self.keys[name]:  # the run's first source keeps the seed alone as its key
                self.keys[name] = rec["order_key"]
                loader.seed = rec["order_key"]
                loader._order, loader._order_epoch = None, -1
        for name in self.loaders:
            if name not in state["sources"] and self.keys[name] == self.seed:
                self.keys[name] = order_key(self.seed, name, False)  # new to the run: never the first's key
                self.loaders[name].seed = self.keys[name]  # type: ignore[assignment]
                self.loaders[name]._order, self.loaders[name]._order_epoch = None, -1
        consumed = int(state["consumed_sequences"])
        recorded = [Phase.from_json(p) for p in state["phases"]]
        history = [p for p in recorded if p.start <= consumed]
        wanted = Mixture(self._config_phases)._phase_at(consumed)
        phases = list(history)
        self.new_phase = None
        if history[-1].normalised() != wanted.normalised():
            self.new_phase = Phase(consumed, wanted.weights, why="resume")
            if history[-1].start == consumed:
                phases[-1] = self.new_phase  # nothing of it was read yet
            else:
                phases.append(self.new_phase)
        phases += [p for p in self._config_phases if p.start > consumed]
        self.mixture = Mixture(phases)
        self.consumed = consumed
