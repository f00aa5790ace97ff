"""Users and ACLs of Kafka's secured listener (scripts/services.sh): SASL_SSL with a
certificate of the project's own CA, SCRAM-SHA-512 users, and KRaft's StandardAuthorizer, which
lets a user do only what its ACLs allow. They are made through an admin client of the PLAINTEXT
listener, whose clients (User:ANONYMOUS) are a super user. The tests use it on the developers'
broker, the scenarios on their isolated cluster."""

import os
import time
import uuid
from pathlib import Path

from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from django.conf import settings

SCRAM_ITERATIONS = 4096
TIMEOUT_SECONDS = 30

# What a producer needs on a topic (DESCRIBE_CONFIGS: the relay reads its size limit), and
# what a consumer needs on a topic (and READ on its group).
WRITER = (AclOperation.WRITE, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS)
READER = (AclOperation.READ, AclOperation.DESCRIBE)


def tls_ca(local_dir: Path) -> Path:
    """The CA that signed the brokers' certificate of the services under `local_dir`."""
    return local_dir / "kafka" / "tls" / "ca.pem"


def allowed(
    user: str,
    resource: ResourceType,
    name: str,
    operation: AclOperation,
    *,
    prefixed: bool = False,
) -> AclBinding:
    """The ACL that allows `user` one operation on a resource, from any host."""
    pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
    return AclBinding(
        resource, name, pattern, f"User:{user}", "*", operation, AclPermissionType.ALLOW
    )


def _matching(binding: AclBinding) -> AclBindingFilter:
    """The filter that matches exactly this ACL."""
    return AclBindingFilter(
        binding.restype,
        binding.name,
        binding.resource_pattern_type,
        binding.principal,
        binding.host,
        binding.operation,
        binding.permission_type,
    )


def development_secured_kafka(admin: AdminClient) -> "SecuredKafka":
    """The secured listener of the broker `scripts/services.sh up` starts for development and
    the tests: KAFKA_SECURE_PORT_BASE + 1, its CA under LOCAL_DIR (both as services.sh reads
    them)."""
    local = Path(os.environ.get("LOCAL_DIR", Path(settings.BASE_DIR) / ".local"))
    port = int(os.environ.get("KAFKA_SECURE_PORT_BASE", "9191")) + 1
    return SecuredKafka(admin, bootstrap=f"127.0.0.1:{port}", ca=tls_ca(local))


class SecuredKafka:
    """Users of the secured listener at `bootstrap`; every ACL made through it is remembered
    until remove_acls()."""

    def __init__(self, admin: AdminClient, *, bootstrap: str, ca: Path) -> None:
        self.admin = admin
        self.bootstrap = bootstrap
        self.ca = ca
        self.passwords: dict[str, str] = {}
        self.acls: list[AclBinding] = []

    def user(self, name: str) -> str:
        """Creates (or sets the password of) SCRAM user `name`; returns the name."""
        password = uuid.uuid4().hex
        futures = self.admin.alter_user_scram_credentials(
            [
                UserScramCredentialUpsertion(
                    name,
                    ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS),
                    password.encode(),
                )
            ]
        )
        for future in futures.values():
            future.result(timeout=TIMEOUT_SECONDS)
        self.passwords[name] = password
        return name

    def allow(
        self,
        user: str,
        resource: ResourceType,
        name: str,
        *operations: AclOperation,
        prefixed: bool = False,
    ) -> list[AclBinding]:
        """ALLOW ACLs of `user` for `operations` on a resource; returns them."""
        bindings = [
            allowed(user, resource, name, operation, prefixed=prefixed) for operation in operations
        ]
        self.grant(bindings)
        return bindings

    def grant(self, bindings: list[AclBinding]) -> None:
        for future in self.admin.create_acls(bindings).values():
            future.result(timeout=TIMEOUT_SECONDS)
        self.acls.extend(bindings)

    def revoke(self, bindings: list[AclBinding]) -> int:
        """Deletes ACLs; returns how many the cluster deleted."""
        filters = [_matching(binding) for binding in bindings]
        deleted = sum(
            len(future.result(timeout=TIMEOUT_SECONDS))
            for future in self.admin.delete_acls(filters).values()
        )
        self.acls = [b for b in self.acls if b not in bindings]
        return deleted

    def granted(self, binding: AclBinding, *, wait: float = 10.0, expected: bool = True) -> bool:
        """Whether the cluster holds this ACL, asked until the answer is `expected` or for
        `wait` seconds: each broker applies a change of ACLs from the metadata log on its own
        time, and the one asked may not have it yet."""
        deadline = time.monotonic() + wait
        while True:
            held = self._holds(binding)
            if held == expected or time.monotonic() > deadline:
                return held
            time.sleep(0.2)

    def _holds(self, binding: AclBinding) -> bool:
        found = self.admin.describe_acls(_matching(binding)).result(timeout=TIMEOUT_SECONDS)
        return bool(found)

    def client_config(self, user: str) -> dict[str, str]:
        """What a project puts in KAFKA_EVENTS["CLIENT_CONFIG"] for this listener and user."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": user,
            "sasl.password": self.passwords[user],
            "ssl.ca.location": str(self.ca),
        }

    def client_environment(self, user: str) -> dict[str, str]:
        """The same as a process's environment (project/settings/kafka.py reads it)."""
        config = ",".join(f"{key}={value}" for key, value in self.client_config(user).items())
        return {"KAFKA_BOOTSTRAP_SERVERS": self.bootstrap, "KAFKA_CLIENT_CONFIG": config}

    def remove_acls(self) -> None:
        if self.acls:
            self.revoke(list(self.acls))
