# Django's date format characters: https://docs.djangoproject.com/en/5.2/ref/templates/builtins/#date
DATETIME_FORMAT = "Y-m-d H:i:s.u T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s.u T"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s.u"
