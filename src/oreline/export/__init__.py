"""oreline.export"""
