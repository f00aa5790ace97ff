"""Inbox knobs: consumers, retries and retention."""
