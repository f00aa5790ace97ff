"""REST API of the analytics results: /api/analytics/."""
