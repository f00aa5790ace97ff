"""The isolated services' port blocks, as numbers: no service needed."""

from pathlib import Path

from scenarios import ports

# The developers' own services (scripts/services.sh defaults): PostgreSQL, Redis, Zipkin,
# the brokers 9092-9094 and their controllers 29092-29094.
# PostgreSQL and its standby, the two poolers, Redis, Zipkin, the brokers' two listeners and
# their controllers.
DEVELOPERS_PORTS = {
    5432,
    5435,
    6432,
    6433,
    6379,
    9411,
    *range(9092, 9095),
    *range(9192, 9195),
    *range(29092, 29095),
}


def ephemeral_range() -> range:
    """The local ports the kernel hands to outgoing connections on this machine."""
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return range(int(low), int(high) + 1)


def every_port() -> list[int]:
    return [port for number in range(ports.PORT_BLOCKS) for port in ports.PortBlock(number).ports()]


def test_no_block_port_can_be_taken_by_an_outgoing_connection():
    """A port inside the ephemeral range can be the local end of a client's connection at the
    moment a service binds it: PostgreSQL then fails with 'Address already in use' although
    nothing listens on the port (a CI run failed so)."""
    ephemeral = ephemeral_range()
    inside = [port for port in every_port() if port in ephemeral]
    assert inside == [], f"ports in the ephemeral range {ephemeral.start}-{ephemeral.stop - 1}"


def test_blocks_share_no_port_with_each_other_nor_with_the_developers_services():
    all_ports = every_port()
    # PostgreSQL, its two poolers, its standby, Redis, and per broker two client ports
    # (PLAINTEXT, SASL_SSL) and a controller port.
    assert len(all_ports) == len(set(all_ports)) == ports.PORT_BLOCKS * (5 + 3 * ports.BROKERS)
    assert not set(all_ports) & DEVELOPERS_PORTS
