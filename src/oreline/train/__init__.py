"""oreline.train"""
