"""Pieces every API of the console shares: errors, pagination, permissions, filtering."""
