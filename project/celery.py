import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings.local")

app = Celery("project")
# Every CELERY_* setting in project/settings/celery.py configures this app.
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
