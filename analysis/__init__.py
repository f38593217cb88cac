"""memsweep analysis: run records -> Parquet tables (runs, phases, frontier) and reports.

Reads JSON files only and never imports torch.
"""
