"""oreline.model"""
