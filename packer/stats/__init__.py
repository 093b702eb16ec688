"""Padding-waste figures from lengths (figures.py) and their tables, JSON, PNG and HTML (report.py)."""
