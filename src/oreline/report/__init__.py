"""oreline.report"""
