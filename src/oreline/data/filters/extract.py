"""HTML to plain text: resiliparse with learned boilerplate pruning by default, resiliparse alone,
trafilatura or html2text on request.

Extractors (`EXTRACTORS`); each returns (text, path), the path naming the way the page went:
- "pruned" (the default, "default" is an alias): resiliparse's main content as below, skipping
  the elements matched by the shipped boilerplate selectors (captions, the article header with
  headline and byline, pop-ups, print/share widgets: `oreline.data.filters.boilerplate`, chosen
  on the extraction benchmark's dev half by `scripts/train_extract_model.py`; `class:NAME`
  selectors match class tokens, see `boilerplate.css_of`), plus ALWAYS_SKIP (blog platform
  widgets, comment forms). Low-confidence main content (short against the page's visible text,
  or mostly a list) gets a second opinion, the page's text less navigation and furniture
  (LOW_CONFIDENCE_CHARS); an empty main content on a page with text falls back to the page.
  Then the page's article container, found by the generic names CMS templates give an
  article body (CONTAINER_TIERS: `entry-content`, `post-body`, `itemprop=articleBody`, …),
  replaces that text unless it is a fragment of it (CONTAINER_SHARE) or much shorter than it
  (CONTAINER_SHORT). Pages that are no article (issue 51): link-free `<ul>` kept as text
  (`keep_content_lists`), link lines dropped (`drop_link_lines`), `<noscript>` read where it
  holds the page (NOSCRIPT_GAIN), lead paragraphs of the article's `<header>` kept, and a
  trailing block headed by a share/teaser/newsletter label dropped
  (`boilerplate.drop_trailing_labels`, twelve European languages).
  Paths: "pruned", "pruned:unpruned" (MIN_PRUNED_CHARS), "pruned:too_deep" (depth guard),
  "pruned:second_opinion", "pruned:full_page", "pruned:container", "pruned:noscript".
  Measured per benchmark, beside trafilatura:
  `benchmarks/extraction_quality.py` (docs/design.md, "Text extraction"). Pruning costs
  little time: resiliparse matches `skip_elements` in C during the extraction.
- "pruned_headlines": the same, keeping headlines, bylines and captions (HEADLINE_SELECTORS
  are not skipped). Not the default: pretraining wants running prose, and a headline or a
  caption is a fragment that is repeated across teasers, feeds and galleries of the same site;
  Scrapinghub's gold leaves them out, Dragnet's keeps them (this one scores higher there).
- "resiliparse": `resiliparse.extract.html2text.extract_plain_text` with `main_content=True`
  (Bevendorff et al. 2023, "An Empirical Comparison of Web Content Extraction Algorithms"):
  block-level formatting kept; alt texts, noscript, form fields, comment sections and post
  metadata (bylines, dates) dropped, which measured +0.037 F1 over the library defaults on the
  benchmark's dev half (F1 0.960 vs trafilatura's 0.973).
- "trafilatura": `trafilatura.extract` (Barbaresi 2021) – precise, and the slowest.
- "html2text": `html2text.HTML2Text` with `body_width=0` (no hard wrapping) and links/images off;
  Markdown-ish output of the whole page.
The optional extractors are imported on first use and fail with an install hint.

Script and style never reach the text: resiliparse and trafilatura skip them; html2text is
given the HTML with `<script>`, `<style>` and `<noscript>` elements removed first.

Pathological pages:
- resiliparse's main-content pass is quadratic in DOM depth (measured: 1,000 levels 17 ms, 5,000
  levels 0.44 s, 20,000 levels 24 s, 100,000 levels did not finish in 2 minutes) and runs in C,
  where no Python signal can interrupt it. So the page is parsed once (lexbor, C), a CSS
  selector asks whether any element has MAX_MAIN_CONTENT_DEPTH ancestors, and pages nested deeper
  fall back to the full-page extraction, which is linear (100,000 levels: 70 ms).
- Per-document time limit (`timeout_s`): `time_limit` arms `signal.setitimer(ITIMER_REAL)` and
  SIGALRM raises `ExtractTimeout` (a TimeoutError), which `steps.extract_text` turns into the drop
  reason "extract:timeout". Python-level extractors (trafilatura, html2text) are interrupted
  mid-way; a C extractor is interrupted when it returns, so the limit also drops pages that took
  too long. SIGALRM only exists in a process's main thread on POSIX: elsewhere (threads,
  Windows) the limit is measured after the call instead of enforced during it.
- The pipeline (`oreline.data.pipeline.steps.extract_text`) therefore runs the extractor in a killable child process
  (`oreline.data.filters.extract_worker`, `data.extract.isolate`, on by default), where `timeout_s`
  holds inside C code too and memory is capped at `data.extract.max_memory_mb`: a 48 MB page of
  `<p>x` took 36.8 s and 7.0 GB with timeout_s=5 in-process; isolated it is dropped as
  `extract:timeout` or `extract:too_large` within the limit. See that module for why no
  pre-check on bytes or tag counts could bound it.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from oreline.data.filters.boilerplate import ALWAYS_SKIP, drop_trailing_labels, load_selectors, skip_elements
from oreline.errors import ConfigError

MAX_MAIN_CONTENT_DEPTH = 1500
# "* > * > … > *" matches an element with at least MAX_MAIN_CONTENT_DEPTH ancestors. lexbor
# matches right to left, so on a normal page (depth ~30) each element fails after ~30 parent
# steps: the check costs ~0.7 ms per page in C, against ~5 ms for a tag scan in Python.
_DEEP_SELECTOR = " > ".join(["*"] * MAX_MAIN_CONTENT_DEPTH)
_DROP_FOR_HTML2TEXT = re.compile(r"<(script|style|noscript)\b[^>]*>.*?</\1\s*>", re.I | re.S)


class ExtractTimeout(TimeoutError):
    """Extraction of one document ran past `data.extract.timeout_s`."""


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise ExtractTimeout in the block after `seconds` (see the module docstring for where)."""
    if not seconds or seconds <= 0:
        yield
        return
    use_alarm = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    start = time.perf_counter()
    if use_alarm:

        def _on_alarm(signum, frame):
            raise ExtractTimeout(f"extraction took longer than {seconds:g} s")

        previous = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    if time.perf_counter() - start > seconds:
        raise ExtractTimeout(f"extraction took longer than {seconds:g} s")


def too_deep_for_main_content(tree) -> bool:
    """Whether a parsed resiliparse HTMLTree nests elements MAX_MAIN_CONTENT_DEPTH or more deep."""
    doc = tree.document
    if doc is None:
        return False
    # A chain of N nested elements needs N elements: counting them is one pass without the
    # ancestor walks of _DEEP_SELECTOR (measured on the demo's pages 0.17 vs 0.69 ms), and most
    # pages have fewer than MAX_MAIN_CONTENT_DEPTH elements (191 of 204 demo pages, 87 of 91 dev).
    if len(doc.query_selector_all("*")) < MAX_MAIN_CONTENT_DEPTH:
        return False
    return doc.query_selector(_DEEP_SELECTOR) is not None


def _resiliparse_text(
    tree, main_content: bool, skip: Sequence[str] = (), noscript: bool = False, links: bool = False
) -> str:
    """resiliparse's text of `tree`, skipping the elements of `skip` (boilerplate selectors:
    `class:NAME` or CSS, made resiliparse's list by `boilerplate.skip_elements`). Numbered list
    items are written with a bullet like the others: the number is no text of the page (the
    browser draws it), and `keep_content_lists` makes lists numbered ones."""
    from resiliparse.extract.html2text import extract_plain_text

    text = extract_plain_text(
        tree,
        preserve_formatting=True,
        main_content=main_content,
        alt_texts=False,
        links=links,
        form_fields=False,
        noscript=noscript,
        comments=False,
        post_meta=False,
        skip_elements=skip_elements(tuple(skip)),
    )
    text = _LIST_NUMBER.sub(r"\1• ", text) if "." in text else text
    return drop_link_lines(text) if links else text


# Link lines: resiliparse keeps a menu, a column of teaser titles or a "More..." link wherever
# no tag or class name marks it (table layouts, club and company templates), and the text alone
# cannot tell a teaser title from a headline. With links=True resiliparse writes each link's
# target after its text, "text (href)"; `mark_links` makes every href start with LINK_MARK
# first, so a written target is told from a "(AP)" of the text. A line that ends in a link and
# has at most LINK_LINE_WORDS words besides the targets is a link line, and goes; the targets
# are removed from the lines that stay. Same pass, no second one.
LINK_MARK = "\ue000"  # a private-use character: no page writes it in an href
LINK_LINE_WORDS = 15
LINK_LINES = True
_HREF = re.compile(r"""(<a\b[^>]*?\bhref\s*=\s*["']?)""", re.I)
_TARGET = re.compile(r" ?\(\ue000[^)\n]*\)")
_ENDS_IN_LINK = re.compile(r"\(\ue000[^)\n]*\)\W*$")


def mark_links(html: str) -> str:
    """The HTML with LINK_MARK at the start of every `<a href>` value."""
    return _HREF.sub(lambda m: m.group(1) + LINK_MARK, html) if "href" in html else html


def drop_link_lines(text: str) -> str:
    """The text less its link lines, and less the written targets of the links it keeps."""
    if LINK_MARK not in text:
        return _TARGET.sub("", text) if "(" in text else text
    out = []
    for line in text.split("\n"):
        if LINK_MARK in line:
            # Table cells share a line, "\t\t" apart: each cell is judged as a line.
            cells = [_TARGET.sub("", c) for c in line.split("\t\t") if not (LINK_LINES and _link_line(c))]
            if not cells:
                continue
            line = "\t\t".join(cells)
        out.append(line)
    return "\n".join(out)


def _link_line(line: str) -> bool:
    return bool(_ENDS_IN_LINK.search(line)) and len(_TARGET.sub("", line).split()) <= LINK_LINE_WORDS


# resiliparse writes a numbered list item as "  <n>. " at a line's start (nested: more spaces).
_LIST_NUMBER = re.compile(r"^( +)\d+\. ", re.M)
# Unordered lists without a link: resiliparse's main-content pass drops every `<ul>` (a menu is
# one), so an article lost its ingredient lists, summary bullets and FAQ items while their
# headings stayed. A list of no link is no menu: it becomes an `<ol>`, which that pass keeps and
# judges like any block. Rewritten in the HTML before the page's one parse, by string search
# (a few microseconds a list): moving a list's children in the parsed tree costs a Python
# object per node. Lists with a link anywhere inside (menus, teasers) stay `<ul>`.
_UL_TAG = re.compile(r"<(/?)ul\b", re.I)
_LINK_TAG = re.compile(r"<a\b", re.I)


def keep_content_lists(html: str) -> str:
    """The HTML with every `<ul>` that holds no `<a>` (nested lists included) written `<ol>`."""
    if "<ul" not in html and "<UL" not in html:
        return html
    opened: list[int] = []
    spans: list[tuple[int, int]] = []  # (start of "<ul", start of "</ul") of link-free lists
    for m in _UL_TAG.finditer(html):
        if not m.group(1):
            opened.append(m.start())
        elif opened:
            start = opened.pop()
            if not _LINK_TAG.search(html, start, m.start()):
                spans.append((start, m.start()))
    if not spans:
        return html
    cuts = sorted(i for start, end in spans for i in (start + 1, end + 2))  # the "u" of each tag
    pieces, last = [], 0
    for i in cuts:
        pieces += (html[last:i], "o")
        last = i + 1
    pieces.append(html[last:])
    return "".join(pieces)


def _resiliparse(html: str, main_content: bool) -> tuple[str, str]:
    from resiliparse.parse.html import HTMLTree

    tree = HTMLTree.parse(html)  # parsed once, shared by the depth check and the extraction
    if main_content and too_deep_for_main_content(tree):
        return _resiliparse_text(tree, False), "resiliparse:too_deep"
    return _resiliparse_text(tree, main_content), "resiliparse" if main_content else "resiliparse:full_page"


# Pruned text shorter than this is checked against the unpruned extraction, and the longer kept
# (path "pruned:unpruned"): a page may wrap all its content in an element a selector matches
# (`<header class="hero-header">` on commoncrawl.org).
MIN_PRUNED_CHARS = 200

# Low confidence, where the page gets a second opinion (`_page_text`), in two cheap tests on
# resiliparse's main content. (1) Short: under LOW_CONFIDENCE_CHARS and under
# LOW_CONFIDENCE_RATIO of the page's visible text (its full-page extraction), or empty while the
# page is not. (2) A list: over LIST_SHARE of its characters on list-item lines. On the Dragnet
# training split (issue 30) such pages were mostly a wrong block — a "subscribe" box, the post
# navigation, a list of teasers — or nothing at all, with the article elsewhere on the page.
# Chosen among a handful of round values on both dev sets (benchmarks/extraction_quality.py):
# Dragnet train per-page F1 0.80 -> 0.86 (~10% of its pages asked), Scrapinghub dev unchanged
# (none asked). Tried and dropped: trafilatura (fast=True) as the second opinion, 0.866 instead
# of 0.865 on Dragnet at half the default's speed (~12 ms a page asked, against ~1 ms).
LOW_CONFIDENCE_CHARS = 1000
LOW_CONFIDENCE_RATIO = 0.1
LIST_SHARE = 0.5
# The second opinion replaces a short main content only when over SECOND_OPINION_GAIN times
# longer: on a short article found right, the page's text adds the headline and furniture (a
# Scrapinghub dev page: F1 1.0 -> 0.77 at a factor of 1, kept at 3). A list is replaced by any
# text of over LIST_KEEP of its length.
SECOND_OPINION_GAIN = 3.0
LIST_KEEP = 0.3
# What the second opinion leaves out of the whole page: generic names of navigation and page
# furniture (not learned, not from any one site), and hidden elements: the full-page pass keeps
# them, and TypePad pages carry a `display:none` copy of the post for their comment widget, so
# the second opinion came out twice the article (Dragnet train per-page F1 0.8646 -> 0.8669,
# Scrapinghub dev, CleanEval and readability unchanged; a fixed rule, nothing tuned).
PAGE_SKIP = (
    "nav, footer, aside, form, select, ul, ol, table",
    *(
        f"class:{n}"
        for n in ("sidebar", "menu", "nav", "navigation", "footer", "comments", "comment", "widget")
    ),
    *(f"class:{n}" for n in ("related", "share", "social", "ads", "banner", "breadcrumbs")),
    "[id*=sidebar], [id*=footer], [id*=nav], [id*=menu], [id*=comment]",
    '[hidden], [style*="display:none"], [style*="display: none"]',
)


def _list_share(text: str) -> float:
    """Share of the text's characters on list-item lines (resiliparse writes items as "  • ")."""
    total = items = 0
    for line in text.splitlines():
        total += len(line)
        if line.lstrip().startswith("•"):
            items += len(line)
    return items / total if total else 0.0


def _page_text(tree, always: Sequence[str]) -> str:
    """The second opinion: the whole page's text less PAGE_SKIP (navigation, lists, tables,
    sidebars, footers, comments), one more C pass over the parsed tree (~1 ms)."""
    return _resiliparse_text(tree, False, [*always, *PAGE_SKIP])


# The article container, a third candidate beside the main content and the second opinion:
# generic class/id names that CMS templates give an article's body (WordPress `entry-content`,
# Blogger `post-body`, schema.org `itemprop=articleBody`, …), in tiers tried in order, the
# first element of the first tier whose text reaches CONTAINER_MIN_CHARS. The names are the kind
# trafilatura's BODY_XPATH lists (generic, from no one site of any benchmark); a CSS query is
# one C pass over the parsed tree. Why: on the Dragnet training split resiliparse's main
# content was either a plausible-length wrong block (a contributor list, an events box: the
# article elsewhere) or the article with teasers or a tour list around it, while the page
# marked its article body by such a name (`div.entry-content`, `div.post-body`). Cost: ~1-1.5 ms
# a page on Dragnet's pages (the tier queries ~0.45 ms, the container's own extraction ~0.8 ms,
# the word bags of `_prefer_container` ~0.2 ms on the pages that compare them, most decided by
# length alone), which takes oreline from ~10-12x to ~6-9x trafilatura's speed
# (docs/measurements.md, "The article container's cost").
_BODY_NAMES = (
    "post-text", "post_text", "post-body", "post-entry", "postentry", "post-content", "post_content",
    "postcontent", "postContent", "article-text", "articletext", "articleText", "entry-content",
    "article-content", "article__content", "article-body", "article__body", "articlebody",
    "articleBody", "ArticleBody", "ArticleContent", "page-content", "text-content", "body-text",
    "article__container", "art-content",
)  # fmt: skip
_STORY_NAMES = (
    "post-bodycopy", "storycontent", "story-content", "blog-content", "section-content",
    "single-content", "single-post", "story-body", "field-body", "fulltext",
)  # fmt: skip
_MAIN_NAMES = ("content-main", "content_main", "content-body", "contentBody", "content__body", "main-content")


def _any_attr(attr: str, names: Sequence[str]) -> str:
    return ", ".join(f'[{attr}*="{n}"]' for n in names)


def _blocks(condition: str) -> str:
    # One compound selector, the tag test first: it matches the same elements as one
    # `tag:is(condition)` per tag (the first in document order either way) and the five tier
    # queries cost ~20% less (a third on CleanEval; the four benchmarks' pages, same run).
    return f":is(article, div, main, section):is({condition})"


CONTAINER_TIERS = (
    _blocks(f"{_any_attr('class', _BODY_NAMES)}, {_any_attr('id', _BODY_NAMES)}, [itemprop=articleBody]"),
    "article",
    _blocks(
        f"{_any_attr('class', _STORY_NAMES)}, {_any_attr('id', ('story-body',))}, "
        "[id=article], [id=story], [class=story], [role=article]"
    ),
    _blocks(
        f"{_any_attr('class', _MAIN_NAMES)}, {_any_attr('id', _MAIN_NAMES)}, [id=content], [class=content]"
    ),
    # The post wrapper of blog themes (WordPress `post_class()` and the old `div.entry`), as class
    # tokens: a front page holds several, the first a fragment of the main content (kept then).
    "div.entry, div.post, div.entry-body, div.postbody, article.post",
)
CONTAINER_MIN_CHARS = 200
# The container replaces the main content unless it is a fragment of it: nearly all of its
# tokens in the main content (over CONTAINER_INSIDE) but under CONTAINER_SHARE of the main
# content's tokens (a lead paragraph, the first of several posts on a front page). A container
# holding a quarter or more of the main content is the article less what surrounded it (teasers,
# a tour list, comments); one mostly outside the main content means the main content was a
# wrong block. Round values; Dragnet train per-page F1 moved by under 0.001 between shares of
# 0.2 and 1/3, and the other three benchmarks not at all (docs/measurements.md).
CONTAINER_INSIDE = 0.5
CONTAINER_SHARE = 0.25
_FURNITURE = ("nav, footer, aside, form, select", *PAGE_SKIP[1:])


def _container_text(tree, skip: Sequence[str]) -> str | None:
    """Text of the page's article container (CONTAINER_TIERS), or None when there is none."""
    doc = tree.document
    if doc is None:
        return None
    for tier in CONTAINER_TIERS:
        node = doc.query_selector(tier)
        if node is None:
            continue
        text = _region_text(tree, node, True, skip)
        if len(text) < CONTAINER_MIN_CHARS:  # the main-content heuristics can empty a small block
            text = _region_text(tree, node, False, [*skip, *_FURNITURE])
        if len(text) >= CONTAINER_MIN_CHARS:
            return text
    return None


def _region_text(tree, node, main_content: bool, skip: Sequence[str]) -> str:
    """resiliparse's text of `node` and its subtree alone, from the subtree parsed on its own
    (~0.2 ms: resiliparse extracts from a whole tree). Tried and measured slower: the region
    taken from the page's own tree (the container and its ancestors marked, every other element
    skipped), 1.26 against 0.95 ms a page for the container step on 300 development pages, the
    same text on 254: resiliparse's main-content pass works over the whole tree whatever
    `skip_elements` leaves out, so the page's tree costs a whole-page pass where the subtree
    costs a parse of the container alone."""
    from resiliparse.parse.html import HTMLTree

    return _resiliparse_text(HTMLTree.parse(node.html), main_content, skip)


# A container of under CONTAINER_SHORT of the main content's words never replaces it, unless the
# main content is mostly links (over MAIN_LINK_SHARE of its words in the page's link texts): a
# teaser, newsletter or opt-in box that matched a container name is not the 5,000-character post
# beside it, though it "is no fragment" of it. Round values, not tuned.
CONTAINER_SHORT = 0.2
MAIN_LINK_SHARE = 0.5


def _mostly_links(text: str, tree) -> bool:
    """Whether over MAIN_LINK_SHARE of the text's words are link text: words the page's text
    without its links lacks (one more C pass, only on the pages that ask)."""
    if tree is None or tree.document is None:
        return False
    words = Counter(text.lower().split())
    unlinked = Counter(_resiliparse_text(tree, False, ("a",)).lower().split())
    total = sum(words.values())
    return total > 0 and sum((words & unlinked).values()) < (1 - MAIN_LINK_SHARE) * total


def _prefer_container(main: str, container: str, tree=None) -> bool:
    """Whether the container replaces the main content (CONTAINER_INSIDE, CONTAINER_SHARE), on
    bags of lowercased whitespace-separated words: both texts come from the same nodes by the
    same extraction, so a word keeps its punctuation in both, and splitting costs a third of the
    benchmark's `\\w+` tokens (~0.1 ms a page). A line test (each container line verbatim in the
    main content) was cheaper still but took teaser blocks that share a sentence with the
    article for a wrong main content (mozilla/readability's webmd-2 test page: F1 0.93 -> 0.09)."""
    main_words, container_words = main.lower().split(), container.lower().split()
    if len(container_words) < CONTAINER_SHORT * len(main_words) and not _mostly_links(main, tree):
        return False
    # A fragment needs CONTAINER_INSIDE * |c| <= shared < CONTAINER_SHARE * |m| with shared <= |c|:
    # a container that long is never one, decided without the bags.
    if CONTAINER_INSIDE * len(container_words) >= CONTAINER_SHARE * len(main_words):
        return True
    m, c = Counter(main_words), Counter(container_words)
    shared = sum((c & m).values())  # Counter.__and__ walks its left side: the smaller one
    return shared < CONTAINER_INSIDE * len(container_words) or shared >= CONTAINER_SHARE * len(main_words)


def pruned_text(html: str, selectors: Sequence[str], second_opinion: bool = True) -> tuple[str, str]:
    """(text, path) of the "pruned" extractor with the given boilerplate selectors (as
    `boilerplate.CANDIDATES` writes them: `class:NAME` or CSS).

    Paths beyond "pruned": "pruned:too_deep" (depth guard), "pruned:unpruned" (MIN_PRUNED_CHARS),
    "pruned:second_opinion" (low confidence, the page's text less PAGE_SKIP kept: see
    LOW_CONFIDENCE_CHARS), "pruned:full_page" (main content and second opinion empty, the
    page not: its full text, so a page with visible text never comes out "") and
    "pruned:container" (the text is the article container's, CONTAINER_TIERS: over whichever
    of those won, or equal to it). second_opinion=False turns off the second opinion and the container."""
    from resiliparse.parse.html import HTMLTree

    tree = HTMLTree.parse(mark_links(keep_content_lists(html)))
    if too_deep_for_main_content(tree):  # the depth guard holds for the pruned pass too
        return _resiliparse_text(tree, False, [*selectors, *ALWAYS_SKIP]), "pruned:too_deep"
    text, path = _pruned_tree(tree, len(html), selectors, second_opinion)
    if len(text) < MIN_PRUNED_CHARS and _NOSCRIPT_OPEN.search(html) and _noscript_holds_the_page(tree):
        # Parsed again with <noscript> as <div>: the page's content is inside it (see NOSCRIPT_GAIN).
        opened = HTMLTree.parse(mark_links(keep_content_lists(_NOSCRIPT_OPEN.sub(r"<\1div", html))))
        if not too_deep_for_main_content(opened):
            other, _ = _pruned_tree(opened, len(html), selectors, second_opinion)
            if len(other.strip()) > len(text.strip()):
                text, path = other, "pruned:noscript"
    return drop_trailing_labels(text), path


def _pruned_tree(tree, html_chars: int, selectors: Sequence[str], second_opinion: bool) -> tuple[str, str]:
    """`pruned_text` on a parsed tree that passed the depth guard (changed in place: lists)."""
    skip, always = [*selectors, *ALWAYS_SKIP], ALWAYS_SKIP
    lead_paragraphs_out_of_header(tree)
    container = visible = None
    if second_opinion:
        container = _container_text(tree, skip)
        if container is not None and len(container) >= CONTAINER_SURE_SHARE * html_chars:
            visible = _resiliparse_text(tree, False, always)
            if _container_decided(container, visible):
                return container, "pruned:container"
    text, path = _resiliparse_text(tree, True, skip, links=True), "pruned"
    if len(text) < MIN_PRUNED_CHARS and selectors:
        unpruned = _resiliparse_text(tree, True, always, links=True)
        if len(unpruned) > len(text):
            text, path = unpruned, "pruned:unpruned"
    if not second_opinion:
        return text, path
    text, path = _second_opinion(tree, text, path, always, visible)
    if container is not None and (container == text or _prefer_container(text, container, tree)):
        return container, "pruned:container"
    return text, path


# `<noscript>`: its content is no visible text (a browser with scripts shows the script's work
# instead), so every pass skips it, but some pages put all their content in one — a blog's posts
# for crawlers, or an unclosed `<noscript>` near the top that the parser extends to the end of
# the page. When the text came out short (MIN_PRUNED_CHARS) and the page's text with noscript
# content is over NOSCRIPT_GAIN times its text without, the page is extracted again with its
# `<noscript>` elements read as `<div>` (path "pruned:noscript"; rare, so the second parse costs
# nothing on other pages).
NOSCRIPT_GAIN = 3.0
_NOSCRIPT_OPEN = re.compile(r"<(/?)noscript\b", re.I)


def _noscript_holds_the_page(tree) -> bool:
    """Whether the page's text is mostly inside `<noscript>` elements (NOSCRIPT_GAIN)."""
    without = len(_resiliparse_text(tree, False, ALWAYS_SKIP).strip())
    with_noscript = len(_resiliparse_text(tree, False, ALWAYS_SKIP, noscript=True).strip())
    return with_noscript > NOSCRIPT_GAIN * max(without, 1)


# A lead paragraph inside the article's `<header>` (the standfirst under the headline) is
# article text, but the shipped selectors skip `header` whole (it holds the headline, byline and
# date). Paragraphs of at least LEAD_MIN_CHARS there are moved to just after the header, out of
# the skipped element; bylines and dates are shorter. One C query; most pages match nothing.
LEAD_MIN_CHARS = 80
_LEAD_IN_HEADER = "article header p"


def lead_paragraphs_out_of_header(tree) -> int:
    """Move the long `<p>` of an `<article>`'s `<header>` after that header, in place; returns
    how many moved."""
    doc = tree.document
    if doc is None:
        return 0
    moved = 0
    anchors: dict = {}  # header -> its next sibling before any move (resiliparse has no insert_after)
    for p in doc.query_selector_all(_LEAD_IN_HEADER):
        if len(p.text.strip()) < LEAD_MIN_CHARS:
            continue
        header = p.parent
        while header is not None and header.tag != "header":
            header = header.parent
        if header is None or header.parent is None:
            continue
        anchor = anchors.setdefault(header, header.next_sibling)
        p.parent.remove_child(p)
        if anchor is None:
            header.parent.append_child(p)
        else:
            header.parent.insert_before(p, anchor)
        moved += 1
    return moved


# A container of over CONTAINER_SURE_SHARE of the page's HTML characters is tried against the
# page's visible text before the main content is extracted (`_container_decided`). A cost gate
# only, never a change of text: below it the visible text rarely decides (and would be an extra
# pass), above it it decided on 17-63 of 22-71 such pages per development benchmark, each
# sparing the main-content pass (~1.2-2.3 ms).
CONTAINER_SURE_SHARE = 0.05


def _container_decided(container: str, visible: str) -> bool:
    """Whether the container is taken whatever the main content is: `_prefer_container` takes
    any container with CONTAINER_INSIDE * |container| >= CONTAINER_SHARE * |main| words, and
    the main content (or the second opinion) is part of the visible text, so never has more
    words than it (checked: none of the 1,912 development pages had)."""
    return CONTAINER_INSIDE * len(container.split()) >= CONTAINER_SHARE * len(visible.split())


def _second_opinion(
    tree, text: str, path: str, always: Sequence[str], visible: str | None = None
) -> tuple[str, str]:
    """The main content, or the page's text less furniture where the main content has low
    confidence (LOW_CONFIDENCE_CHARS, LIST_SHARE). `visible`: the page's text if already
    extracted."""
    if len(text) < LOW_CONFIDENCE_CHARS:
        if visible is None:
            visible = _resiliparse_text(tree, False, always)
        if len(text) < LOW_CONFIDENCE_RATIO * len(visible) or (not text.strip() and visible.strip()):
            other = _page_text(tree, always)
            if len(other.strip()) > SECOND_OPINION_GAIN * len(text.strip()):
                return other, "pruned:second_opinion"
            if not text.strip():
                return visible, "pruned:full_page"
    elif _list_share(text) > LIST_SHARE:
        other = _page_text(tree, always)
        if len(other.strip()) > LIST_KEEP * len(text.strip()):
            return other, "pruned:second_opinion"
    return text, path


def _pruned(html: str, main_content: bool) -> tuple[str, str]:
    if not main_content:  # pruning is part of main-content extraction
        return _resiliparse(html, False)
    return pruned_text(html, load_selectors())


def _pruned_headlines(html: str, main_content: bool) -> tuple[str, str]:
    if not main_content:
        return _resiliparse(html, False)
    return pruned_text(html, load_selectors(keep_headlines=True))


def _import_failure(exc: ImportError) -> str:
    """What is actually missing: trafilatura itself, or a module it imports (lxml's html cleaner
    moved to the separate `lxml_html_clean` package in lxml 5.2, and trafilatura then fails with
    an ImportError naming it)."""
    missing = getattr(exc, "name", None)
    if missing and missing != "trafilatura":
        return f"it needs the module {missing!r}, which is missing ({exc})"
    if missing == "trafilatura":
        return "trafilatura is not installed"
    return str(exc)


def _trafilatura(html: str, main_content: bool) -> tuple[str, str]:
    try:
        import trafilatura
    except ImportError as exc:
        raise ConfigError(
            f"extractor 'trafilatura' cannot be imported: {_import_failure(exc)}",
            "pip install 'oreline[extract]' (it installs trafilatura with lxml_html_clean) "
            "or set data.extract.extractor=resiliparse",
        ) from exc
    if main_content:
        return trafilatura.extract(html, include_comments=False, include_tables=True) or "", "trafilatura"
    return trafilatura.html2txt(html) or "", "trafilatura:full_page"


def _html2text(html: str, main_content: bool) -> tuple[str, str]:
    try:
        import html2text
    except ImportError as exc:
        raise ConfigError(
            "extractor 'html2text' is not installed",
            "pip install 'oreline[extract]' or set data.extract.extractor=resiliparse",
        ) from exc
    parser = html2text.HTML2Text()
    parser.body_width = 0
    parser.ignore_links = True
    parser.ignore_images = True
    parser.ignore_emphasis = True
    return parser.handle(_DROP_FOR_HTML2TEXT.sub(" ", html)), "html2text"


# Each returns (text, path): which way the page went ("pruned", "pruned:too_deep", …), counted
# per page in the data funnel (stats.json "extract_paths").
EXTRACTORS: dict[str, Callable[[str, bool], tuple[str, str]]] = {
    "pruned": _pruned,
    "default": _pruned,
    "pruned_headlines": _pruned_headlines,
    "resiliparse": _resiliparse,
    "trafilatura": _trafilatura,
    "html2text": _html2text,
}


def extract(
    html: str, extractor: str = "default", main_content: bool = True, timeout_s: float | None = None
) -> tuple[str, str]:
    """(plain text, path) of an HTML page; raises ExtractTimeout past timeout_s (None: no limit)."""
    try:
        fn = EXTRACTORS[extractor]
    except KeyError:
        raise ConfigError(f"unknown extractor {extractor!r}", f"use one of {sorted(EXTRACTORS)}") from None
    if not html:
        return "", "empty"
    with time_limit(timeout_s):
        return fn(html, main_content)


def html_to_text(
    html: str, extractor: str = "default", main_content: bool = True, timeout_s: float | None = None
) -> str:
    """Plain text of an HTML page; raises ExtractTimeout past timeout_s (None: no limit)."""
    return extract(html, extractor, main_content, timeout_s)[0]
