from rest_framework.pagination import CursorPagination


class ConsoleCursorPagination(CursorPagination):
    """Cursor pagination: constant cost per page however deep, and stable while rows arrive.

    Views set `ordering` to an indexed column; no COUNT(*) is ever run.
    """

    page_size_query_param = "page_size"
    max_page_size = 500
