"""Processes forked by a warm server instead of started fresh: the launcher side's protocol (`client.py`), below every
part that launches ranks or child processes (engine, fixtures, hooks). Pure Python, no heavy library."""
