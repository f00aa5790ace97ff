"""Moves the API tokens of Django REST framework's authtoken table, stored in plain text, to
console_api_token as SHA-512 digests (the tokens keep working until they expire, API_TOKEN_TTL_DAYS
from now), then empties the plain-text table."""

from django.conf import settings
from django.db import migrations, transaction
from django.utils import timezone
from knox.crypto import hash_token
from knox.settings import CONSTANTS

PLAIN_TOKEN_TABLE = "authtoken_token"  # noqa: S105 (a table name)


def hash_plain_api_tokens(apps, schema_editor):
    connection = schema_editor.connection
    if PLAIN_TOKEN_TABLE not in connection.introspection.table_names():
        return
    api_token = apps.get_model("console", "ApiToken")
    # The plain manager: the model's own (knox's) would make a new token instead.
    tokens = api_token._base_manager
    expiry = timezone.now() + settings.REST_KNOX["TOKEN_TTL"]
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        # A server of the previous version may still write tokens: none is added between the
        # read and the DELETE, so every token deleted was moved.
        cursor.execute("LOCK TABLE authtoken_token IN SHARE ROW EXCLUSIVE MODE")
        cursor.execute("SELECT key, user_id, created FROM authtoken_token")
        plain_tokens = cursor.fetchall()
        for key, user_id, created in plain_tokens:
            token = tokens.create(
                digest=hash_token(key),
                token_key=key[: CONSTANTS.TOKEN_KEY_LENGTH],
                user_id=user_id,
                expiry=expiry,
                name="Moved from the plain-text token table",
                actions=["*"],
            )
            # auto_now_add set the time of the move; the token is as old as it was.
            tokens.filter(pk=token.pk).update(created=created)
        cursor.execute("DELETE FROM authtoken_token")
    if plain_tokens:
        print(
            f"\n  {len(plain_tokens)} API token(s) moved to hashed storage; they expire on"
            f" {expiry:%Y-%m-%d}. The table {PLAIN_TOKEN_TABLE} is empty now."
        )


class Migration(migrations.Migration):
    dependencies = [("console", "0003_security")]

    operations = [migrations.RunPython(hash_plain_api_tokens, migrations.RunPython.noop)]
