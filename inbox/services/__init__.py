"""Writes of the inbox: recording, handler_runs, offsets, retries, repairs, retention."""
