"""Exact, faster encoding for oreline's own tokenizers: pre-tokenize in Python, memoize BPE per piece.

HF `tokenizers` encodes a text in two stages: a pre-tokenizer cuts it into pieces, then the BPE
model turns each piece into ids, independently of its neighbours. Natural text repeats a small
set of pieces (words with their leading space), so after a warm-up almost every piece has been
seen before. This encoder keeps the second stage as HF's own code and replaces the first:

1. Pre-tokenize with one C-level call: `regex.findall` with the GPT-2 pattern (byte_level), or
   `str.replace` + `str.split` on spaces (metaspace).
2. Look every piece up in a dict `piece -> tuple of ids`; a miss asks HF's model for that one
   piece (`Tokenizer.model.tokenize`, after the byte-to-unicode mapping for byte_level). The merge
   rules, byte fallback, unknown handling are therefore HF's by construction.
3. Concatenate with `itertools.chain.from_iterable(map(cache.__getitem__, pieces))`: no
   Python-level loop per piece.

Why the ids are identical to HF's (`encode(text, add_special_tokens=False)`):

- byte_level: HF's ByteLevel(add_prefix_space=False, use_regex=True) splits with the same GPT-2
  pattern under Oniguruma; the `regex` module implements the same backtracking semantics
  (leftmost alternative, `\\s+(?!\\S)`), so the pieces agree wherever both engines agree on
  `\\p{L}`, `\\p{N}` and `\\s`. They disagree only on code points assigned after Oniguruma's
  Unicode version (15.1 in tokenizers 0.2x, `regex` is at 16-17): `regex` calls them letters or
  digits, Oniguruma unassigned. Those are listed in ONIG_UNASSIGNED; a piece containing one is
  never cached and the whole text goes to HF instead (it is rare: new scripts, CJK extension J).
  `unicode_tables_agree` re-checks that table once per process (a different `regex` or
  `tokenizers` version shows up there, and the fast path turns off with a warning), and
  tests/tokens/test_fast_encode.py checks every code point against HF.
- metaspace: HF's normalizer Prepend("▁") puts "▁" before a non-empty text, Metaspace(split=True,
  prepend_scheme="never") replaces " " (U+0020 only) with "▁" and splits before every "▁" (merged
  with the next piece). Splitting the replaced text on "▁" gives exactly the text after each
  "▁", so the pieces are "▁" + word, and the cache is keyed by the word.
- Special tokens are never matched in text (encode_special_tokens=True), and the supported
  configurations have no post-processor, so nothing else happens between the two stages.

Anything else (another normalizer or pre-tokenizer, a non-special added token, BPE dropout, a
continuing-subword prefix, ...) is not covered: `fast_encoder` returns None with the reason and
the caller uses HF. Lone surrogates raise UnicodeEncodeError here as they raise in HF, so a
document the tokenizer cannot take is still rejected by the caller.
"""

from __future__ import annotations

import array
import functools
import logging
import warnings
from itertools import chain

import regex

log = logging.getLogger(__name__)

# The pattern HF's ByteLevel pre-tokenizer uses with use_regex=True (tokenizers/src/pre_tokenizers/byte_level.rs).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# Code points `regex` (Unicode 17) puts in \p{L} or \p{N} while Oniguruma (Unicode 15.1) leaves them
# unassigned, i.e. neither letter, digit nor space. Found by probing both engines over every code
# point (test_onig_unassigned_table_is_exact regenerates it); hex ranges, inclusive.
ONIG_UNASSIGNED = (
    "558 58B-58C 88F C5C CDC 208F 209D-209F A7CE-A7CF A7D2 A7D4 A7DD A7E2 A7F1 AB6C-AB6D 107BB-107BF "
    "10940-10959 10EC5-10EC7 10ED9-10EEE 11B0A 11DB0-11DDB 11DE0-11DE9 11DF1 1246F 12475-1247F "
    "12550-12686 16EA0-16EB8 16EBB-16ED3 16FF2-16FF6 187F8-187FF 18CD6-18CDA 18D09-18D20 18D80-18DF2 "
    "18E00-19191 191A0-191D2 1B123-1B128 1B168 1D6A6 1DF1F-1DF24 1DF2B-1DF81 1DF90-1DF96 1DFCD-1DFFF "
    "1E6C0-1E6DE 1E6E0-1E6E2 1E6E4-1E6E5 1E6E7-1E6ED 1E6F0-1E6F4 1E6FE-1E6FF 2B73A-2B73F 2B81E "
    "2CEA2-2CEAD 323B0-33479 3D000-3FC3F"
)
# Letters + digits + spaces according to Oniguruma when the table was made (141,028 + 1,911 + 25).
ONIG_LNS_COUNT = 142_964

CACHE_LIMIT = 1 << 20  # pieces; ~150 MB at most. Cleared when full: simple, and the hot set refills fast.

# Checked at load, through both paths. Covers every branch of the GPT-2 pattern (contractions in
# both cases, letters/digits/other with and without a leading space, whitespace runs before text
# and at the end), the spaces that are not U+0020, several scripts, emoji sequences, literal
# special-token text, and one code point of ONIG_UNASSIGNED (the route back to HF).
SELF_CHECK = (
    "Hello, World! It's 12:30 -- IT'S we'll they've I'd you're 'll 'S 'T "
    "naïve café Straße ½ ¾ ² ∑∫√ 中文字符，测试。日本語のテキスト 한국어 Русский текст ελληνικά "
    "العربية עברית हिन्दी ไทย 😀🎉👩‍👩‍👧 <s> </s> <pad> <unk> ▁ ▁▁x "
    "\ttab\t\ttabs\n\nnewlines  double   triple\r\n\u00a0nbsp\u3000ideographic\u0085nel\u2028 "
    "x\u0558y 1234567890 3.14159 a1b2 __init__ ...!!! ??? #hash @user http://e.x/a?b=c  \n  end  "
)


class _Reroute(Exception):
    """A piece holds a code point the two regex engines classify differently: encode the text with HF."""


def _ranges(table: str) -> list[tuple[int, int]]:
    return [(int(lo, 16), int(hi or lo, 16)) for lo, _, hi in (part.partition("-") for part in table.split())]


def _code_points(table: str) -> list[int]:
    return [c for lo, hi in _ranges(table) for c in range(lo, hi + 1)]


def _char_class(table: str) -> str:
    return "[" + "".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in _ranges(table)) + "]"


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte → printable character table (the ByteLevel alphabet of tokenizers)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table, shift = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:  # control bytes, space, NBSP, soft hyphen move to 256+
            table[b] = chr(256 + shift)
            shift += 1
    return [table[b] for b in range(256)]


BYTE_TO_UNICODE = _bytes_to_unicode()
# bytes → characters as one str.translate over the piece's UTF-8 read as Latin-1 (one char per byte).
_BYTE_TRANSLATE = str.maketrans({chr(b): c for b, c in enumerate(BYTE_TO_UNICODE)})


@functools.cache
def unicode_tables_agree() -> str | None:
    """None when ONIG_UNASSIGNED still describes how `regex` and Oniguruma differ, else why not.

    Two cheap checks (~0.1 s, once per process): `regex`'s letters+digits+spaces minus the table
    must be as many as Oniguruma's were (a newer `regex` Unicode adds some), and Oniguruma must
    still leave the table's code points unassigned (a newer `tokenizers` would assign them).
    """
    from tokenizers import Regex, pre_tokenizers

    cps = array.array("I", range(0x110000))
    del cps[0xD800:0xE000]  # surrogates are not text
    every = cps.tobytes().decode("utf-32-le")
    unassigned = _code_points(ONIG_UNASSIGNED)
    lns = regex.sub(r"[^\p{L}\p{N}\s]+", "", every)
    count = len(lns) - sum(1 for c in unassigned if regex.match(r"[\p{L}\p{N}\s]", chr(c)))
    if count != ONIG_LNS_COUNT:
        return (
            f"the regex module (version {regex.__version__}) has {count} letters/digits/spaces outside "
            f"ONIG_UNASSIGNED, Oniguruma had {ONIG_LNS_COUNT}: regenerate the table"
        )
    probe = "".join(map(chr, unassigned))
    kept = "".join(
        p for p, _ in pre_tokenizers.Split(Regex(r"[\p{L}\p{N}\s]"), "removed").pre_tokenize_str(probe)
    )
    if kept != probe:
        return "Oniguruma (in tokenizers) now assigns code points of ONIG_UNASSIGNED: regenerate the table"
    return None


class _PieceIds(dict):
    """piece -> tuple of ids, filled on demand by HF's model (the C-level dict lookup is the hot path)."""

    __slots__ = ("to_ids",)

    def __init__(self, to_ids):
        super().__init__()
        self.to_ids = to_ids

    def __missing__(self, piece: str) -> tuple[int, ...]:
        ids = self.to_ids(piece)
        if len(self) >= CACHE_LIMIT:
            self.clear()
        self[piece] = ids
        return ids


class FastEncoder:
    """encode / encode_batch with HF's ids, for the two pre-tokenizations oreline trains."""

    def __init__(self, hf, kind: str):
        self.hf = hf
        self.kind = kind
        tokenize = hf.model.tokenize
        if kind == "byte_level":
            unassigned = regex.compile(_char_class(ONIG_UNASSIGNED))

            def to_ids(piece: str) -> tuple[int, ...]:
                if unassigned.search(piece):  # never cached, so every text containing it reroutes
                    raise _Reroute
                # .encode raises on lone surrogates, as HF does.
                return tuple(
                    t.id for t in tokenize(piece.encode("utf-8").decode("latin-1").translate(_BYTE_TRANSLATE))
                )

            self._split = regex.compile(GPT2_PATTERN).findall
        elif kind == "metaspace":

            def to_ids(word: str) -> tuple[int, ...]:
                word.encode("utf-8")  # raise on lone surrogates like HF (tokenize would too; be explicit)
                return tuple(t.id for t in tokenize("▁" + word))

            self._split = None
        else:
            raise ValueError(f"unsupported pre-tokenization {kind!r}")
        self.cache = _PieceIds(to_ids)
        self._lookup = self.cache.__getitem__

    def encode(self, text: str) -> list[int]:
        if self.kind == "metaspace":
            if not text:  # Prepend leaves an empty text empty
                return []
            return list(chain.from_iterable(map(self._lookup, text.replace(" ", "▁").split("▁"))))
        try:
            return list(chain.from_iterable(map(self._lookup, self._split(text))))
        except _Reroute:
            return self.hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return list(map(self.encode, texts))


def unsupported_reason(config: dict, hf) -> str | None:
    """Why the fast path does not cover this tokenizer.json (parsed), or None when it does."""
    model = config.get("model") or {}
    if model.get("type") != "BPE":
        return f"model {model.get('type')!r} is not BPE"
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            return f"BPE {key}={model[key]!r}"
    for key in ("truncation", "padding", "post_processor"):
        if config.get(key) is not None:
            return f"{key} is set"
    added = [t["content"] for t in config.get("added_tokens", []) if not t.get("special")]
    if added:
        return f"non-special added tokens {added[:3]} are matched in text"
    if config.get("added_tokens") and not getattr(hf, "encode_special_tokens", False):
        return "special tokens are matched in text (encode_special_tokens is off)"
    return (
        None
        if _kind(config)
        else (
            f"normalizer {config.get('normalizer')} with pre-tokenizer "
            f"{config.get('pre_tokenizer')} is not one oreline trains"
        )
    )


def _kind(config: dict) -> str | None:
    norm, pre = config.get("normalizer"), config.get("pre_tokenizer") or {}
    byte_level = {k: v for k, v in pre.items() if k != "trim_offsets"}  # trim_offsets only changes offsets
    if norm is None and byte_level == {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}:
        return "byte_level"
    if norm == {"type": "Prepend", "prepend": "▁"} and pre == {
        "type": "Metaspace",
        "replacement": "▁",
        "prepend_scheme": "never",
        "split": True,
    }:
        return "metaspace"
    return None


def self_check(fast: FastEncoder, hf) -> str | None:
    """Compare both paths on SELF_CHECK and a few cuts of it; None when identical, else the first difference."""
    texts = [SELF_CHECK, SELF_CHECK[:40], SELF_CHECK[-40:], " ", "", "a", "  a", "x\n"]
    want = [e.ids for e in hf.encode_batch_fast(texts, add_special_tokens=False)]
    got = fast.encode_batch(texts)
    for text, a, b in zip(texts, want, got, strict=True):
        if a != b:
            return f"on {text[:60]!r}: HF {a[:12]}..., fast {b[:12]}..."
    return None


def fast_encoder(hf, config: dict) -> FastEncoder | None:
    """A checked FastEncoder for this tokenizer, or None (with the reason logged) when HF must encode."""
    reason = unsupported_reason(config, hf)
    if reason is not None:
        log.info("fast encoder not used: %s; encoding with tokenizers' encode_batch_fast", reason)
        return None
    kind = _kind(config)
    if kind == "byte_level":
        reason = unicode_tables_agree()
    if reason is None:
        fast = FastEncoder(hf, kind)
        reason = self_check(fast, hf)
    if reason is not None:
        msg = f"oreline fast encoder disagrees with tokenizers ({reason}); falling back to tokenizers' encode_batch_fast"
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
        log.warning(msg)
        return None
    return fast
