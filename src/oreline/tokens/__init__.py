"""oreline.tokens"""
