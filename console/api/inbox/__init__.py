"""REST API of the inbox: /api/inbox/messages/."""
