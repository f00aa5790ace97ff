"""How the console reads a failure's class from its error text, shared by the indexes of the
outbox and the inbox that find the rows of one class and the filters that use them."""

from django.db.models import CharField, F, Func, Value


def error_class_of(field: str) -> Func:
    """The class of the error text in `field`: the text before ':' on its first line
    ("MSG_SIZE_TOO_LARGE: ...", "ValueError: ..."); an empty text is its own class. The same
    reading as console.selectors.ERROR_CLASS_OF_SQL, as a Django expression: an index on it
    serves a filter that compares it, written the same way."""
    first_line = Func(F(field), Value("\n"), Value(1), function="split_part")
    return Func(first_line, Value(":"), Value(1), function="split_part", output_field=CharField())
