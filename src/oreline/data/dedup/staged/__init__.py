"""The dedup plan as stages of jobs over partitioned files (plan.py runs them; see its docstring)."""
