"""Boilerplate elements skipped by main-content extraction: CSS selectors chosen on data.

resiliparse's main-content pass keeps almost all of an article (recall 0.989 on the extraction
benchmark's dev half) but also blocks around and inside it that no article body holds: photo
captions and credits, the article header (headline, byline, date), pop-ups, print and share
widgets. Those blocks are marked in the HTML by their tag or class names, so the default
extractor ("pruned", `oreline.data.filters.extract`) has resiliparse skip the elements matched by
a few CSS selectors (`skip_elements`, matched in C during the extraction itself).

Which selectors: `fit_selectors` picks them from `CANDIDATES` (generic class and tag names of
web boilerplate, not names seen on any one site) by greedy forward selection on the token F1
of a set of pages: add the candidate that raises the F1 most, stop when none raises it by
`min_gain`. `scripts/train_extract_model.py` runs it on the benchmark's dev half and writes
`boilerplate_selectors.json` next to this module; `benchmarks/extraction_quality.py` runs it
inside k-fold cross-validation, so the F1 it reports is on pages the choice never saw. The
file's sha256 is part of the data fingerprint: a retrained choice makes another data run.

Tried and measured worse (dev half, 5-fold CV by host): a logistic-regression line classifier
over resiliparse's output lines (length, final punctuation, link density, capitalisation,
position, boilerplate words): CV F1 0.952-0.960 against 0.960 without it, and 2.4 ms per page
in Python, more than the extraction itself.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from functools import cache, lru_cache
from pathlib import Path

SELECTORS_PATH = Path(__file__).with_name("boilerplate_selectors.json")
TOKEN = re.compile(r"\w+")  # the benchmark's token definition (lowercased)

# Generic names of boilerplate blocks: tags, and `class:NAME` (see `css_of`). Which of them are
# used is decided by `fit_selectors`, not here.
CANDIDATES = (
    "header",
    "footer",
    "nav",
    "aside",
    "figure",
    "figcaption",
    "form",
    "h1",
    "time",
    "button",
    "blockquote",
    "class:caption",
    "class:credit",
    "class:share",
    "class:social",
    "class:related",
    "class:byline",
    "class:author",
    "class:bio",
    "class:contributor",
    "class:newsletter",
    "class:subscribe",
    "class:signup",
    "class:login",
    "class:promo",
    "class:advert",
    "class:ads",
    "class:sponsor",
    "class:sidebar",
    "class:meta",
    "class:breadcrumb",
    "class:cookie",
    "class:consent",
    "class:popup",
    "class:modal",
    "class:overlay",
    "class:date",
    "class:time",
    "class:published",
    "class:updated",
    "class:widget",
    "class:banner",
    "class:footer",
    "class:header",
    "class:nav",
    "class:menu",
    "class:toolbar",
    "class:photo",
    "class:image",
    "class:gallery",
    "class:slide",
    "class:carousel",
    "class:thumb",
    "class:video",
    "class:embed",
    "class:more",
    "class:read",
    "class:hidden",
    "class:hide",
    "class:sr-only",
    "class:screen-reader",
    "class:visually-hidden",
    "class:print",
    "class:email",
    "class:tags",
    "class:tag",
    "class:category",
    "class:kicker",
    "class:label",
    "class:comment",
    "class:title",
    "class:headline",
    "class:quote",
    "class:twitter",
    "class:facebook",
    "class:recirc",
    "class:trending",
    "class:popular",
    "class:most",
    "class:disclaimer",
    "class:copyright",
    "class:legal",
    "class:notice",
    "class:alert",
    "class:cta",
    "class:btn",
    "class:icon",
    "class:rating",
    "class:toc",
    "class:source",
    "[aria-hidden=true]",
    "[role=complementary]",
)


def css_of(selector: str) -> str:
    """The CSS selector of a candidate: `class:NAME` matches elements with a class *token* that is
    NAME or ends in -NAME or _NAME (`caption`, `wp-caption`, `image_caption`), never a substring
    elsewhere in a token: `[class*=author]` matched `entry-author-jane` (a TypePad post wrapper)
    and `[class*=caption]` `caption-image` wrappers, deleting whole articles. The head of a
    class name is its last part (`image-caption` is a caption, `caption-image` an image). The
    leading `[class*=NAME]` only makes it cheap: most elements fail that one test, and the token
    tests run on the rest (the five tests on every element cost 20% of the extraction's time).
    Other selectors are CSS as they stand."""
    if not selector.startswith("class:"):
        return selector
    n = selector.removeprefix("class:")
    return (
        f'[class*="{n}"]:is([class~="{n}"], [class$="-{n}"], [class*="-{n} "], '
        f'[class$="_{n}"], [class*="_{n} "])'
    )


@lru_cache(maxsize=64)
def skip_elements(selectors: tuple[str, ...]) -> list[str] | None:
    """`selectors` (candidates' grammar: `class:NAME` or CSS) as resiliparse's `skip_elements`:
    the CSS ones as they stand, then the `class:NAME` ones grouped into one `[class]:is(…)` of
    their `css_of` selectors. The same elements, but an element without a class attribute fails
    one test instead of one per name (the default's main-content pass ~0.1-0.2 ms a page faster
    on the four development benchmarks, the same text on all 1,912 of their pages). A single
    `class:NAME` is left as its own selector, in its place; None for no selectors."""
    names = [s for s in selectors if s.startswith("class:")]
    if len(names) < 2:
        return [css_of(s) for s in selectors] or None
    return [
        *(s for s in selectors if not s.startswith("class:")),
        f"[class]:is({', '.join(css_of(s) for s in names)})",
    ]


# Selectors of headlines, bylines and captions: skipped by the default ("pruned"), kept by
# "pruned_headlines". Article-body gold (Scrapinghub) leaves them out, Dragnet's gold keeps them.
HEADLINE_SELECTORS = frozenset(
    {
        "h1",
        "header",
        "class:header",
        "class:title",
        "class:headline",
        "class:caption",
        "figcaption",
        "class:author",
        "class:byline",
    }
)

# Skipped always, not learned: widgets no article holds, named by the blog platforms that emit
# them (WordPress/Jetpack "N bloggers like this", share and related-post blocks, the comment
# form). They sit inside the post's container, so the main-content pass keeps them.
ALWAYS_SKIP = (".sharedaddy, #jp-post-flair, .jp-relatedposts, #respond, .comment-respond, #comment-form",)


@cache
def load_selectors(path: str | None = None, keep_headlines: bool = False) -> tuple[str, ...]:
    """The shipped selectors (candidates' grammar, `skip_elements` makes them CSS for resiliparse);
    keep_headlines leaves HEADLINE_SELECTORS out."""
    data = json.loads((Path(path) if path else SELECTORS_PATH).read_text(encoding="utf-8"))
    return tuple(s for s in data["selectors"] if not (keep_headlines and s in HEADLINE_SELECTORS))


def selectors_sha256(path: Path = SELECTORS_PATH) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tokens(text: str) -> Counter:
    return Counter(TOKEN.findall(text.lower()))


def f1_of(counts: Sequence[tuple[int, int, int]]) -> float:
    """Micro-averaged token F1 from (matched, predicted, true) token counts per page."""
    tp = sum(c[0] for c in counts)
    pred = sum(c[1] for c in counts)
    true = sum(c[2] for c in counts)
    if not tp:
        return 0.0
    precision, recall = tp / pred, tp / true
    return 2 * precision * recall / (precision + recall)


def fit_selectors(
    pages: Sequence[tuple[str, str]],
    text_of: Callable[[str, Sequence[str]], str],
    candidates: Sequence[str] = CANDIDATES,
    min_gain: float = 0.0005,
    max_selectors: int = 12,
    cache: dict | None = None,
) -> tuple[list[str], float]:
    """Greedy forward selection of `candidates` on (html, true article body) pages.

    `text_of(html, selectors)` is the extraction being tuned (the default extractor with those
    selectors, given as candidates are: `class:NAME` or CSS). Returns the chosen selectors and
    their token F1 on `pages`. A page's text only depends on the chosen selectors that match
    something on it, so each page is extracted once per distinct such subset (cached): most
    candidates match nothing on most pages. Pass the same `cache` dict to several calls on
    overlapping pages (cross-validation folds) to share those extractions.
    """
    from resiliparse.parse.html import HTMLTree

    cache = {} if cache is None else cache  # (html, truth, selectors used) -> token counts
    matches = []
    for html, _ in pages:
        if ("matches", html) not in cache:
            doc = HTMLTree.parse(html).document
            cache["matches", html] = frozenset(
                c
                for c in CANDIDATES + tuple(candidates)
                if doc is not None and doc.query_selector(css_of(c)) is not None
            )
        matches.append(cache["matches", html] & frozenset(candidates))

    def page_counts(i: int, chosen: list[str]) -> tuple[int, int, int]:
        html, truth = pages[i]
        used = tuple(sorted(c for c in chosen if c in matches[i]))
        key = (html, truth, used)
        if key not in cache:
            pred, true = tokens(text_of(html, list(used))), tokens(truth)
            cache[key] = (sum((pred & true).values()), sum(pred.values()), sum(true.values()))
        return cache[key]

    chosen: list[str] = []
    best = f1_of([page_counts(i, chosen) for i in range(len(pages))])
    # Candidates that match nothing, or that lower the F1 on their own, are not tried again: it
    # makes the search a few times faster at the cost of combinations no single part of which helps.
    pool = [c for c in candidates if any(c in m for m in matches)]
    while len(chosen) < max_selectors and pool:
        gains = []
        for cand in pool:
            gains.append((f1_of([page_counts(i, chosen + [cand]) for i in range(len(pages))]), cand))
        if not chosen:
            pool = [c for f1, c in gains if f1 > best]
        f1, cand = max(gains)
        if f1 < best + min_gain:
            break
        chosen.append(cand)
        pool = [c for c in pool if c != cand]
        best = f1
    return chosen, best


# Labels of the blocks that follow an article — share prompts, related-article and teaser lists,
# newsletter and rating boxes, comment sections — in the major European languages (English,
# German, French, Spanish, Italian, Portuguese, Dutch, Polish, Swedish, Danish, Norwegian,
# Czech). The element-level pruning removes such a block by its class name where it has a
# generic English one; where it has none, its heading (often all that survives of it) ends the
# text. Matched whole, as a line, lowercased, a trailing colon or ellipsis ignored: "Teilen" or
# "Mehr zum Thema" alone on the last line is a label, never a sentence of the article.
TRAILING_LABELS = frozenset(
    """
share|share this|share this article|share this post|share this story|share this page|share on facebook|
share on twitter|tweet|related|related articles|related posts|related stories|related content|
related news|more on this topic|more on this story|more from|read more|read next|read also|see also|
you may also like|you might also like|recommended|recommended for you|more stories|more articles|
popular|most read|most popular|trending|subscribe|subscribe now|subscribe to our newsletter|
sign up for our newsletter|newsletter|tags|topics|comments|leave a comment|leave a reply|
post a comment|rate this|rate this article|print|email|advertisement|follow us|about the author|
teilen|diesen artikel teilen|artikel teilen|seite teilen|mehr zum thema|das könnte sie auch interessieren|
das könnte dich auch interessieren|ähnliche artikel|verwandte artikel|weitere artikel|weitere themen|
weiterlesen|mehr lesen|newsletter abonnieren|jetzt abonnieren|kommentare|kommentar schreiben|
schlagworte|anzeige|werbung|drucken|bewerten|artikel bewerten|folgen sie uns|meistgelesen|
partager|partager cet article|partager sur facebook|à lire aussi|a lire aussi|lire aussi|voir aussi|
sur le même sujet|sur le meme sujet|articles similaires|articles liés|vous aimerez aussi|
vous aimerez aussi lire|lire la suite|s'abonner|abonnez-vous|inscrivez-vous à notre newsletter|
commentaires|laisser un commentaire|publicité|imprimer|noter cet article|suivez-nous|les plus lus|
compartir|comparte|compartir en facebook|artículos relacionados|noticias relacionadas|relacionados|
te puede interesar|también te puede interesar|leer más|lee también|suscríbete|suscribirse|
comentarios|deja un comentario|publicidad|síguenos|lo más leído|
condividi|condividi su facebook|articoli correlati|correlati|potrebbe interessarti|leggi anche|
leggi tutto|iscriviti|iscriviti alla newsletter|commenti|lascia un commento|pubblicità|stampa|
seguici|i più letti|
compartilhar|partilhar|artigos relacionados|notícias relacionadas|leia também|leia mais|veja também|
você também pode gostar|assine|inscreva-se|comentários|deixe um comentário|publicidade|siga-nos|
mais lidas|
delen|deel dit artikel|gerelateerde artikelen|gerelateerd|lees ook|lees meer|meer over dit onderwerp|
abonneren|schrijf je in|reacties|laat een reactie achter|advertentie|printen|volg ons|meest gelezen|
udostępnij|podziel się|powiązane artykuły|zobacz też|zobacz także|czytaj także|czytaj więcej|
przeczytaj również|subskrybuj|zapisz się|komentarze|dodaj komentarz|reklama|drukuj|obserwuj nas|
najczęściej czytane|
dela|relaterade artiklar|läs också|läs mer|prenumerera|kommentarer|annons|skriv ut|
del|relaterte artikler|les også|les mer|abonner|annonse|
relaterede artikler|læs også|læs mere|annonce|
sdílet|související články|mohlo by vás zajímat|čtěte také|komentáře|tisk
""".replace("\n", "").split("|")
)
# A label line is at most this long; longer lines are text, whatever they say.
TRAILING_LABEL_MAX_CHARS = 60
# What may follow the label and go with it: up to TEASER_LINES short lines (teaser titles, list
# items, button texts: at most TEASER_LINE_CHARS, none ending a sentence). A line of running
# text ends the search, so a label inside the article is never a cut.
TEASER_LINES = 12
TEASER_LINE_CHARS = 150
_LABEL_END = " \t:：….»›>|-–—"
_SENTENCE_END = (".", "!", "?", '."', ".”", "?”", "!”", ".»")


def _label_key(line: str) -> str:
    return line.strip().lstrip("•*#-–0123456789. \t").rstrip(_LABEL_END).strip().lower()


# Labels after which a page holds no more of the article, whatever follows: the comment
# section and the author box. A line that is one of them, in the last TERMINAL_SHARE of the
# text's characters, ends the text there (the comment form's or the blog's "About" box's
# paragraphs are long, so the teaser rule above would not reach their label).
TERMINAL_LABELS = frozenset(
    """
comments|add a comment|leave a comment|leave a reply|post a comment|about the author|
kommentare|kommentar schreiben|kommentar hinzufügen|über den autor|commentaires|
laisser un commentaire|ajouter un commentaire|à propos de l'auteur|comentarios|deja un comentario|
sobre el autor|commenti|lascia un commento|aggiungi un commento|l'autore|comentários|
deixe um comentário|sobre o autor|reacties|laat een reactie achter|over de auteur|komentarze|
dodaj komentarz|o autorze|kommentarer|skriv en kommentar|om forfattaren|komentáře|o autorovi
""".replace("\n", "").split("|")
)
TERMINAL_SHARE = 0.3


def drop_trailing_labels(text: str) -> str:
    """The text less a trailing block that a TRAILING_LABELS line heads: what is left of a share,
    teaser, newsletter or comment block after the article (its label, and the short lines under
    it: see TEASER_LINES). The text unchanged when its tail holds no label."""
    text = _drop_after_terminal_label(text)
    lines = text.rstrip().rsplit("\n", 4 * TEASER_LINES)  # the tail only: empty lines between
    k, seen, cut = len(lines), 0, None
    while k > 0 and seen <= TEASER_LINES:
        line = lines[k - 1].strip()
        k -= 1
        if not line:
            continue
        if len(line) <= TRAILING_LABEL_MAX_CHARS and _label_key(line) in TRAILING_LABELS:
            cut = k
        elif len(line) > TEASER_LINE_CHARS or line.endswith(_SENTENCE_END):
            break
        seen += 1
    kept = "\n".join(lines[:cut]).rstrip() if cut is not None else ""
    return kept if kept.strip() else text  # a page that is all label keeps it: never empty


def _drop_after_terminal_label(text: str) -> str:
    """The text up to its last TERMINAL_LABELS line in its last TERMINAL_SHARE (none: unchanged)."""
    start = int(len(text) * (1 - TERMINAL_SHARE))
    pos, cut = len(text), None
    while (nl := text.rfind("\n", start, pos)) >= 0:
        end = text.find("\n", nl + 1)
        line = text[nl + 1 : end if end >= 0 else len(text)]
        if len(line) <= TRAILING_LABEL_MAX_CHARS and _label_key(line) in TERMINAL_LABELS:
            cut = nl  # the earliest such label in the window counts
        pos = nl
    kept = text[:cut].rstrip() if cut is not None else ""
    return kept if kept.strip() else text
