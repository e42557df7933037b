"""The read-only tools behind status.py and logs.py (they sit above the steps: they read what the steps make)."""
