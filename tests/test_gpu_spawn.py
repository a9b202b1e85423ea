"""gpu/spawn.py's rendezvous port: free, and outside the range the kernel hands out to other sockets."""

import random
import socket

from gpu import spawn


def test_the_port_is_below_the_ephemeral_range_and_bindable():
    low = int(spawn.EPHEMERAL_RANGE.read_text().split()[0]) if spawn.EPHEMERAL_RANGE.is_file() else 32768
    for _ in range(20):
        port = spawn.free_port()
        assert port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_another_socket_holds_is_passed_over():
    seed = random.randrange(2 ** 32)
    first = spawn.free_port(random.Random(seed))
    with socket.socket() as held:
        held.bind(("127.0.0.1", first))
        held.listen()
        assert spawn.free_port(random.Random(seed)) != first
