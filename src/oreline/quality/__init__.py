"""oreline.quality: reference language models for perplexity filtering, trained with the rest of oreline."""
