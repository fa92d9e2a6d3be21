"""oreline: raw web crawl to a trained, evaluated, exported language model."""

__version__ = "0.1.0"
