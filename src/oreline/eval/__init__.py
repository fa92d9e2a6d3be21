"""oreline.eval"""
