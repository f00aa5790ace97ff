"""Display formats of the console (FORMAT_MODULE_PATH): the subject is milliseconds of lag,
so times show to the microsecond, in UTC, in an order that sorts."""
