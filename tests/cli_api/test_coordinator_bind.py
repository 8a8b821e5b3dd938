"""Where process 0's coordination service listens: the coordinator address itself (loopback for a
localhost run), never every interface unless --coordinator_bind asks; and the one-line errors of the
address checks. The service is read from the kernel's socket table while process 0 waits for a peer
that never comes, then that process group is killed."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from ebrl import distributed
from ebrl.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CHILD = """
import sys
from ebrl import distributed
distributed.initialize(distributed.ProcessIdentity(sys.argv[1], 2, 0, connect_timeout_s=60,
                                                   coordinator_bind=sys.argv[2] or None))
"""


def _listening(port: int) -> set[ipaddress._BaseAddress]:
  """The local addresses of TCP sockets listening on `port` (state 0A in /proc/net/tcp{,6})."""
  found = set()
  for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
    if not os.path.exists(table):
      continue
    with open(table) as f:
      for line in f.readlines()[1:]:
        fields = line.split()
        host, hex_port = fields[1].split(":")
        if fields[3] != "0A" or int(hex_port, 16) != port:
          continue
        raw = bytes.fromhex(host)  # 32-bit words in host (little-endian) order.
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
        address = ipaddress.ip_address(socket.inet_ntop(family, raw))
        found.add(getattr(address, "ipv4_mapped", None) or address)  # ::ffff:127.0.0.1 is 127.0.0.1.
  return found


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux's socket table")
@pytest.mark.parametrize("bind", ["", "[::]"])
def test_the_coordinator_listens_where_it_is_told_and_on_loopback_by_default(bind):
  port = distributed.free_port()
  child = subprocess.Popen([sys.executable, "-c", _CHILD, f"localhost:{port}", f"{bind}:{port}" if bind else ""],
                           cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  try:
    deadline = time.monotonic() + 60
    while not (addresses := _listening(port)):
      assert child.poll() is None, child.stderr.read().decode()[-2000:]
      assert time.monotonic() < deadline, "process 0's coordinator never listened"
      time.sleep(0.2)
  finally:
    os.killpg(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    child.stderr.close()
  if bind:  # Asked for every interface: the flag reaches JAX.
    assert any(a.is_unspecified for a in addresses), addresses
  else:
    assert addresses and all(a.is_loopback for a in addresses), addresses


def test_bad_bind_addresses_are_one_line():
  identity = distributed.ProcessIdentity("localhost:1234", 2, 0, coordinator_bind="everywhere")
  with pytest.raises(UserError, match=r"^--coordinator_bind='everywhere' is not host:port .*\[::\]:12345 for every "
                                      r"interface \(anyone who can reach it can join the run\)$"):
    distributed.check(identity)
  with pytest.raises(UserError, match=r"^--coordinator_bind='\[::\]' is not host:port"):  # Also without the flags
    distributed.check(distributed.ProcessIdentity(coordinator_bind="[::]"))  # (a detected cluster's run).
  with socket.socket() as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    with pytest.raises(UserError, match=rf"^process 0 runs the coordinator at 127.0.0.1:{port}, but this host "
                                        r"cannot listen there \(address already in use\)"):
      distributed._check_can_listen(f"127.0.0.1:{port}")  # pylint: disable=protected-access
  # An address of another host (TEST-NET-1, never assigned): one line, where JAX would abort.
  with pytest.raises(UserError, match=r"cannot listen there \(cannot assign requested address\)"):
    distributed._check_can_listen(f"192.0.2.1:{distributed.free_port()}")  # pylint: disable=protected-access
