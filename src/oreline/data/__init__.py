"""oreline.data"""
