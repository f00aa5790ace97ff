"""The web application as gunicorn (project.wsgi) and an ASGI server (project.asgi) load it."""

import subprocess
import sys

import pytest
from django.conf import settings

FROZEN_OBJECTS = "import gc, {module}; print(gc.get_freeze_count())"


@pytest.mark.parametrize("module", ["project.wsgi", "project.asgi"])
def test_the_objects_loaded_at_start_are_out_of_the_garbage_collectors_reach(module):
    # A full collection walks every object the collector tracks; Django's start-up leaves about
    # 150,000, and a walk over them took about 90 ms, in the middle of a request.
    process = subprocess.run(
        [sys.executable, "-c", FROZEN_OBJECTS.format(module=module)],
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert int(process.stdout.split()[-1]) > 10_000
