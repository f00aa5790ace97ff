"""A project that mounts the console's admin pages and not its API."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
