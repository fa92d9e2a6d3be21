"""oreline.doctor"""
