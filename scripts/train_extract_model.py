"""Choose the default extractor's boilerplate selectors on the extraction benchmark's dev half.

    .venv/bin/python scripts/train_extract_model.py [--out PATH]

Greedy forward selection (`oreline.data.filters.boilerplate.fit_selectors`) over all 91 dev
pages; writes src/oreline/data/filters/boilerplate_selectors.json, which ships in the package
and whose sha256 is part of the data fingerprint. The held-out half of the benchmark is never
read. The F1 written here is in-sample; `benchmarks/extraction_quality.py` reports the
cross-validated one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from extraction_quality import load_pages  # noqa: E402
from oreline.data.filters.boilerplate import SELECTORS_PATH, fit_selectors  # noqa: E402
from oreline.data.filters.extract import pruned_text  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=SELECTORS_PATH)
    args = ap.parse_args()
    pages = [(html, truth) for _, html, truth in load_pages(None)]
    t0 = time.perf_counter()
    chosen, f1 = fit_selectors(pages, lambda html, selector: pruned_text(html, selector)[0])
    model = {
        "selectors": chosen,
        "trained_on": "article-extraction-dev (scrapinghub/article-extraction-benchmark, even ids, 91 pages)",
        "method": "greedy forward selection on micro token F1, min_gain 0.0005 (boilerplate.fit_selectors)",
        "in_sample_f1": round(f1, 4),
    }
    args.out.write_text(json.dumps(model, indent=2) + "\n", encoding="utf-8")
    print(f"{len(chosen)} selectors, in-sample F1 {f1:.4f}, {time.perf_counter() - t0:.0f} s -> {args.out}")
    for s in chosen:
        print(f"  {s}")


if __name__ == "__main__":
    main()
