"""console.api.permissions.ConsolePermission fails closed: an action a view names no
permissions for is refused, even to a superuser."""

from django.contrib.auth.models import User
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory, force_authenticate
from rest_framework.views import APIView


class ReadableOnlyView(APIView):
    required_permissions: dict[str, list[str]] = {"GET": []}

    def get(self, request):
        return Response({"read": True})

    def post(self, request):
        return Response({"changed": True})


def test_an_action_without_an_entry_is_refused(db):
    superuser = User.objects.create_superuser("root", password="a-long-enough-password")
    factory = APIRequestFactory()
    view = ReadableOnlyView.as_view()
    reading = factory.get("/x/")
    force_authenticate(reading, user=superuser)
    assert view(reading).status_code == 200
    changing = factory.post("/x/")
    force_authenticate(changing, user=superuser)
    assert view(changing).status_code == 403
    # A method the view has no handler for still gets 405, not 403.
    deleting = factory.delete("/x/")
    force_authenticate(deleting, user=superuser)
    assert view(deleting).status_code == 405
