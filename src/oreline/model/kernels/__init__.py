"""Fused and CPU-specific paths of the Llama layers, each tested equal to oreline.model.llama's reference."""
